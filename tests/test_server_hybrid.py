"""A hybrid model (Qwen3.5: Gated DeltaNet layers with recurrent state + attention layers)
through the OpenAI-compatible server: continuous batching of hybrid sessions (each carries its
own recurrent state through the shared forward step), prefix reuse across requests through
the cache's state snapshots, and preemption (a preempted request's state is rebuilt from a
snapshot or from scratch).  Every result equals the same request alone (exact numerics)."""

from __future__ import annotations

import numpy as np
import pytest
from test_server import SETTINGS, Server, extra, lone, msgs

from fixtures import hfconvert
from goinfer import KVCache
from goinfer.gguf import GGUFFile
from goinfer.model import Model


@pytest.fixture(scope="module")
def hybrid():
    _, path = hfconvert.build("qwen35")
    m = Model(GGUFFile(path), threads=1, progress=False)
    assert m.hybrid
    return m


def test_concurrent_hybrid_requests_equal_lone_requests(hybrid):
    """Hybrid requests admitted together run as one batch (decode steps and prompt chunks of
    several sequences in one forward step, each with its own recurrent state); each result
    equals the request alone; requests sharing a system prompt longer than a snapshot interval
    reuse it (blocks + the state snapshot at its end)."""
    model = hybrid
    system = "You are a careful assistant who answers briefly. " * 3  # > 64 tokens
    jobs = [(msgs(f"question number {i}?", system), SETTINGS[i % 3], 8 + 5 * i) for i in range(5)]
    jobs.append((msgs(" ".join(f"w{i}" for i in range(50))), SETTINGS[1], 10))  # chunked
    cache = KVCache(model, max_tokens=2048)
    with Server(model, cache, max_batch=8, prefill_chunk=48) as s:

        def run(i):
            m, (body, _), n = jobs[i]
            return s.client().chat.completions.create(
                model="tiny", messages=m, max_tokens=n, **extra(body)
            )

        results = s.together(run, len(jobs), timeout=120)
        assert s.engine.peak_batch >= 4  # they really ran together
        # a later request with the same system prompt reuses it through a state snapshot
        late = s.client().chat.completions.create(
            model="tiny",
            messages=msgs("late?", system),
            max_tokens=5,
            temperature=0,
            extra_body={"return_tokens": True},
        )
        assert cache.stats().blocks_used == 0
    for (m, (_, kw), n), r in zip(jobs, results):
        ref = lone(model, chat=m, max_tokens=n, **kw)
        assert r.model_dump()["tokens"] == ref.tokens
        msg = r.choices[0].message  # Qwen3.5's template opens a think block: reasoning apart
        assert (msg.content, getattr(msg, "reasoning_content", None)) == (
            ref.content,
            ref.reasoning_content,
        )
    assert late.usage.prompt_tokens_details.cached_tokens >= 64
    assert (
        late.model_dump()["tokens"]
        == lone(model, chat=msgs("late?", system), max_tokens=5, temperature=0.0).tokens
    )
    assert len(cache.states) > 0


def test_hybrid_preemption_is_exact(hybrid):
    """A KV cache too small for every request: requests wait or are preempted and recomputed
    (their recurrent state rebuilt), and every result equals the request alone."""
    model = hybrid
    cache = KVCache(model, max_tokens=160, block_size=16)  # 10 blocks
    prompts = [[(7 * i + k) % 250 for k in range(20 + 9 * i)] for i in range(4)]
    with Server(model, cache, max_batch=4) as s:

        def run(i):
            return s.client().completions.create(
                model="tiny",
                prompt=prompts[i],
                max_tokens=40,
                temperature=0.8,
                seed=i,
                extra_body={"return_tokens": True},
            )

        results = s.together(run, 4, timeout=120)
        assert s.engine.n_preempted > 0  # the path under test ran
        assert cache.stats().blocks_used == 0
    for i, r in enumerate(results):
        ref = lone(model, prompt=prompts[i], max_tokens=40, temperature=0.8, seed=i)
        assert r.model_dump()["tokens"] == ref.tokens


def test_hybrid_models_do_not_draft(hybrid):
    """A hybrid model never drafts: its recurrent state, advanced in place over a draft's rows,
    cannot be cut back to the accepted ones.  A request asking for prompt_lookup on a prompt
    whose lookups find drafts gets plain decoding's result and timings saying drafted 0, in
    Session.generate and in the server."""
    from goinfer.speculative import prompt_lookup

    model = hybrid
    rep = [5, 9, 5, 9, 5, 9, 65, 66, 65, 66] * 4
    assert len(prompt_lookup(np.asarray(rep), 6)) > 0  # a non-hybrid model would draft here
    kw = dict(max_tokens=20, temperature=0.0, logit_bias={65: 6.0, 66: 6.0})
    ref = lone(model, prompt=rep, **kw)
    r = model.session(KVCache(model, max_tokens=256)).generate(
        rep, draft="prompt_lookup", draft_tokens=6, **kw
    )
    assert r.tokens == ref.tokens and r.timings.draft_tokens == 0
    with Server(model, draft="prompt_lookup", draft_tokens=6) as s:
        out = s.post(
            "/v1/completions",
            dict(
                prompt=rep,
                max_tokens=20,
                temperature=0,
                logit_bias={"65": 6.0, "66": 6.0},
                return_tokens=True,
            ),
        ).json()
    assert out["tokens"] == ref.tokens and out["timings"]["draft_n"] == 0


def test_hybrid_n_choices_fork_the_recurrent_state(hybrid):
    """n=3 on a hybrid model: each fork carries a copy of the prompt's recurrent state (and
    shares its blocks), so choice i equals the request alone with seed + i."""
    model = hybrid
    prompt = [(3 * k) % 250 for k in range(40)]
    with Server(model, KVCache(model, max_tokens=1024)) as s:
        r = s.post(
            "/v1/completions",
            dict(prompt=prompt, n=3, max_tokens=12, temperature=0.9, seed=4, return_tokens=True),
        ).json()
    for i, c in enumerate(r["choices"]):
        ref = lone(model, prompt=prompt, max_tokens=12, temperature=0.9, seed=4 + i)
        assert c["tokens"] == ref.tokens
