"""Session: a token history whose keys and values live in blocks of a KVCache.

Low level, append only: ``prefill(ids)`` and ``decode(token)`` add tokens and return the
logits of the last one.  High level, whole context: ``generate(prompt)`` takes the full prompt
every time (as an agent resends its context); the session keeps the longest common prefix of
what it already holds, extends it with cached blocks of the KVCache (from any session), and
prefills only the rest, always at least one token.  Every result says how many prompt tokens
came from cache.  A session knows tokens only: ``Model.session()`` returns a ChatSession
(goinfer/chat/session.py), which adds ``chat(messages)``.

Its parts: the block table (goinfer/blocks.py), for a hybrid model where its recurrent state
can resume (goinfer/state_track.py), and the token loop of one generation
(goinfer/generation.py).

Where a session can resume: anywhere, unless it carries a recurrent state (hybrid models:
where the state is known) or its cache trims sliding-window layers (where the window KV
before the point is kept, blocks.py); then it resumes at the nearest such point at or before
the one it wants and recomputes the tokens between (both constraints at once when both apply).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np

from goinfer import logprobs as _lp
from goinfer.blocks import BlockTable
from goinfer.errors import CacheFullError, ContextLengthError
from goinfer.generation import Generation, GenerationResult, constraint_of, stop_list
from goinfer.kv_cache import KVCache
from goinfer.sampling import SamplingParams, sampling_params
from goinfer.speculative import DEFAULT_DRAFT_TOKENS, Speculation, check_draft
from goinfer.state_track import StateTrack

__all__ = ["Session"]


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x = np.asarray(a[:n], dtype=np.int64) != np.asarray(b[:n], dtype=np.int64)
    i = int(np.argmax(x)) if x.any() else n
    return i


class Session:
    def __init__(self, model, cache: KVCache, *, cache_salt: str | None = None):
        if cache.model_fingerprint != model.fingerprint:
            raise ValueError("this KVCache belongs to another model")
        self.model = model
        self.cache = cache
        self.cache_salt = cache_salt
        self.table = BlockTable(model, cache, cache_salt)
        # hybrid models (goinfer/recurrent.py): the live recurrent state and where it resumes
        self.track = StateTrack(self.table, model.new_state()) if model.hybrid else None

    # ------------------------------------------------------------------ state

    @property
    def tokens(self) -> list[int]:
        return list(self.table.tokens)

    @property
    def n_tokens(self) -> int:
        return len(self.table.tokens)

    @property
    def block_table(self) -> np.ndarray:
        return self.table.as_array()

    def reset(self) -> None:
        """Forget the history; its full blocks stay in the cache for reuse."""
        self.table.release()
        if self.track is not None:
            self.track.clear()

    close = reset

    def truncate(self, n: int) -> None:
        """Keep the first n tokens.  (Where the session cannot resume at n, module docstring,
        it resumes at the nearest point before and recomputes the tokens between it and n.)"""
        if not 0 <= n <= self.n_tokens:
            raise ValueError(f"cannot truncate {self.n_tokens} tokens to {n}")
        p = self._resume_point(n)
        gap = self.table.tokens[p:n]
        self._rewind(p)
        if gap:
            self._compute(gap)

    def drop_reserved(self) -> None:
        """Give back blocks reserved past the held tokens (a draft that was not fed)."""
        self.table.truncate(self.n_tokens)

    def fork(self) -> Session:
        """A new session sharing every block; a partly filled block is copied on first write."""
        other = type(self)(self.model, self.cache, cache_salt=self.cache_salt)
        self.table.share_into(other.table)
        if self.track is not None:
            assert other.track is not None  # the same model: the same kind of session
            self.track.share_into(other.track)
        return other

    # ------------------------------------------------------------------ computing tokens

    def _compute(self, ids: list[int], all_logits: bool = False) -> np.ndarray:
        """Compute ids at the end of the session (reserve, forward, commit) -> logits (T', V).
        With trimmed sliding windows each chunk of a long input is committed as soon as it is
        computed and the window KV behind the next one let go (BlockTable.trim_window)."""
        self.table.reserve(len(ids))
        snaps = None
        state = None
        if self.track is not None:
            snaps = {n: None for n in self.track.due_snapshots(len(ids))}
            state = self.track.state
        done = 0
        n0 = self.n_tokens

        def next_chunk(c: int) -> None:  # ids[:c] computed
            nonlocal done
            self.table.commit(ids[done:c])
            done = c
            self.table.trim_window(n0 + c)

        self.table.trim_window(n0)
        logits = self.model.forward(
            self.cache,
            self.block_table,
            ids,
            n0,
            all_logits=all_logits,
            state=state,
            snapshots=snaps,
            between_chunks=next_chunk if self.table.trims else None,
        )
        self.table.commit(ids[done:])
        if snaps and self.track is not None:
            self.track.keep_snapshots(snaps)
        return logits

    # ------------------------------------------------------------------ resume points

    @property
    def _resumes_at_points(self) -> bool:
        """Can the session resume only at some token counts (module docstring)?"""
        return self.track is not None or self.table.trims

    def _resume_point(self, n: int) -> int:
        """The largest token count <= n (held) where the session can resume."""
        while True:
            p = n if self.track is None else self.track.resume_point(n)
            p = self.table.resume_point(p)
            if p == n:
                return n
            n = p

    def _rewind(self, n: int) -> None:
        """Go back to n tokens, a _resume_point."""
        if self.track is not None:
            self.track.rewind(n)
        else:
            self.table.truncate(n)

    def _last_point(self, hashes: list[bytes], blocks: list[int], lo: int, hi: int) -> int:
        """The largest block count m in (lo, hi] where a session holding the chain (hashes,
        blocks) of full blocks could resume from the cache (a stored state snapshot there,
        the window KV before it), or lo."""
        m, bs = hi, self.cache.block_size
        while m > lo:
            if self.track is not None and not self.track.has_snapshot(hashes[m - 1]):
                m -= 1
                continue
            j = self.table.window_gap(blocks, m * bs)
            if j < 0:
                return m
            m = j
        return lo

    def _cached_point(self, ids: list[int], limit: int) -> tuple[int, int]:
        """(tokens of ids[:limit] in the shared cache's longest chain, the deepest point of
        that chain where a session could resume)."""
        hashes, blocks = self.table.cached_chain(ids, limit)
        bs = self.cache.block_size
        return len(blocks) * bs, self._last_point(hashes, blocks, 0, len(blocks)) * bs

    def _extend_from_cache(self, ids: list[int], limit: int) -> int:
        """Append cached full blocks matching ids[:limit] (the session must be block aligned),
        up to the last point where the session can resume.  -> tokens appended."""
        n0 = self.n_tokens
        i = self.table.extend_from_cache(ids, limit)
        if not i or not self._resumes_at_points:
            return i
        bs = self.cache.block_size
        t = self.table
        m = self._last_point(t.hashes, t.blocks, n0 // bs, (n0 + i) // bs)
        if self.track is not None:
            self.track.back_to(n0, m * bs)
        else:
            t.truncate(m * bs)
        return m * bs - n0

    def _mark_prompt_end(self) -> None:
        if self.track is not None:
            self.track.mark_prompt_end()
        self.table.keep_point_at(self.n_tokens)

    # ------------------------------------------------------------------ low level

    def prefill(self, ids) -> np.ndarray:
        """Append ids (reusing cached blocks where they match) -> logits of the last, (vocab,)."""
        ids = [int(t) for t in ids]
        if not ids:
            raise ValueError("prefill needs at least one token")
        logits, _ = self._prefill(ids)
        return logits

    def _prefill(self, ids: list[int]) -> tuple[np.ndarray, int]:
        if self.n_tokens + len(ids) > self.model.n_ctx:
            raise ContextLengthError(
                f"prompt of {self.n_tokens + len(ids)} tokens exceeds the context length "
                f"{self.model.n_ctx} of {self.model.name}",
                self.n_tokens + len(ids),
                self.model.n_ctx,
            )
        n0 = self.n_tokens
        state = self.track.state.copy() if self.track is not None and n0 else None
        reused = self._extend_from_cache(ids, len(ids) - 1)
        rest = ids[reused:]
        try:
            logits = self._compute(rest)
        except BaseException:  # e.g. CacheFullError: give the reused blocks back
            if self.n_tokens > n0:
                p = self.table.resume_point(n0)  # n0, unless its window KV went meanwhile
                if self.track is not None and p < n0:
                    p = 0
                self.table.truncate(p)
                if self.track is not None:
                    if state is not None and p == n0:
                        self.track.state.load(state)
                    else:
                        self.track.state.clear()
            raise
        self._mark_prompt_end()
        self.cache.count_hits(reused, len(rest))
        return logits[-1], reused

    def decode(self, token: int) -> np.ndarray:
        """Append one token -> logits of it, (vocab,)."""
        return self._compute([int(token)])[-1]

    def extend(self, ids) -> np.ndarray:
        """Append ids (no cache lookup) -> the logits of every one, (len(ids), vocab): one
        forward call, each row the bits of a decode step (speculative verification)."""
        ids = [int(t) for t in ids]
        if not ids:
            raise ValueError("extend needs at least one token")
        return self._compute(ids, all_logits=True)

    def _reuse_prefix(self, ids: list[int]) -> int:
        """Reuse the longest prefix of ids held by this session or by the cache; prefill the rest
        later.  Returns the number of tokens reused."""
        limit = len(ids) - 1  # always prefill at least one token
        lcp = min(_common_prefix(self.table.tokens, ids), limit)
        if self._resumes_at_points:  # the best point held here or in the cache
            own = self._resume_point(lcp)
            chain, cached = self._cached_point(ids, limit)
            if cached > own:
                self._rewind(0)
                got = self._extend_from_cache(ids, limit)
            else:
                self._rewind(own)
                got = own
            # where this prompt leaves what is held: the next one like it resumes there
            self.table.keep_point_at(max(lcp, chain))
            return got
        bs = self.cache.block_size
        base = (lcp // bs) * bs
        # Would the shared cache give more than our own history?  Probe from the block boundary.
        if lcp < limit and (limit - base) >= bs:
            probe = self.fork()
            probe.truncate(base)
            got = probe._extend_from_cache(ids[base:], limit - base)
            if base + got > lcp:
                self.truncate(0)
                probe.table.share_into(self.table)
                probe.reset()
                return self.n_tokens
            probe.reset()
        self.truncate(lcp)
        return lcp

    def prepare_prompt(self, ids: list[int]) -> tuple[list[int], int]:
        """Seat ids for a whole-context generation: reuse the longest prefix held here or in the
        cache.  Returns (rest to prefill, cached token count)."""
        if len(ids) > self.model.n_ctx:
            raise ContextLengthError(
                f"prompt of {len(ids)} tokens exceeds the context length "
                f"{self.model.n_ctx} of {self.model.name}",
                len(ids),
                self.model.n_ctx,
            )
        reused = self._reuse_prefix(ids)
        more = self._extend_from_cache(ids[reused:], len(ids) - reused - 1)
        rest = ids[reused + more :]
        self.cache.count_hits(reused + more, len(rest))  # own history counts as a hit too
        self.table.keep_point_at(len(ids))  # the prompt's end, once computed
        return rest, reused + more

    # ------------------------------------------------------------------ generation

    def generate(
        self,
        prompt,
        params: SamplingParams | None = None,
        *,
        max_tokens: int = 64,
        stream: bool = False,
        stop=None,
        response_format=None,
        grammar=None,
        logprobs: bool = False,
        top_logprobs: int = 0,
        draft: str | None = None,
        draft_tokens: int = DEFAULT_DRAFT_TOKENS,
        add_special: bool = True,
        **overrides,
    ):
        """Generate a continuation of the whole prompt (text or token ids).

        params: the sampling settings (goinfer.SamplingParams; default: the model's
        ``sampling_defaults``, greedy unless its source set them); any field of it may also be
        given as a keyword (``temperature=0.7, seed=1``), which overrides params'.  A keyword
        that is neither raises TypeError naming it.  stop: a string or a list of strings that
        end the text (not included; default: the model's own, ``model.defaults.stop``).
        add_special: a text prompt gets the model's BOS token.

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
        pieces are ``generation.Piece`` strings carrying the entries of their tokens in
        ``.logprobs``."""
        if isinstance(prompt, str):
            ids = self.model.tokenize(prompt, add_special=add_special)
        else:
            ids = [int(t) for t in prompt]
        params = sampling_params(params, overrides, "generate", self.model.sampling_defaults)
        stops = stop_list(stop) if stop is not None else list(self.model.defaults.stop)
        k = check_draft(draft, draft_tokens)
        if not isinstance(max_tokens, (int, np.integer)) or max_tokens < 0:
            raise ValueError(f"max_tokens must be an int >= 0, got {max_tokens!r}")
        if not ids:
            raise ValueError("the prompt is empty")
        if len(ids) + max_tokens > self.model.n_ctx:
            raise ContextLengthError(
                f"prompt of {len(ids)} tokens + max_tokens {max_tokens} exceeds the context "
                f"length {self.model.n_ctx} of {self.model.name}",
                len(ids) + max_tokens,
                self.model.n_ctx,
            )
        extra = dict(
            grammar=constraint_of(self.model, response_format, grammar),
            logprobs=_lp.check_request(logprobs, top_logprobs),
            draft_tokens=k,
        )
        gen = self._generate(ids, int(max_tokens), params, stops, **extra)
        if stream:
            return gen
        for item in gen:
            if isinstance(item, GenerationResult):
                return item
        raise RuntimeError("generation ended without a result")  # pragma: no cover

    def _generate(
        self,
        ids: list[int],
        max_tokens: int,
        params: SamplingParams,
        stops: list[str],
        grammar=None,
        logprobs=(False, 0),
        draft_tokens: int = 0,
    ) -> Iterator:
        t0 = time.perf_counter()
        rest, cached = self.prepare_prompt(ids)
        # made before the prefill: a grammar's first mask is computed while the prompt runs
        gen = Generation(
            self.model, ids, max_tokens, params, stops, grammar=grammar, logprobs=logprobs
        )
        logits = self._compute(rest)[-1]
        self._mark_prompt_end()
        t1 = time.perf_counter()
        spec = Speculation(ids, draft_tokens) if draft_tokens and self.track is None else None
        while not gen.done:
            if gen.n_steps > 0:
                try:
                    logits = (
                        self.decode(gen.tokens[-1]) if spec is None else spec.next_logits(self, gen)
                    )
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
        return f"{type(self).__name__}({self.n_tokens} tokens in {len(self.table.blocks)} blocks)"
