"""One generation, token by token, and what it returns.

``Generation`` samples each next token from the logits it is given, applies stop tokens, stop
strings and the grammar of a constrained request, and holds back text that might be the start
of a stop string.  ``Session.generate`` and the server's scheduler both drive one, so they
give the same tokens and text.  ``GenerationResult`` (with its ``Timings``) is what a
generation returns; a stream gives text pieces first (``Piece`` when they carry logprobs).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from goinfer import logprobs as _lp
from goinfer.sampling import Sampler, SamplingParams
from goinfer.tokenizer import StreamDecoder

__all__ = ["Timings", "GenerationResult", "Generation", "Piece", "constraint_of", "stop_list"]

# ============================================================================ results


@dataclass
class Timings:
    prefill_ms: float = 0.0
    prefill_tok_s: float = 0.0  # prefilled (not cached) prompt tokens per second
    decode_ms: float = 0.0
    decode_tok_s: float = 0.0  # decode steps per second
    prefill_tokens: int = 0
    decode_tokens: int = 0
    draft_tokens: int = 0  # tokens proposed by speculative drafting (draft=...)
    draft_accepted: int = 0  # of those, tokens the sampler drew too (emitted without a step)

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class GenerationResult:
    text: str
    tokens: list[int]
    finish_reason: str  # "stop" | "length"
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    timings: Timings = field(default_factory=Timings)
    # {"content": [{token, logprob, bytes, top_logprobs}]} when asked for (OpenAI's shape)
    logprobs: dict | None = None
    # with a grammar or response_format: "grammar complete", "grammar dead end: ...", ...
    reason: str | None = None
    # chat with tools: the reply's text without its calls, and the calls (OpenAI's shape);
    # finish_reason is then "tool_calls" when the reply made calls.  Otherwise content == text.
    content: str | None = None
    tool_calls: list[dict] | None = None
    # chat with a reasoning model (goinfer/chat/channels.py): its thinking, apart from content
    reasoning_content: str | None = None
    # the stop string that ended the text (None: a stop token, max_tokens, a grammar, ...)
    stop_sequence: str | None = None

    def __post_init__(self) -> None:
        if self.content is None and self.tool_calls is None:
            self.content = self.text

    def __str__(self) -> str:
        return self.text

    def message(self) -> dict:
        """The reply as an assistant message, to append to the conversation."""
        m: dict = {"role": "assistant", "content": self.content}
        if self.reasoning_content is not None:
            m["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            m["tool_calls"] = self.tool_calls
        return m


# ============================================================================ one generation


class Generation:
    """The token-by-token side of one generation: sampling, stop tokens, stop strings and the
    streaming holdback (text that might be the start of a stop string is held back).

    Feed it the logits after the prompt, then after each of its tokens, with ``push`` (which
    returns the text that may be shown now) until ``done``; then ``finish`` returns the rest.
    ``Session.generate`` and the server's scheduler both drive one of these, so they give the
    same tokens and text."""

    def __init__(
        self,
        model,
        ids: list[int],
        max_tokens: int,
        params: SamplingParams,
        stops: list[str],
        *,
        grammar=None,
        logprobs: tuple[bool, int] = (False, 0),
    ):
        tok = model.tokenizer
        self.tokenizer = tok
        self.reason: str | None = None
        self.want_logprobs, self.top_logprobs = logprobs
        self.logprobs: list[dict] = []  # one entry per generated token (stop token excluded)
        self._spans: list[tuple[int, int]] = []  # text (start, end) of each token
        self._lp_sent = 0  # entries handed out with pieces
        self._finished = False  # finish() ran
        self.sampler = Sampler(params, model.vocab_size, history=list(ids))
        self.stop_ids = set(tok.stop_ids)
        self.stops = stops
        self.max_tokens = max_tokens
        self.decoder = StreamDecoder(tok)
        self.tokens: list[int] = []  # generated, stop token excluded
        self.text = ""  # decoded so far (cut at a stop string)
        self.emitted = 0  # characters of text already returned
        self.finish_reason = "length"
        self.hold = max((len(x) for x in stops), default=1) - 1  # a stop string may be forming
        self.n_steps = 0  # logits pushed
        self.drafted = 0  # speculative draft tokens proposed / accepted (goinfer/speculative.py)
        self.accepted = 0
        self.done = max_tokens <= 0
        self._cut_by_string = False
        self.stop_sequence: str | None = None  # the stop string that cut the text
        # a compiled constrained.Grammar -> this generation's Constraint (first mask starts now)
        self.constraint = None if grammar is None else grammar.start(model.vocab_size)

    def push(self, logits: np.ndarray) -> str:
        """Sample the next token from logits (vocab,) -> the text that may be shown now."""
        if self.done:
            raise RuntimeError("push() after the generation is done")
        self.n_steps += 1
        c = self.constraint
        mask = None
        if c is not None:
            mask = c.mask()  # computed while the forward pass ran
            if mask is None:  # dead end: stop, and say so
                self.finish_reason, self.done, self.reason = "stop", True, c.reason
                return ""
        z = logits  # logprobs are of the raw logits; the sampler may see the end folded in
        if c is not None:
            z, mask = c.fold_end(logits, mask, self.tokens, self.text)
        t = self.sampler.sample(z, mask)
        if t < 0:  # logit_bias -inf on every token left: nothing can be drawn
            self.finish_reason, self.done = "stop", True
            self.reason = (
                "grammar dead end: logit_bias bans every token the grammar allows"
                if c is not None
                else "logit_bias bans every token"
            )
            return ""
        if t in self.stop_ids and (c is None or c.ends(t)):
            self.finish_reason, self.done = "stop", True
            if c is not None:
                self.reason = c.reason
            return ""
        state = "more" if c is None else c.advance(t)
        if c is not None and state == "rejected":  # not a valid continuation: a dead end
            self.finish_reason, self.done, self.reason = "stop", True, c.reason
            return ""
        if self.want_logprobs:
            self.logprobs.append(_lp.entry(self.tokenizer, logits, t, self.top_logprobs))
        self.sampler.accept(t)
        self.tokens.append(t)
        start = len(self.text)
        self.text += self.decoder.push(t)
        self._spans.append((start, len(self.text)))
        cut = find_stop(self.text, self.stops, self.emitted)
        if cut is not None:
            self._cut(cut)
            self.done = True
            if c is not None:
                self.reason = "stop string (the output may not complete the grammar)"
            return ""
        if c is not None and state == "end":
            self.finish_reason, self.done, self.reason = "stop", True, c.reason
        if len(self.tokens) >= self.max_tokens:
            self.done = True
        if c is not None and not self.done:
            c.prefetch()  # the next mask, while the caller runs the next forward pass
        if len(self.text) - self.hold > self.emitted:
            piece = self.text[self.emitted : len(self.text) - self.hold]
            self.emitted = len(self.text) - self.hold
            return piece
        return ""

    def finish(self) -> str:
        """Flush an unfinished UTF-8 character, apply the stops once more -> the remaining text."""
        if not self._cut_by_string:
            self.text += self.decoder.flush()
            cut = find_stop(self.text, self.stops, self.emitted)
            if cut is not None:
                self._cut(cut)
        if self._cut_by_string and self.want_logprobs:
            # tokens wholly inside the cut stop string are not part of the output
            cut = len(self.text)
            keep = [
                i for i in range(len(self.logprobs)) if i < self._lp_sent or self._spans[i][0] < cut
            ]
            self.logprobs = [self.logprobs[i] for i in keep]
        piece = self.text[self.emitted :]
        self.emitted = len(self.text)
        self.done = self._finished = True
        self.close()
        return piece

    def _cut(self, cut: int) -> None:
        """End the text where a stop string begins (at text[cut])."""
        self.stop_sequence = next(x for x in self.stops if self.text.startswith(x, cut))
        self.text, self.finish_reason = self.text[:cut], "stop"
        self._cut_by_string = True

    def close(self) -> None:
        """Let go of the grammar's worker (a mask may still be computing after a cancel)."""
        if self.constraint is not None:
            self.constraint.close()

    # ------------------------------------------------------------------ logprobs while streaming

    def take_logprobs(self) -> list[dict]:
        """Entries of the tokens whose text has been handed out (by push/finish) and that were
        not taken yet: a stream sends each piece with these."""
        if not self.want_logprobs:
            return []
        n = len(self.logprobs) if self._finished else self._lp_sent
        if not self._finished:
            while n < len(self.logprobs) and self._spans[n][1] <= self.emitted:
                n += 1
        out = self.logprobs[self._lp_sent : n]
        self._lp_sent = n
        return out

    def has_logprobs(self) -> bool:
        """Would take_logprobs() return anything?"""
        if not self.want_logprobs or self._lp_sent >= len(self.logprobs):
            return False
        return self._finished or self._spans[self._lp_sent][1] <= self.emitted

    def piece(self, text: str):
        """text as a stream item: plain str, or a Piece with the logprobs of its tokens."""
        return Piece(text, self.take_logprobs()) if self.want_logprobs else text

    def result(
        self, cached: int, prefilled: int, t0: float, t1: float, t2: float
    ) -> GenerationResult:
        """The GenerationResult, timed from t0 (start) to t1 (prompt done) to t2 (end)."""
        n_decode = max(0, self.n_steps - 1)
        timings = Timings(
            prefill_ms=(t1 - t0) * 1e3,
            prefill_tok_s=prefilled / (t1 - t0) if t1 > t0 else 0.0,
            decode_ms=(t2 - t1) * 1e3,
            decode_tok_s=n_decode / (t2 - t1) if t2 > t1 and n_decode else 0.0,
            prefill_tokens=prefilled,
            decode_tokens=n_decode,
            draft_tokens=self.drafted,
            draft_accepted=self.accepted,
        )
        return GenerationResult(
            text=self.text,
            tokens=list(self.tokens),
            finish_reason=self.finish_reason,
            prompt_tokens=cached + prefilled,
            cached_tokens=cached,
            completion_tokens=len(self.tokens),
            timings=timings,
            logprobs={"content": list(self.logprobs)} if self.want_logprobs else None,
            reason=self.reason,
            stop_sequence=self.stop_sequence,
        )


