"""The batching engine: one thread owns the model and runs every active request in one batch.

Each step of the engine thread:
  1. drop cancelled requests (their blocks go back to the cache at once);
  2. admit waiting requests, oldest first, while the batch has a seat and the KV cache has room
     for the prompt; seating reuses the longest cached prefix (shared by every request);
  3. one forward pass (``forward_sessions``) over the active sequences: every decoding sequence
     feeds its last token, and prompts are prefilled in chunks of at most ``prefill_chunk``
     tokens per step, so a long prompt never stalls the others for long;
  4. sample a token for every sequence whose prompt is done (``Generation``, shared with
     ``Session.generate``) and send its text to the waiting client.

A constrained request (JSON schema, grammar) batches with the others: its Generation starts
computing the next token's mask in a worker thread as soon as it has sampled, so the masks of
every constrained sequence are computed while the step's forward pass runs, and the engine
thread only waits for them (already done, normally) when it samples.

A request with speculative drafting (``draft_tokens`` > 0, goinfer/speculative.py) feeds its last
token and a draft of the tokens it will likely sample next as one short piece with logits for
every row; the engine samples from the rows in order while the draft holds, then cuts the
session back to the accepted tokens.  Its rows batch with everyone else's and give the bits of
decode steps, so its output is that of plain decoding.

A request for n choices (OpenAI's ``n``) takes n seats: its prompt is computed once, and when
it is done the job forks its session n - 1 times (the prompt's blocks shared; the partly
filled last block copied on first write), each fork a job of its own sampling from the same
logits with seed + i (choice i is what a lone request with that seed gives).

When the cache cannot hold a step's new tokens, the youngest request is preempted: its blocks
are released and it returns to the head of the queue, to be prefilled again later with the
tokens it generated so far (batch-invariant numerics make this invisible in its output).

The asyncio side talks to the engine through ``submit`` / ``cancel`` (thread safe) and gets
events back through the job's ``on_event`` callback, called on the engine thread.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from goinfer.batch import forward_sessions
from goinfer.errors import CacheFullError, ContextLengthError, GoinferError
from goinfer.generation import Generation, GenerationResult
from goinfer.sampling import SamplingParams
from goinfer.session import Session
from goinfer.speculative import Speculation

log = logging.getLogger("goinfer.server")

DEFAULT_PREFILL_CHUNK = 256  # prompt tokens per sequence per step
RATE_WINDOW_S = 10.0  # window of the tokens/s gauges


class QueueFullError(GoinferError, RuntimeError):
    """The server's request queue is full; try again later."""


# ============================================================================ jobs and events


@dataclass
class Event:
    kind: str  # "text" | "done" | "error"
    text: str = ""
    result: GenerationResult | None = None
    error: BaseException | None = None
    logprobs: list | None = None  # entries of the tokens of this text (when asked for)
    index: int = 0  # the choice it belongs to (Job.index)


_ids = itertools.count(1)


@dataclass(eq=False)
class Job:
    """One generation request as the engine sees it."""

    ids: list[int]  # prompt tokens
    max_tokens: int
    params: SamplingParams
    stops: list[str]
    on_event: Callable[[Event], None]  # called on the engine thread; must not block
    cache_salt: str | None = None
    grammar: object | None = None  # a compiled constrained.Grammar
    logprobs: tuple[bool, int] = (False, 0)  # (on, top_logprobs)
    draft_tokens: int = 0  # speculative drafting: tokens per draft (0: off)
    n: int = 1  # choices: n - 1 forks of the session once the prompt is done
    index: int = 0  # the choice this job's events belong to (forks: index + i)
    root: Job | None = None  # a fork: the job it was forked from (cancelled with it)
    id: int = field(default_factory=lambda: next(_ids))
    # ---- engine state
    cancelled: bool = False
    session: Session | None = None
    gen: Generation | None = None
    pending: list[int] = field(default_factory=list)  # tokens to feed before the next sample
    prefilling: bool = False  # pending holds prompt (or, after a preemption, recomputed) tokens
    spec: Speculation | None = None  # drafting state (draft_tokens > 0)
    cached: int = 0  # prompt tokens reused from the cache (first seating)
    prefilled: int = 0  # prompt tokens that had to be computed (first seating)
    preemptions: int = 0
    t_submit: float = 0.0
    t_start: float | None = None  # first seated
    t_prompt: float | None = None  # prompt done (first logits)
    forked: bool = False  # its n - 1 forks were made

    @property
    def need_tokens(self) -> int:
        """KV positions this job may need at most (each fork alone as much)."""
        return len(self.ids) + self.max_tokens

    @property
    def seats(self) -> int:
        """Seats in the batch it takes: its own, and its forks' still to be made."""
        return 1 if self.forked else self.n

    @property
    def gone(self) -> bool:
        """Cancelled (a fork: its root was)."""
        return self.cancelled or (self.root is not None and self.root.cancelled)


