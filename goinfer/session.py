"""Session: a token history whose keys and values live in blocks of a KVCache.

Low level, append only: ``prefill(ids)`` and ``decode(token)`` add tokens and return the
logits of the last one.  High level, whole context: ``generate(prompt)`` and
``chat(messages)`` take the full prompt every time (as an agent resends its context); the
session keeps the longest common prefix of what it already holds, extends it with cached
blocks of the KVCache (from any session), and prefills only the rest, always at least one
token.  Every result says how many prompt tokens came from cache.
"""
from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from goinfer import logprobs as _lp
from goinfer.errors import CacheFullError, ContextLengthError
from goinfer.kv_cache import KVCache, block_hash, root_hash
from goinfer.recurrent import RecurrentState, SeqRecurrent
from goinfer.sampling import Sampler, SamplingParams
from goinfer.speculative import DEFAULT_DRAFT_TOKENS, Speculation, check_draft
from goinfer.tokenizer import StreamDecoder

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
    # chat with a reasoning model (goinfer/channels.py): its thinking, apart from content
    reasoning_content: str | None = None

    def __post_init__(self) -> None:
        if self.content is None and self.tool_calls is None:
            self.content = self.text

    def __str__(self) -> str:
        return self.text

    def message(self) -> dict:
        """The reply as an assistant message, to append to the conversation."""
        m = {"role": "assistant", "content": self.content}
        if self.reasoning_content is not None:
            m["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            m["tool_calls"] = self.tool_calls
        return m


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x = np.asarray(a[:n], dtype=np.int64) != np.asarray(b[:n], dtype=np.int64)
    i = int(np.argmax(x)) if x.any() else n
    return i


# ============================================================================ session


class Session:
    def __init__(self, model, cache: KVCache, *, cache_salt: str | None = None):
        if cache.model_fingerprint != model.fingerprint:
            raise ValueError("this KVCache belongs to another model")
        self.model = model
        self.cache = cache
        self.cache_salt = cache_salt
        self._tokens: list[int] = []
        self._blocks: list[int] = []  # block table
        self._hashes: list[bytes] = []  # chain hash of each full block
        # hybrid models (goinfer/recurrent.py): the live recurrent state (after all of
        # self._tokens) and own copies of it at earlier token counts (prompt ends)
        self._rec: RecurrentState | None = model.new_state() if model.hybrid else None
        self._marks: dict[int, RecurrentState] = {}
        self._finalizer = weakref.finalize(self, _release_all, cache, self._blocks)

    # ------------------------------------------------------------------ state

    @property
    def tokens(self) -> list[int]:
        return list(self._tokens)

    @property
    def n_tokens(self) -> int:
        return len(self._tokens)

    @property
    def block_table(self) -> np.ndarray:
        return np.asarray(self._blocks, dtype=np.int32)

    def reset(self) -> None:
        """Forget the history; its full blocks stay in the cache for reuse."""
        self.cache.release(self._blocks)
        self._blocks.clear()
        self._hashes.clear()
        self._tokens.clear()
        if self._rec is not None:
            self._rec.clear()
            self._marks.clear()

    close = reset

    def truncate(self, n: int) -> None:
        """Keep the first n tokens.  (A hybrid model resumes from the latest recurrent state
        at or before n and recomputes the tokens between it and n.)"""
        if not 0 <= n <= len(self._tokens):
            raise ValueError(f"cannot truncate {len(self._tokens)} tokens to {n}")
        if self._rec is not None:
            gap = self._tokens[:n]
            p = self._state_point(n)
            self._rewind(p)
            if p < n:
                self._feed(gap[p:])
            return
        self._cut(n)

    def _cut(self, n: int) -> None:
        """Drop the tokens after the first n and their blocks (not the recurrent state)."""
        bs = self.cache.block_size
        keep = -(-n // bs)
        if keep < len(self._blocks):
            self.cache.release(self._blocks[keep:])
            del self._blocks[keep:]
        del self._hashes[n // bs:]
        del self._tokens[n:]

    def fork(self) -> "Session":
        """A new session sharing every block; a partly filled block is copied on first write."""
        other = Session(self.model, self.cache, cache_salt=self.cache_salt)
        self.cache.retain(self._blocks)
        other._blocks.extend(self._blocks)
        other._hashes.extend(self._hashes)
        other._tokens.extend(self._tokens)
        if self._rec is not None:
            other._rec.load(self._rec)
            other._marks.update(self._marks)  # marks are never written: shared
        return other

    # ------------------------------------------------------------------ blocks

    def _parent_hash(self) -> bytes:
        return self._hashes[-1] if self._hashes else root_hash(self.cache_salt)

    def _block_mode(self, bi: int) -> str:
        """The numerics mode block bi is keyed by: that of its last position (Model.mode_at), so
        blocks below the fast floor are shared by both modes."""
        return self.model.mode_at((bi + 1) * self.cache.block_size - 1)

    def _reserve(self, n_new: int) -> None:
        """Make room for n_new more tokens: copy a shared or hashed partial block, allocate more.
        On failure nothing changes."""
        n = len(self._tokens)
        if n + n_new > self.model.n_ctx:
            raise ContextLengthError(
                f"{n + n_new} tokens exceed the context length {self.model.n_ctx} of "
                f"{self.model.name} ({n} held + {n_new} new)")
        bs = self.cache.block_size
        bi = n // bs  # the partly filled block, if n % bs
        cow = n % bs != 0 and not self.cache.writable(self._blocks[bi])
        fresh: list[int] = []
        try:
            if cow:
                fresh.append(self.cache.allocate())
                self.cache.copy_block(self._blocks[bi], fresh[0], n % bs)
            for _ in range(-(-(n + n_new) // bs) - len(self._blocks)):
                fresh.append(self.cache.allocate())
        except BaseException:
            self.cache.release(fresh)
            raise
        if cow:
            old, self._blocks[bi] = self._blocks[bi], fresh.pop(0)
            self.cache.release([old])
        self._blocks.extend(fresh)

    def _commit(self, ids: list[int]) -> None:
        """ids were just computed into the blocks: append them and hash every newly full block."""
        bs = self.cache.block_size
        self._tokens.extend(ids)
        for bi in range(len(self._hashes), len(self._tokens) // bs):
            mode = self._block_mode(bi)
            parent, toks = self._parent_hash(), self._tokens[bi * bs:(bi + 1) * bs]
            h = block_hash(parent, toks, mode, self.cache_salt)
            self._hashes.append(h)
            self.cache.commit(self._blocks[bi], h, parent, toks, mode)

    def _extend_from_cache(self, ids: list[int], limit: int) -> int:
        """Append cached full blocks matching ids[:limit] (the session must be block aligned)."""
        bs = self.cache.block_size
        if len(self._tokens) % bs:
            return 0
        i = 0
        while i + bs <= limit:
            chunk = ids[i:i + bs]
            h = block_hash(self._parent_hash(), chunk, self._block_mode(len(self._blocks)),
                           self.cache_salt)
            b = self.cache.lookup(h)
            if b is None:
                break
            self._blocks.append(b)
            self._hashes.append(h)
            self._tokens.extend(chunk)
            i += bs
        if self._rec is not None and i:
            i = self._back_to_snapshot(len(self._tokens) - i, i)
        return i

    # ------------------------------------------------------------------ recurrent state (hybrid)

    def _back_to_snapshot(self, n0: int, added: int) -> int:
        """Blocks covering tokens [n0, n0 + added) were just appended from the cache: keep them
        up to the last one that ends at a stored state snapshot, load that state, drop the rest.
        Returns the tokens kept."""
        bs, store = self.cache.block_size, self.cache.states
        keep = 0
        for b in range(n0 // bs + 1, (n0 + added) // bs + 1):
            snap = store.get(self._hashes[b - 1])
            if snap is not None:
                keep, state = b * bs - n0, snap
        if keep:
            self._rec.load(state)
        self._cut(n0 + keep)
        return keep

    def _state_point(self, n: int) -> int:
        """The largest token count <= n at which this session can have its recurrent state:
        its end, a mark, a stored snapshot of one of its blocks, or 0."""
        best = len(self._tokens) if len(self._tokens) <= n else 0
        best = max([best] + [m for m in self._marks if m <= n])
        bs, store = self.cache.block_size, self.cache.states
        for b in range(min(n, len(self._hashes) * bs) // bs, best // bs, -1):
            if self._hashes[b - 1] in store:
                return b * bs
        return best

    def _rewind(self, n: int) -> None:
        """Go back to token count n, a _state_point: load the state there, drop what follows."""
        if n < len(self._tokens):
            bs = self.cache.block_size
            snap = self._marks.get(n)
            if snap is None and n and n % bs == 0:
                snap = self.cache.states.get(self._hashes[n // bs - 1])
            if n == 0:
                self._rec.clear()
            elif snap is None:
                raise RuntimeError(f"no recurrent state at {n} tokens")  # pragma: no cover
            else:
                self._rec.load(snap)
        self._cut(n)
        for m in [m for m in self._marks if m > n]:
            del self._marks[m]

    def _mark(self) -> None:
        """Keep a copy of the live state at the current end (a prompt end): the next request
        usually resumes here.  The two most recent marks are kept."""
        if self._rec is None or not self._tokens:
            return
        self._marks[len(self._tokens)] = self._rec.copy()
        for m in sorted(self._marks)[:-2]:
            del self._marks[m]

    def _cached_snapshot_point(self, ids: list[int], limit: int) -> int:
        """How many tokens of ids[:limit] the shared cache can serve to a hybrid model from the
        start: the end of the deepest cached block chain of ids that has a state snapshot."""
        bs, store = self.cache.block_size, self.cache.states
        parent, best, i = root_hash(self.cache_salt), 0, 0
        while i + bs <= limit:
            h = block_hash(parent, ids[i:i + bs], self._block_mode(i // bs), self.cache_salt)
            b = self.cache.lookup(h)
            if b is None:
                break
            self.cache.release([b])
            parent, i = h, i + bs
            if h in store:
                best = i
        return best

    def _due_snapshots(self, n_new: int) -> list[int]:
        """Token counts in (n, n + n_new] that end a snapshot block (hybrid models)."""
        bs, store = self.cache.block_size, self.cache.states
        n = len(self._tokens)
        return [b * bs for b in range(n // bs + 1, (n + n_new) // bs + 1) if store.is_boundary(b)]

    def _keep_snapshots(self, snaps: dict) -> None:
        """After _commit: file the snapshots taken at block ends under those blocks' hashes."""
        bs = self.cache.block_size
        for n, st in snaps.items():
            if st is not None:
                self.cache.states.put(self._hashes[n // bs - 1], st)

    def _feed(self, ids: list[int], all_logits: bool = False) -> np.ndarray:
        """Compute ids at the end of the session (reserve, forward, commit) -> logits (T', V)."""
        self._reserve(len(ids))
        snaps = None
        if self._rec is not None:
            snaps = {n: None for n in self._due_snapshots(len(ids))}
        logits = self.model.forward(self.cache, self.block_table, ids, len(self._tokens),
                                    all_logits=all_logits, state=self._rec, snapshots=snaps)
        self._commit(ids)
        if snaps:
            self._keep_snapshots(snaps)
        return logits

    # ------------------------------------------------------------------ low level

    def prefill(self, ids) -> np.ndarray:
        """Append ids (reusing cached blocks where they match) -> logits of the last, (vocab,)."""
        ids = [int(t) for t in ids]
        if not ids:
            raise ValueError("prefill needs at least one token")
        logits, _ = self._prefill(ids)
        return logits

    def _prefill(self, ids: list[int]) -> tuple[np.ndarray, int]:
        if len(self._tokens) + len(ids) > self.model.n_ctx:
            raise ContextLengthError(
                f"prompt of {len(self._tokens) + len(ids)} tokens exceeds the context length "
                f"{self.model.n_ctx} of {self.model.name}")
        n0 = len(self._tokens)
        state = self._rec.copy() if self._rec is not None and n0 else None
        reused = self._extend_from_cache(ids, len(ids) - 1)
        rest = ids[reused:]
        try:
            logits = self._feed(rest)
        except BaseException:  # e.g. CacheFullError: give the reused blocks back
            if len(self._tokens) > n0:
                self._cut(n0)
                if self._rec is not None:
                    self._rec.load(state) if state is not None else self._rec.clear()
            raise
        self._mark()
        self.cache.count_hits(reused, len(rest))
        return logits[-1], reused

    def decode(self, token: int) -> np.ndarray:
        """Append one token -> logits of it, (vocab,)."""
        return self._feed([int(token)])[-1]

    def extend(self, ids) -> np.ndarray:
        """Append ids (no cache lookup) -> the logits of every one, (len(ids), vocab): one
        forward call, each row the bits of a decode step (speculative verification)."""
        ids = [int(t) for t in ids]
        if not ids:
            raise ValueError("extend needs at least one token")
        return self._feed(ids, all_logits=True)

    def _seat(self, ids: list[int]) -> int:
        """Reuse the longest prefix of ids held by this session or by the cache; prefill the rest
        later.  Returns the number of tokens reused."""
        limit = len(ids) - 1  # always prefill at least one token
        lcp = min(_common_prefix(self._tokens, ids), limit)
        if self._rec is not None:  # hybrid: resume where a recurrent state is known
            own = self._state_point(lcp)
            if self._cached_snapshot_point(ids, limit) > own:
                self._rewind(0)
                return self._extend_from_cache(ids, limit)
            self._rewind(own)
            return own
        bs = self.cache.block_size
        base = (lcp // bs) * bs
        # Would the shared cache give more than our own history?  Probe from the block boundary.
        if lcp < limit and (limit - base) >= bs:
            probe = self.fork()
            probe.truncate(base)
            got = probe._extend_from_cache(ids[base:], limit - base)
            if base + got > lcp:
                self.truncate(0)
                self._blocks.extend(probe._blocks)
                self._hashes.extend(probe._hashes)
                self._tokens.extend(probe._tokens)
                self.cache.retain(probe._blocks)
                probe.reset()
                return len(self._tokens)
            probe.reset()
        self.truncate(lcp)
        return lcp

    # ------------------------------------------------------------------ generation

    def generate(self, prompt, max_tokens: int = 64, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, min_p: float = 0.0, repeat_penalty: float = 1.0,
                 presence_penalty: float = 0.0, frequency_penalty: float = 0.0, logit_bias=None,
                 seed: int | None = None, stop=None, stream: bool = False, *,
                 repeat_last_n: int = 64, add_special: bool = True, response_format=None,
                 grammar=None, logprobs: bool = False, top_logprobs: int = 0,
                 draft: str | None = None, draft_tokens: int = DEFAULT_DRAFT_TOKENS):
        """Generate a continuation of the whole prompt (text or token ids).

        response_format: OpenAI's {"type": "json_object"} or {"type": "json_schema",
        "json_schema": {"name", "schema", "strict"}}; grammar: a Lark grammar (llguidance's)
        or {"regex": ...}.  The output is constrained token by token (goinfer/constrained.py);
        bad input raises GrammarError before anything is generated.  logprobs /
        top_logprobs (0..20): result.logprobs in OpenAI's shape.

        draft="prompt_lookup": speculative decoding, up to draft_tokens tokens proposed from
        the context and verified in one forward call (goinfer/speculative.py); the output is
        identical to draft=None's (tokens, text, logprobs), only faster when the reply copies
        from its context; result.timings.draft_tokens / draft_accepted say how much was
        proposed / accepted.  Hybrid models (recurrent state) decode without drafting (a state
        advanced over a draft's rows cannot be cut back to the accepted ones).

        CacheFullError: while the prompt is seated the session holds a prefix of it, while
        decoding the whole prompt (the reply is lost with the error); a retry resumes there.

        Returns a GenerationResult, or with stream=True an iterator of text pieces (never a
        split UTF-8 character) whose last item is the GenerationResult.  With logprobs the
        pieces are ``Piece`` strings carrying the entries of their tokens in ``.logprobs``."""
        if isinstance(prompt, str):
            ids = self.model.tokenize(prompt, add_special=add_special)
        else:
            ids = [int(t) for t in prompt]
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
                                presence_penalty=presence_penalty,
                                frequency_penalty=frequency_penalty, logit_bias=logit_bias, seed=seed)
        stops = _stop_list(stop)
        k = check_draft(draft, draft_tokens)
        if not isinstance(max_tokens, (int, np.integer)) or max_tokens < 0:
            raise ValueError(f"max_tokens must be an int >= 0, got {max_tokens!r}")
        if not ids:
            raise ValueError("the prompt is empty")
        if len(ids) + max_tokens > self.model.n_ctx:
            raise ContextLengthError(
                f"prompt of {len(ids)} tokens + max_tokens {max_tokens} exceeds the context "
                f"length {self.model.n_ctx} of {self.model.name}")
        extra = dict(grammar=constraint_of(self.model, response_format, grammar),
                     logprobs=_lp.check_request(logprobs, top_logprobs), draft_tokens=k)
        gen = self._generate(ids, int(max_tokens), params, stops, **extra)
        if stream:
            return gen
        for item in gen:
            if isinstance(item, GenerationResult):
                return item
        raise RuntimeError("generation ended without a result")  # pragma: no cover

    def chat(self, messages, max_tokens: int = 64, *, tools=None, tool_choice=None,
             parallel_tool_calls=None, response_format=None, grammar=None,
             logprobs: bool = False, top_logprobs: int = 0, stream: bool = False,
             chat_template_kwargs=None, **kwargs):
        """Apply the model's chat template to the whole conversation and generate the reply
        (response_format, grammar, logprobs, top_logprobs: as generate()).

        tools, tool_choice ("auto" | "none" | "required" | {"type": "function", "function":
        {"name": ...}}) and parallel_tool_calls as in OpenAI's API (goinfer/tools.py): the
        result's ``tool_calls`` holds the calls, ``content`` the rest of the text, and
        finish_reason is "tool_calls".  With stream=True the iterator gives content strings
        and ToolCallDelta pieces, then the result.  Bad tool input raises ToolError.

        A reasoning model's thinking (``<think>`` blocks, gpt-oss's analysis channel;
        goinfer/channels.py) goes to ``result.reasoning_content``, streamed as
        ``channels.Reasoning`` pieces.  chat_template_kwargs: more variables for the chat
        template (``{"enable_thinking": False}``, gpt-oss's ``reasoning_effort``)."""
        from goinfer.tools import prepare_chat

        tc = prepare_chat(self.model, messages, tools, tool_choice, parallel_tool_calls,
                          chat_template_kwargs)
        ids = self.model.tokenize_chat(tc.prompt)
        response_format, grammar = tc.constraint(response_format, grammar)
        out = self.generate(ids, max_tokens, response_format=response_format, grammar=grammar,
                            logprobs=logprobs, top_logprobs=top_logprobs, stream=stream,
                            **kwargs)
        return tc.stream(out) if stream else tc.finish(out)

    def _start(self, ids: list[int]) -> tuple[list[int], int]:
        """Seat ids for a whole-context generation: reuse the longest prefix held here or in the
        cache.  Returns (rest to prefill, cached token count)."""
        if len(ids) > self.model.n_ctx:
            raise ContextLengthError(
                f"prompt of {len(ids)} tokens exceeds the context length "
                f"{self.model.n_ctx} of {self.model.name}")
        reused = self._seat(ids)
        more = self._extend_from_cache(ids[reused:], len(ids) - reused - 1)
        rest = ids[reused + more:]
        self.cache.count_hits(reused + more, len(rest))  # own history counts as a hit too
        return rest, reused + more

    def _generate(self, ids: list[int], max_tokens: int, params: SamplingParams,
                  stops: list[str], grammar=None, logprobs=(False, 0),
                  draft_tokens: int = 0) -> Iterator:
        t0 = time.perf_counter()
        rest, cached = self._start(ids)
        # made before the prefill: a grammar's first mask is computed while the prompt runs
        gen = Generation(self.model, ids, max_tokens, params, stops, grammar=grammar,
                         logprobs=logprobs)
        logits = self._feed(rest)[-1]
        self._mark()
        t1 = time.perf_counter()
        spec = Speculation(ids, draft_tokens) if draft_tokens and self._rec is None else None
        while not gen.done:
            if gen.n_steps > 0:
                try:
                    logits = (self.decode(gen.tokens[-1]) if spec is None
                              else spec.next_logits(self, gen))
                except CacheFullError:
                    # the reply is lost with the error: hold the prompt only (a prefix of what
                    # this call was asked to hold), its blocks kept for a retry, the rest freed
                    self.truncate(len(ids))
                    raise
            piece = gen.push(logits)
            if piece or gen.has_logprobs():
                yield gen.piece(piece)
        if spec is not None:
            spec.settle(self)  # hold what plain decoding would: no draft past the last step
        piece = gen.finish()
        if piece or gen.has_logprobs():
            yield gen.piece(piece)
        yield gen.result(cached, len(ids) - cached, t0, t1, time.perf_counter())

    def __repr__(self) -> str:
        return f"Session({len(self._tokens)} tokens in {len(self._blocks)} blocks)"


# ============================================================================ one generation


class Generation:
    """The token-by-token side of one generation: sampling, stop tokens, stop strings and the
    streaming holdback (text that might be the start of a stop string is held back).

    Feed it the logits after the prompt, then after each of its tokens, with ``push`` (which
    returns the text that may be shown now) until ``done``; then ``finish`` returns the rest.
    ``Session.generate`` and the server's scheduler both drive one of these, so they give the
    same tokens and text."""

    def __init__(self, model, ids: list[int], max_tokens: int, params: SamplingParams,
                 stops: list[str], *, grammar=None, logprobs: tuple[bool, int] = (False, 0)):
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
            self.reason = ("grammar dead end: logit_bias bans every token the grammar allows"
                           if c is not None else "logit_bias bans every token")
            return ""
        if t in self.stop_ids and (c is None or c.ends(t)):
            self.finish_reason, self.done = "stop", True
            if c is not None:
                self.reason = c.reason
            return ""
        state = "more" if c is None else c.advance(t)
        if state == "rejected":  # not a valid continuation after all: a dead end
            self.finish_reason, self.done, self.reason = "stop", True, c.reason
            return ""
        if self.want_logprobs:
            self.logprobs.append(_lp.entry(self.tokenizer, logits, t, self.top_logprobs))
        self.sampler.accept(t)
        self.tokens.append(t)
        start = len(self.text)
        self.text += self.decoder.push(t)
        self._spans.append((start, len(self.text)))
        cut = _find_stop(self.text, self.stops, self.emitted)
        if cut is not None:
            self.text, self.finish_reason, self.done = self.text[:cut], "stop", True
            self._cut_by_string = True
            if c is not None:
                self.reason = "stop string (the output may not complete the grammar)"
            return ""
        if state == "end":
            self.finish_reason, self.done, self.reason = "stop", True, c.reason
        if len(self.tokens) >= self.max_tokens:
            self.done = True
        if c is not None and not self.done:
            c.prefetch()  # the next mask, while the caller runs the next forward pass
        if len(self.text) - self.hold > self.emitted:
            piece = self.text[self.emitted:len(self.text) - self.hold]
            self.emitted = len(self.text) - self.hold
            return piece
        return ""

    def finish(self) -> str:
        """Flush an unfinished UTF-8 character, apply the stops once more -> the remaining text."""
        if not self._cut_by_string:
            self.text += self.decoder.flush()
            cut = _find_stop(self.text, self.stops, self.emitted)
            if cut is not None:
                self.text, self.finish_reason = self.text[:cut], "stop"
                self._cut_by_string = True
        if self._cut_by_string and self.want_logprobs:
            # tokens wholly inside the cut stop string are not part of the output
            cut = len(self.text)
            keep = [i for i in range(len(self.logprobs))
                    if i < self._lp_sent or self._spans[i][0] < cut]
            self.logprobs = [self.logprobs[i] for i in keep]
        piece = self.text[self.emitted:]
        self.emitted = len(self.text)
        self.done = self._finished = True
        self.close()
        return piece

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
        out = self.logprobs[self._lp_sent:n]
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

    def result(self, cached: int, prefilled: int, t0: float, t1: float, t2: float
               ) -> GenerationResult:
        """The GenerationResult, timed from t0 (start) to t1 (prompt done) to t2 (end)."""
        n_decode = max(0, self.n_steps - 1)
        timings = Timings(
            prefill_ms=(t1 - t0) * 1e3,
            prefill_tok_s=prefilled / (t1 - t0) if t1 > t0 else 0.0,
            decode_ms=(t2 - t1) * 1e3,
            decode_tok_s=n_decode / (t2 - t1) if t2 > t1 and n_decode else 0.0,
            prefill_tokens=prefilled, decode_tokens=n_decode, draft_tokens=self.drafted,
            draft_accepted=self.accepted)
        return GenerationResult(text=self.text, tokens=list(self.tokens),
                                finish_reason=self.finish_reason, prompt_tokens=cached + prefilled,
                                cached_tokens=cached, completion_tokens=len(self.tokens),
                                timings=timings,
                                logprobs={"content": list(self.logprobs)}
                                if self.want_logprobs else None, reason=self.reason)


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
    if isinstance(response_format, dict) and response_format.get("type") == "text" and \
            grammar is None and set(response_format) == {"type"}:
        return None
    from goinfer.constrained import compile_request  # llguidance is loaded on first use

    return compile_request(model.tokenizer, response_format=response_format, grammar=grammar)


# ============================================================================ batched steps


def forward_sessions(items) -> list[np.ndarray]:
    """One forward step over several sessions of one model and KVCache, run as one batch.

    items: (session, tokens) or (session, tokens, "all") per session; each session appends its
    tokens (a prefill chunk, one token to decode, or a token and its draft to verify).  Returns
    per session the logits of its last token, (vocab,), or with "all" of every token, (T,
    vocab).  Each session's logits and KV are bit-identical to running it alone (in either
    numerics mode: a row's kernel depends on its position only).
    Blocks are reserved first: on CacheFullError earlier sessions may keep spare blocks, but no
    token is appended anywhere."""
    if not items:
        return []
    items = [(it[0], [int(t) for t in it[1]], it[2] if len(it) > 2 else "last") for it in items]
    cache, model = items[0][0].cache, items[0][0].model
    if any(s.cache is not cache or s.model is not model for s, _, _ in items):
        raise ValueError("forward_sessions needs sessions of one model sharing one KVCache")
    if len({id(s) for s, _, _ in items}) != len(items):
        raise ValueError("a session appears twice in the batch")
    for s, toks, want in items:
        if not toks:
            raise ValueError("every session in a batch needs at least one token")
        if want not in ("last", "all"):
            raise ValueError(f"want must be 'last' or 'all', got {want!r}")
        s._reserve(len(toks))
    seqs, snaps = [], []
    for s, toks, want in items:
        seq = (s.block_table, toks, s.n_tokens, want)
        if s._rec is not None:
            due = s._due_snapshots(len(toks))
            rec = SeqRecurrent.with_snapshots(s._rec, [n - 1 - s.n_tokens for n in due])
            seq += (rec,)
            snaps.append((due, rec))
        else:
            snaps.append(None)
        seqs.append(seq)
    logits = model.forward_batch(cache, seqs)
    for (s, toks, _), sn in zip(items, snaps):
        s._commit(toks)
        if sn is not None and sn[0]:
            s._keep_snapshots(dict(zip(sn[0], sn[1].snapshots())))
    return [lg if want == "all" else lg[-1] for lg, (_, _, want) in zip(logits, items)]


def decode_batch(sessions: list["Session"], tokens: list[int]) -> list[np.ndarray]:
    """One decode step for several sessions of one model and KVCache, run as one batch.
    Each session's logits are bit-identical to its own decode(token)."""
    if len(sessions) != len(tokens):
        raise ValueError("decode_batch needs one token per session")
    return forward_sessions([(s, [t]) for s, t in zip(sessions, tokens)])


# ============================================================================ helpers


def _release_all(cache: KVCache, blocks: list[int]) -> None:
    if blocks:
        cache.release(blocks)
        blocks.clear()


def _stop_list(stop) -> list[str]:
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


def _find_stop(text: str, stops: list[str], start: int) -> int | None:
    """Index where the earliest stop string begins, searching from a little before start."""
    best = None
    for s in stops:
        i = text.find(s, max(0, start - len(s) + 1))
        if i >= 0 and (best is None or i < best):
            best = i
    return best