class Piece(str):
    """A streamed text piece with the logprobs entries of the tokens it completes."""

    logprobs: list[dict]

    def __new__(cls, text: str, logprobs: list[dict]):
        obj = super().__new__(cls, text)
        obj.logprobs = logprobs
        return obj


def constraint_of(model, response_format=None, grammar=None):
    """The compiled grammar of a request for this model (None: unconstrained); GrammarError."""
    if response_format is None and grammar is None:
        return None
    if (
        isinstance(response_format, dict)
        and response_format.get("type") == "text"
        and grammar is None
        and set(response_format) == {"type"}
    ):
        return None
    from goinfer.constrained import compile_request  # llguidance is loaded on first use

    return compile_request(model.tokenizer, response_format=response_format, grammar=grammar)


# ============================================================================ stops


def stop_list(stop) -> list[str]:
    """A request's stop sequences (None, one string or several) as a list, empty ones out."""
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    out = []
    for s in stop:
        if not isinstance(s, str):
            raise ValueError(f"stop sequences must be strings, got {s!r}")
        if s:
            out.append(s)
    return out


def find_stop(text: str, stops: list[str], start: int) -> int | None:
    """Index where the earliest stop string begins, searching from a little before start."""
    best = None
    for s in stops:
        i = text.find(s, max(0, start - len(s) + 1))
        if i >= 0 and (best is None or i < best):
            best = i
    return best