# ============================================================================ engine


class Engine:
    def __init__(
        self,
        model,
        cache,
        *,
        max_batch: int = 8,
        max_queue: int = 64,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
    ):
        if max_batch < 1 or max_queue < 1 or prefill_chunk < 1:
            raise ValueError("max_batch, max_queue and prefill_chunk must be >= 1")
        self.model = model
        self.cache = cache
        self.max_batch = int(max_batch)
        self.max_queue = int(max_queue)
        self.prefill_chunk = int(prefill_chunk)
        self._cond = threading.Condition()
        self._waiting: deque[Job] = deque()  # guarded by _cond
        self._active: list[Job] = []  # engine thread only, oldest first
        self._wake = False
        self._paused = False
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._busy = False
        # counters (written by the engine thread, read by /metrics)
        self.n_finished = 0
        self.n_cancelled = 0
        self.n_failed = 0
        self.n_preempted = 0
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.prefill_tokens = 0  # prompt tokens computed (including recomputation)
        self.decode_tokens = 0  # tokens fed as decode steps
        self.completion_tokens = 0
        self.steps = 0
        self.peak_batch = 0  # most sequences in one step
        self.busy_seconds = 0.0
        self._window: deque[tuple[float, int, int]] = deque()  # (t, prefill rows, decode rows)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="goinfer-engine", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        for job in list(self._active):  # after join: the engine thread is gone
            self._release(job)
            self._send(job, Event("error", error=GoinferError("the server is shutting down")))
        self._active.clear()
        with self._cond:
            waiting, self._waiting = list(self._waiting), deque()
        for job in waiting:
            self._send(job, Event("error", error=GoinferError("the server is shutting down")))

    def pause(self) -> None:
        """Hold the engine after its current step (tests use this to fill the queue)."""
        with self._cond:
            self._paused = True

    def resume(self) -> None:
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    # ------------------------------------------------------------------ asyncio side

    def check_fits(self, n_tokens: int) -> None:
        """Raise ContextLengthError if a job of n_tokens positions can never fit the cache."""
        bs = self.cache.block_size
        if -(-n_tokens // bs) + 1 > self.cache.n_blocks:
            raise ContextLengthError(
                f"the request needs up to {n_tokens} tokens of KV cache but the server's cache "
                f"holds {self.cache.max_tokens - bs}; lower max_tokens or restart the server with "
                "a larger --kv-tokens",
                n_tokens,
                self.cache.max_tokens - bs,
            )

    def submit(self, job: Job) -> None:
        if job.n > self.max_batch:
            raise ValueError(
                f"a job of {job.n} choices needs {job.n} seats; the batch has {self.max_batch}"
            )
        self.check_fits(job.need_tokens)
        with self._cond:
            if self._stopping:
                raise GoinferError("the server is shutting down")
            if len(self._waiting) >= self.max_queue:
                raise QueueFullError(f"the request queue is full ({self.max_queue} waiting)")
            job.t_submit = time.perf_counter()
            self._waiting.append(job)
            self._cond.notify_all()

    def cancel(self, job: Job) -> None:
        """Drop a job (the client went away); its blocks are freed before the next step."""
        with self._cond:
            job.cancelled = True
            self._wake = True
            self._cond.notify_all()

    @property
    def queue_depth(self) -> int:
        return len(self._waiting)

    @property
    def n_active(self) -> int:
        return len(self._active)

    def rates(self) -> tuple[float, float]:
        """(prefill, decode) tokens per second over the last RATE_WINDOW_S seconds."""
        now = time.perf_counter()
        w = [x for x in list(self._window) if now - x[0] <= RATE_WINDOW_S]
        return sum(x[1] for x in w) / RATE_WINDOW_S, sum(x[2] for x in w) / RATE_WINDOW_S

    # ------------------------------------------------------------------ engine thread

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and (
                    self._paused or not (self._waiting or self._active or self._wake)
                ):
                    self._cond.wait()
                if self._stopping:
                    return
                self._wake = False
            try:
                self._reap()
                self._admit()
                if self._active:
                    self._step()
            except BaseException as e:  # the engine must not die: fail what it was running
                log.exception("engine step failed")
                for job in list(self._active):
                    self._fail(job, e)

    def _send(self, job: Job, ev: Event) -> None:
        ev.index = job.index
        try:
            job.on_event(ev)
        except Exception:  # a closed event loop, a gone client: nothing to tell
            log.debug("event for job %s dropped", job.id, exc_info=True)

    def _release(self, job: Job) -> None:
        if job.session is not None:
            job.session.reset()
            job.session = None
        job.pending = []

    def _text(self, job: Job, piece: str) -> None:
        """Send a piece of text (with the logprobs of its tokens, when asked for)."""
        gen = job.gen
        if piece or gen.has_logprobs():
            lps = gen.take_logprobs() if gen.want_logprobs else None
            self._send(job, Event("text", text=piece, logprobs=lps))

    def _fail(self, job: Job, err: BaseException) -> None:
        self._release(job)
        if job in self._active:
            self._active.remove(job)
        self.n_failed += 1
        self._send(job, Event("error", error=err))

    def _reap(self) -> None:
        """Forget cancelled jobs, waiting or active; release their blocks."""
        with self._cond:
            gone = [j for j in self._waiting if j.gone]
            for j in gone:
                self._waiting.remove(j)
        for j in [j for j in self._active if j.gone]:
            self._release(j)
            self._active.remove(j)
            gone.append(j)
        self.n_cancelled += len(gone)

    def _room_for(self, job: Job) -> bool:
        """Heuristic admission check: blocks for the whole prompt plus one per active job."""
        bs = self.cache.block_size
        need = -(-(len(job.ids) + (len(job.gen.tokens) if job.gen else 0)) // bs) + job.seats
        return need + len(self._active) <= self.cache.available_blocks()

    def _admit(self) -> None:
        """Give waiting jobs seats in the batch.  A job is seated in the cache (its prefix
        looked up) only when its prompt is first fed, so it reuses blocks that jobs admitted
        with it have computed by then (a shared system prompt is prefilled once)."""
        while True:
            with self._cond:
                if not self._waiting:
                    return
                job = self._waiting[0]
                if sum(j.seats for j in self._active) + job.seats > self.max_batch:
                    return
                if self._active and not self._room_for(job):
                    return  # wait for blocks to come back
                self._waiting.popleft()
            self._active.append(job)

    def _give_session(self, job: Job) -> None:
        """Give the job a session holding the longest cached prefix of what it must feed."""
        first = job.gen is None
        ids = job.ids if first else job.ids + job.gen.tokens
        if job.t_start is None:
            job.t_start = time.perf_counter()
        session = self.model.session(self.cache, cache_salt=job.cache_salt)
        try:
            rest, cached = session.prepare_prompt(ids)
        except BaseException:
            session.reset()
            raise
        job.session, job.pending, job.prefilling = session, list(rest), True
        if first:
            job.gen = Generation(
                self.model,
                job.ids,
                job.max_tokens,
                job.params,
                job.stops,
                grammar=job.grammar,
                logprobs=job.logprobs,
            )
            if job.draft_tokens and not self.model.hybrid:  # (a recurrent state cannot be cut back)
                job.spec = Speculation(job.ids, job.draft_tokens)
            job.cached, job.prefilled = cached, len(rest)
            self.prompt_tokens += len(ids)
            self.cached_tokens += cached

    def _preempt(self, job: Job) -> None:
        """Release the job's blocks and put it back at the head of the queue."""
        self._release(job)
        self._active.remove(job)
        job.preemptions += 1
        self.n_preempted += 1
        with self._cond:
            self._waiting.appendleft(job)

    def _plan(self) -> list[tuple[Job, list[int]]]:
        """What each active job feeds this step.  Every decoding job feeds its token; prompts
        share a budget of prefill_chunk tokens, shortest remaining prompt first (a short request
        arriving during a long prefill starts at once).  How a prompt is cut does not change
        its bits (a row's attention kernel depends on its position only)."""
        work = []
        prompts = []
        for job in self._active:
            if job.session is not None and len(job.pending) == 1:
                if job.spec is not None and not job.prefilling:  # its token and a draft
                    work.append(
                        (job, job.spec.feed(job.gen, job.session.n_tokens, self.model.n_ctx))
                    )
                else:
                    work.append((job, job.pending[:1]))
            else:
                prompts.append(job)
        budget = self.prefill_chunk

        def remaining(j: Job) -> int:
            return len(j.pending) if j.session is not None else len(j.ids)

        for job in sorted(prompts, key=remaining):
            if budget <= 0:
                break
            if job.session is None:
                try:
                    self._give_session(job)
                except Exception as e:
                    self._fail(job, e)
                    continue
                if len(job.pending) == 1:  # all but the last prompt token were cached
                    work.append((job, job.pending[:1]))
                    continue
            take = min(len(job.pending), self.prefill_chunk, budget)
            work.append((job, job.pending[:take]))
            budget -= take
        return work

    def _reserve(self, work: list[tuple[Job, list[int]]]) -> list[tuple[Job, list[int]]]:
        """Reserve blocks for the step: when they do not fit, drop the drafts first (each
        drafting job feeds its token alone), then preempt the youngest jobs until it fits."""
        while work:
            try:
                for job, toks in work:
                    job.session.table.reserve(len(toks))
                return work
            except CacheFullError as e:
                drafting = {
                    id(j) for j, t in work if j.spec is not None and not j.prefilling and len(t) > 1
                }
                if drafting:
                    for job, toks in work:
                        if id(job) in drafting:
                            job.gen.drafted -= len(toks) - 1
                            job.session.drop_reserved()  # blocks held for a draft
                    work = [(j, t[:1] if id(j) in drafting else t) for j, t in work]
                    continue
                holders = [j for j in self._active if j.session is not None]
                victim = holders[-1]  # the youngest job holding blocks
                if len(holders) == 1:
                    self._fail(victim, e)
                else:
                    self._preempt(victim)
                work = [(j, t) for j, t in work if j is not victim]
        return work

    def _step(self) -> None:
        work = self._reserve(self._plan())
        if not work:
            return
        t0 = time.perf_counter()
        # a decoding job with drafting feeds its token and a draft: logits of every row
        wants = ["all" if j.spec is not None and not j.prefilling else "last" for j, _ in work]
        try:
            logits = forward_sessions(
                [(j.session, toks, want) for (j, toks), want in zip(work, wants)]
            )
        except Exception as e:
            for job, _ in work:
                self._fail(job, e)
            return
        t1 = time.perf_counter()
        n_prefill = sum(len(t) for j, t in work if j.prefilling)
        n_rows = sum(len(t) for _, t in work)
        self.steps += 1
        self.peak_batch = max(self.peak_batch, len(work))
        self.busy_seconds += t1 - t0
        self.prefill_tokens += n_prefill
        self.decode_tokens += n_rows - n_prefill
        self._window.append((t1, n_prefill, n_rows - n_prefill))
        while self._window and t1 - self._window[0][0] > RATE_WINDOW_S:
            self._window.popleft()
        for (job, toks), lg, want in zip(work, logits, wants):
            del job.pending[: len(toks)]
            if job.pending:
                continue  # more prompt to prefill
            job.prefilling = False
            if job.t_prompt is None:
                job.t_prompt = t1
            forks = self._fork(job) if not job.forked else []
            for j in [job] + forks:  # the choices of a prompt sample from its logits
                self._sample(j, toks, lg, want)

    def _sample(self, job: Job, toks: list[int], lg, want: str) -> None:
        """Sample the job's next token(s) from the step's logits lg of its rows toks."""
        gen = job.gen
        if want == "all":  # sample from the rows while the draft holds
            spec = job.spec
            spec.verified(toks, lg, job.session.n_tokens - len(toks))
            while not gen.done and (row := spec.take(gen)) is not None:
                self._text(job, gen.push(row))
            spec.settle(job.session)
        elif not gen.done:
            self._text(job, gen.push(lg))
        if gen.done:
            self._finish(job)
        else:
            job.pending = [gen.tokens[-1]]

    def _fork(self, job: Job) -> list[Job]:
        """The prompt of a job of n choices is done: its n - 1 other choices, each a job whose
        session is a fork of the job's (the prompt's blocks shared), seeded seed + i, seated
        right after it."""
        job.forked = True
        forks = []
        for i in range(1, job.n):
            p = job.params
            if p.seed is not None:
                p = dataclasses.replace(p, seed=p.seed + i)
            f = Job(
                ids=job.ids,
                max_tokens=job.max_tokens,
                params=p,
                stops=job.stops,
                on_event=job.on_event,
                cache_salt=job.cache_salt,
                grammar=job.grammar,
                logprobs=job.logprobs,
                draft_tokens=job.draft_tokens,
                index=job.index + i,
                root=job,
                forked=True,
                cached=job.cached,
                prefilled=job.prefilled,
                t_submit=job.t_submit,
                t_start=job.t_start,
                t_prompt=job.t_prompt,
            )
            f.session = job.session.fork()
            f.gen = Generation(
                self.model,
                f.ids,
                f.max_tokens,
                f.params,
                f.stops,
                grammar=f.grammar,
                logprobs=f.logprobs,
            )
            if f.draft_tokens and not self.model.hybrid:
                f.spec = Speculation(f.ids, f.draft_tokens)
            forks.append(f)
        at = self._active.index(job) + 1
        self._active[at:at] = forks
        return forks

    def _finish(self, job: Job) -> None:
        gen = job.gen
        self._text(job, gen.finish())
        result = gen.result(
            job.cached, job.prefilled, job.t_start, job.t_prompt, time.perf_counter()
        )
        self._release(job)
        self._active.remove(job)
        self.n_finished += 1
        self.completion_tokens += result.completion_tokens
        self._send(job, Event("done", result=result))
