"""The generic runner: one Request in, a stream of Events out, for every API route.

    run = await runner.start(request)          # tokenize, compile, check, submit (or APIError)
    async for ev in runner.events(run): ...    # streamed: TextDelta, ReasoningDelta,
                                               #   ToolCallDelta, Ping..., then Done or Failed
    result = await runner.collect(run, gone)   # whole: the finished GenerationResult
    results = await runner.collect_all(run, gone)  # every choice's (Request.n_choices)

A request of several choices (OpenAI's ``n``, a batch of completion prompts) is one engine job
per prompt, each forking its session n - 1 times once its prompt is computed (scheduler.py);
its events carry their choice, and the stream ends after the Done of each.

Tokenizing (the chat template, ~ms to ~100 ms for long conversations) and compiling the
constraint run in worker threads, never on the event loop.  A chat reply is parsed as it comes
(goinfer/chat/): content, reasoning and tool-call pieces, each carrying the logprobs entries of
the tokens taken since the last piece, so the pieces' entries add up to the whole list.
Closing the event stream early (the client went away) cancels the job; its KV blocks are freed
before the engine's next step.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field

from starlette.concurrency import run_in_threadpool

from goinfer.chat.channels import Reasoning
from goinfer.chat.request import ToolChat, prepare_chat
from goinfer.chat.spec import ToolCallDelta
from goinfer.errors import (
    ChatTemplateError,
    ContextLengthError,
    GoinferError,
    GrammarError,
    ToolError,
)
from goinfer.generation import GenerationResult, constraint_of
from goinfer.sampling import SamplingParams
from goinfer.server.errors import APIError, bad, engine_error
from goinfer.server.metrics import KeyStats
from goinfer.server.request import Done, Event, Failed, Ping, ReasoningDelta, Request, TextDelta
from goinfer.server.scheduler import Event as EngineEvent
from goinfer.server.scheduler import Job, QueueFullError

__all__ = ["Runner", "Run", "ClientGone", "prompt_ids", "compile_constraint"]


class ClientGone(Exception):
    """The client closed the connection before the reply was complete."""


@dataclass(eq=False)
class Run:
    """A request the engine accepted."""

    request: Request
    job: Job  # the first prompt's job
    queue: asyncio.Queue  # the engine's events, put by the engine thread
    chat: ToolChat | None  # the chat side (None: a raw prompt)
    jobs: list[Job] = field(default_factory=list)  # one per prompt (a batch: several)

    def cancel(self, engine) -> None:
        """Cancel every job of the request (their forks with them)."""
        for j in self.jobs or [self.job]:
            if not j.cancelled:
                engine.cancel(j)


# ============================================================================ preparing


def prompt_ids(model, req: Request) -> tuple[list[int], ToolChat | None]:
    """The prompt's token ids and, for a chat, its ToolChat (the rendered conversation, the
    reply's grammar and parser).  Chat: BOS once, as ChatSession.chat; text: BOS added.
    Also what the Ray ingress runs to route a request (model: its text side only)."""
    if req.kind != "chat":
        if isinstance(req.prompt, str):
            return model.tokenize(req.prompt, True), None
        return list(req.prompt), None
    try:
        tc = prepare_chat(
            model,
            req.messages,
            req.tools,
            req.tool_choice,
            req.parallel_tool_calls,
            req.template_kwargs,
            req.unlisted_tools,
            req.system_in_place,
        )
    except ToolError as e:
        raise bad(str(e), e.param, "invalid_value", e) from None
    except ChatTemplateError as e:
        raise bad(
            f"the chat template failed: {e}", req.prompt_param, "chat_template_error", e
        ) from None
    return model.tokenize_chat(tc.prompt), tc


def compile_constraint(model, req: Request, tc: ToolChat | None = None):
    """The request's compiled constraint (None: unconstrained): its response_format or
    grammar, or its tools' grammar; a 400 naming the field when it cannot be enforced.  The
    first request of a model builds its tokenizer view (~0.1-2 s), later ones hit the
    compiled-grammar cache."""
    rf, grammar = req.response_format, req.grammar
    try:
        if tc is not None:
            rf, grammar = tc.constraint(rf, grammar)
        return constraint_of(model, rf, grammar)
    except ToolError as e:
        raise bad(str(e), e.param, "invalid_value", e) from None
    except GrammarError as e:
        code = "invalid_grammar" if e.param == "grammar" else "invalid_response_format"
        raise bad(str(e), e.param, code, e) from None


# ============================================================================ the runner


class Runner:
    def __init__(
        self,
        model,
        cache,
        engine,
        *,
        draft: bool = False,
        draft_tokens: int = 0,
        ping_interval: float = 5.0,
    ):
        """draft / draft_tokens: the default speculative drafting of requests (a request's own
        setting overrides it); ping_interval: seconds without an event before a Ping."""
        self.model = model
        self.cache = cache
        self.engine = engine
        self.draft = draft
        self.draft_tokens = draft_tokens
        self.ping_interval = ping_interval
        self.keys = KeyStats()  # prompt and cached tokens per conversation key (/metrics)

    async def start(self, req: Request) -> Run:
        """Tokenize and compile (worker threads), check the context, submit -> the Run.
        APIError: 400 (bad input, too long), 429 (the queue is full), 503 (shutting down)."""
        ids, tc = await run_in_threadpool(prompt_ids, self.model, req)
        batch = [ids]
        if req.prompts:  # a batch of completion prompts: the first one is req.prompt
            batch = await run_in_threadpool(
                lambda: (
                    [ids]
                    + [
                        prompt_ids(self.model, dataclasses.replace(req, prompt=p))[0]
                        for p in req.prompts[1:]
                    ]
                )
            )
        grammar = await run_in_threadpool(compile_constraint, self.model, req, tc)
        if req.n > self.engine.max_batch:
            raise bad(
                f"'n' must be at most {self.engine.max_batch} (the server's batch size, "
                "--max-batch)",
                "n",
                "invalid_value",
            )
        jobs = [self._job(req, x) for x in batch]
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[EngineEvent] = asyncio.Queue()

        def on_event(ev: EngineEvent) -> None:  # engine thread
            loop.call_soon_threadsafe(queue.put_nowait, ev)

        for p, job in enumerate(jobs):
            job.grammar, job.logprobs = grammar, (req.logprobs, req.top_logprobs)
            job.n, job.index, job.on_event = req.n, p * req.n, on_event
        for k, job in enumerate(jobs):
            try:
                self._submit(job)
            except APIError:
                for j in jobs[:k]:  # a batch is taken whole or not at all
                    self.engine.cancel(j)
                raise
        return Run(req, jobs[0], queue, tc, jobs)

    def _submit(self, job: Job) -> None:
        try:
            self.engine.submit(job)
        except QueueFullError as e:
            raise APIError(
                429,
                str(e),
                type="rate_limit_error",
                code="queue_full",
                headers={"Retry-After": "1"},
                cause=e,
            ) from None
        except ContextLengthError as e:
            raise bad(str(e), "max_tokens", "kv_cache_too_small", e) from None
        except GoinferError as e:
            raise APIError(503, str(e), type="server_error", code="unavailable", cause=e) from None

    def _job(self, req: Request, ids: list[int]) -> Job:
        """The engine's job: the context checks (a 400 whose cause is a ContextLengthError
        with the tokens asked for and the limit), the sampling settings, the drafting."""
        param = req.prompt_param
        if not ids:
            raise bad("the prompt is empty", param)
        n_ctx = self.model.n_ctx
        cap = min(n_ctx, self.cache.max_tokens - self.cache.block_size)
        max_tokens = req.max_tokens
        if req.fit_max_tokens and max_tokens is not None and len(ids) + max_tokens > cap:
            max_tokens = None  # a ceiling: what the context leaves
        if max_tokens is None:
            if len(ids) >= cap:
                msg = (
                    f"this model's maximum context length is {cap} tokens, but the "
                    f"messages take {len(ids)} tokens"
                )
                raise bad(
                    msg, param, "context_length_exceeded", ContextLengthError(msg, len(ids), cap)
                )
            max_tokens = cap - len(ids)
        elif len(ids) + max_tokens > n_ctx:
            msg = (
                f"this model's maximum context length is {n_ctx} tokens, but "
                f"{len(ids) + max_tokens} were requested ({len(ids)} in the prompt, "
                f"{max_tokens} for the completion); shorten the prompt or lower max_tokens"
            )
            raise bad(
                msg,
                param,
                "context_length_exceeded",
                ContextLengthError(msg, len(ids) + max_tokens, n_ctx),
            )
        try:
            sampling = dict(req.sampling)
            if req.sampling_given is not None:  # the model's own defaults where it has them
                own = self.model.defaults.sampling
                sampling.update({k: v for k, v in own.items() if k not in req.sampling_given})
            params = SamplingParams(**sampling)
        except ValueError as e:
            raise bad(str(e)) from None
        on = self.draft if req.draft is None else req.draft
        return Job(
            ids=ids,
            max_tokens=max_tokens,
            params=params,
            stops=req.stops or list(self.model.defaults.stop),  # the model's own
            on_event=lambda ev: None,
            cache_salt=req.cache_salt,
            draft_tokens=(req.draft_tokens or self.draft_tokens) if on else 0,
        )

    # ------------------------------------------------------------------ results

    async def collect(self, run: Run, gone: Awaitable) -> GenerationResult:
        """Wait for the whole result (its reply parsed); cancel the job if `gone` (the client
        closing the connection) completes first: ClientGone.  A failed generation raises its
        APIError.  (A request of several choices: the first one's; see collect_all.)"""
        return (await self.collect_all(run, gone))[0]

    async def collect_all(self, run: Run, gone: Awaitable) -> list[GenerationResult]:
        """Every choice's whole result, in choice order (collect's rules)."""
        gone = asyncio.ensure_future(gone)
        results: dict[int, GenerationResult] = {}
        try:
            while len(results) < run.request.n_choices:
                get = asyncio.ensure_future(run.queue.get())
                done, _ = await asyncio.wait({get, gone}, return_when=asyncio.FIRST_COMPLETED)
                if get not in done:
                    get.cancel()
                    run.cancel(self.engine)
                    raise ClientGone
                ev = get.result()
                if ev.kind == "done":
                    if ev.index == 0:
                        self._count_key(run, ev.result)
                    results[ev.index] = (
                        run.chat.finish(ev.result) if run.chat is not None else ev.result
                    )
                elif ev.kind == "error":
                    raise engine_error(ev.error)
            return [results[i] for i in sorted(results)]
        finally:
            gone.cancel()
            run.cancel(self.engine)  # a no-op for a finished job; frees it on any exit

    def _count_key(self, run: Run, result: GenerationResult) -> None:
        self.keys.add(run.request.cache_key, result.prompt_tokens, result.cached_tokens)

    async def events(self, run: Run) -> AsyncIterator[Event]:
        """The reply as events (see the module's docstring), a Ping whenever nothing came for
        ping_interval seconds, and last Done (one per choice) or Failed.  Closing the
        iterator before that cancels the job."""
        tc = run.chat
        parsed = tc is not None and tc.splits
        parsers: dict = {}  # choice -> its reply's parser
        # a parsed reply: logprobs entries of text the parser has taken but not given out yet
        # (a marker held back, whitespace between calls) go with the next piece
        carry: dict[int, list[dict]] = {}

        def parser(i: int):
            if i not in parsers:
                parsers[i] = tc.parser()
            return parsers[i]

        def pieces(items, i: int):
            for x in items:
                lps, carry[i] = carry.get(i) or None, []
                if isinstance(x, Reasoning):
                    yield ReasoningDelta(str(x), lps, i)
                elif isinstance(x, str):
                    yield TextDelta(x, lps, i)
                else:
                    assert isinstance(x, ToolCallDelta)
                    x.logprobs, x.choice = lps, i
                    yield x

        finished = False
        left = run.request.n_choices
        get = None
        try:
            get = asyncio.ensure_future(run.queue.get())
            while True:
                done, _ = await asyncio.wait({get}, timeout=self.ping_interval)
                if not done:
                    yield Ping()
                    continue
                ev = get.result()
                i = ev.index
                if ev.kind == "text":
                    if not parsed:
                        yield TextDelta(ev.text, ev.logprobs, i)
                    else:
                        carry[i] = carry.get(i, []) + (ev.logprobs or [])
                        for x in pieces(parser(i).push(ev.text), i):
                            yield x
                elif ev.kind == "done":
                    if i == 0:
                        self._count_key(run, ev.result)
                    if parsed:
                        p = parser(i)
                        for x in pieces(p.finish(), i):
                            yield x
                        tc.finish(ev.result, p)
                    yield Done(ev.result, carry.pop(i, None) or None, i)
                    left -= 1
                    if left == 0:
                        finished = True
                        return
                else:
                    finished = True
                    yield Failed(engine_error(ev.error))
                    return
                get = asyncio.ensure_future(run.queue.get())
        finally:
            if get is not None:
                get.cancel()
            if not finished:
                run.cancel(self.engine)
