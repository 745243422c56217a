"""Speculative decoding (goinfer/speculative.py) changes no output.

prompt_lookup against a naive reference written here (Hypothesis); Session.generate with and
without draft="prompt_lookup" gives the same tokens, text, finish reason, streamed pieces
and session state over random prompts (crossing 512 too, both numerics modes), seeds,
temperatures, k and every sampling option (Hypothesis on tiny models); drafts are really
accepted (non-vacuity: counters of the result and of the attention kernels); SmolLM2 greedy on
a copy-heavy task once (slow).  The server's drafting is in tests/test_server.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from goinfer import KVCache
from goinfer.errors import RequestError
from goinfer.gguf import GGUFFile
from goinfer.model import Model
from goinfer.speculative import NGRAM_MAX, NGRAM_MIN, prompt_lookup

CTX = 1024

# ============================================================================ drafting


def naive_lookup(ctx: list[int], k: int) -> list[int]:
    """The longest suffix n-gram (NGRAM_MAX..NGRAM_MIN) with an earlier occurrence followed by
    a token; its latest such occurrence; the up to k tokens after it."""
    L = len(ctx)
    for n in range(NGRAM_MAX, NGRAM_MIN - 1, -1):
        if n >= L:
            continue
        suffix = ctx[L - n :]
        for i in range(L - n - 1, -1, -1):
            if ctx[i : i + n] == suffix:
                return ctx[i + n : i + n + k]
    return []


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=0, max_size=60), st.integers(0, 12))
def test_prompt_lookup_matches_naive_reference(ctx, k):
    assert prompt_lookup(np.asarray(ctx, np.int64), k) == naive_lookup(ctx, k)


def test_prompt_lookup_examples():
    a = np.asarray([5, 1, 2, 3, 9, 9, 1, 2, 3, 7, 1, 2, 3], np.int64)
    assert prompt_lookup(a, 2) == [7, 1]  # "1 2 3" most recently at 6..8, then 7
    assert prompt_lookup(np.asarray([1, 2, 3, 4], np.int64), 3) == []  # no repeated n-gram
    assert prompt_lookup(np.asarray([8, 8, 8], np.int64), 5) == [8]  # overlap with the end


# ============================================================================ output identity


@pytest.fixture(scope="module")
def models(tiny):
    made = {}

    def get(threads=1, exact=False):
        if (threads, exact) not in made:
            made[threads, exact] = Model(
                GGUFFile(tiny("llama", 3, max_position_embeddings=CTX)[1]),
                threads=threads,
                exact=exact,
                context_length=CTX,
                progress=False,
            )
        return made[threads, exact]

    return get


def run(model, ids, stream=False, **kw):
    """generate in a fresh session -> (result, streamed pieces, session tokens after)."""
    s = model.session(KVCache(model, max_tokens=CTX + 64))
    if stream:
        items = list(s.generate(ids, stream=True, **kw))
        return items[-1], items[:-1], s.tokens
    return s.generate(ids, **kw), None, s.tokens


def repetitive_prompt(rng, n):
    """n tokens made of a few repeated random phrases (so that lookups find matches)"""
    phrases = [rng.integers(0, 256, rng.integers(2, 9)).tolist() for _ in range(4)]
    out = []
    while len(out) < n:
        out += phrases[rng.integers(0, 4)] if rng.random() < 0.7 else [int(rng.integers(0, 256))]
    return out[:n]


SAMPLING = st.fixed_dictionaries(
    {},
    optional={
        "temperature": st.sampled_from([0.0, 0.4, 0.9, 1.5]),
        "top_k": st.sampled_from([0, 1, 5, 40]),
        "top_p": st.sampled_from([1.0, 0.9, 0.5]),
        "min_p": st.sampled_from([0.0, 0.05, 0.3]),
        "repeat_penalty": st.sampled_from([1.0, 1.1, 0.8]),
        "presence_penalty": st.sampled_from([0.0, 0.5, -0.5]),
        "frequency_penalty": st.sampled_from([0.0, 0.3]),
        # strong biases make the output repeat a few tokens, so drafts get accepted
        "logit_bias": st.sampled_from(
            [None, {65: 6.0, 66: 6.0}, {7: 9.0, 8: 8.0, 9: 7.0}, {65: -100.0}]
        ),
        "stop": st.sampled_from([None, "A", ["BA", "\x07\x08"], "zz"]),
        "logprobs": st.booleans(),
        "top_logprobs": st.sampled_from([0, 3]),
    },
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    seed=st.integers(0, 10**6),
    n=st.one_of(st.integers(1, 200), st.integers(480, 560)),
    k=st.integers(1, 10),
    max_tokens=st.integers(0, 60),
    sampling=SAMPLING,
    exact=st.booleans(),
    stream=st.booleans(),
    threads=st.sampled_from([1, 2]),
)
def test_drafting_changes_no_output_hypothesis(
    models, seed, n, k, max_tokens, sampling, exact, stream, threads
):
    """With and without drafting: the same tokens, text, finish reason, completion count,
    logprobs, streamed pieces (and their logprobs) and session tokens afterwards (prompts of up
    to 560 tokens: verify rows on both sides of the fast floor in the default mode)."""
    m = models(threads, exact)
    ids = repetitive_prompt(np.random.default_rng(seed), n)
    kw = dict(sampling, max_tokens=max_tokens, seed=seed)
    if not kw.get("logprobs"):
        kw.pop("top_logprobs", None)
    plain, p_pieces, p_tokens = run(m, ids, stream, **kw)
    spec, s_pieces, s_tokens = run(m, ids, stream, draft="prompt_lookup", draft_tokens=k, **kw)
    assert spec.tokens == plain.tokens
    assert spec.text == plain.text
    assert spec.finish_reason == plain.finish_reason
    assert spec.completion_tokens == plain.completion_tokens
    assert spec.logprobs == plain.logprobs
    assert s_pieces == p_pieces
    if stream and kw.get("logprobs"):
        assert [p.logprobs for p in s_pieces] == [p.logprobs for p in p_pieces]
    assert s_tokens == p_tokens
    t = spec.timings
    assert 0 <= t.draft_accepted <= t.draft_tokens and plain.timings.draft_tokens == 0
    assert t.decode_tokens == plain.timings.decode_tokens
    event(f"drafts accepted: {'some' if t.draft_accepted else 'none'}")


def test_drafts_are_accepted_and_verified_in_one_call(models):
    """Non-vacuity: a prompt and biases that make the reply repeat, so most drafts are
    accepted; the verify calls run several rows at once (fewer forward calls than tokens),
    and the output is still plain decoding's, greedy and sampled."""
    from goinfer._kernels import attention_counters, reset_attention_counters

    m = models()
    ids = repetitive_prompt(np.random.default_rng(1), 300)
    for kw in (
        dict(temperature=0.0, logit_bias={7: 9.0, 8: 8.0, 9: 7.0}),
        dict(temperature=0.8, seed=5, logit_bias={65: 6.0, 66: 6.0}),
    ):
        plain, _, _ = run(m, ids, max_tokens=80, **kw)
        reset_attention_counters()
        spec, _, _ = run(m, ids, max_tokens=80, draft="prompt_lookup", draft_tokens=8, **kw)
        assert spec.tokens == plain.tokens and spec.text == plain.text
        t = spec.timings
        assert t.draft_accepted >= 10 and t.draft_tokens >= t.draft_accepted, t
        # forward calls: the prefill, then one per sample not served by an accepted draft
        calls = attention_counters()["exact_calls"] // m.config.n_layers
        assert calls == 1 + t.decode_tokens - t.draft_accepted, (calls, t)


def test_constrained_output_and_logprobs_unchanged(models):
    """A JSON schema (llguidance masks, computed while the forward runs) with logprobs: the
    same tokens, text, reason and logprobs with drafting; drafts the grammar forbids are simply
    rejected."""
    m = models()
    schema = {
        "type": "object",
        "required": ["a", "b"],
        "additionalProperties": False,
        "properties": {
            "a": {"type": "string", "maxLength": 20},
            "b": {"type": "array", "items": {"type": "integer"}, "maxItems": 6},
        },
    }
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}
    ids = repetitive_prompt(np.random.default_rng(3), 120) + list(b'{"a": "abab", "b": [1, 2')
    for kw in (dict(temperature=0.0), dict(temperature=0.9, seed=11)):
        kw.update(
            max_tokens=60,
            response_format=rf,
            logprobs=True,
            top_logprobs=2,
            logit_bias={97: 3.0, 98: 3.0, 49: 2.0, 44: 2.0},
        )
        plain, _, _ = run(m, ids, **kw)
        spec, _, _ = run(m, ids, draft="prompt_lookup", draft_tokens=6, **kw)
        assert spec.tokens == plain.tokens and spec.text == plain.text
        assert spec.logprobs == plain.logprobs and spec.reason == plain.reason
        assert spec.finish_reason == plain.finish_reason
        assert spec.timings.draft_tokens > 0


def test_chat_takes_draft(models):
    m = models()
    msgs = [{"role": "user", "content": "abc abc abc abc abc"}]
    a = m.session().chat(msgs, max_tokens=30, logit_bias={97: 5.0, 98: 5.0, 99: 5.0})
    b = m.session().chat(
        msgs, max_tokens=30, logit_bias={97: 5.0, 98: 5.0, 99: 5.0}, draft="prompt_lookup"
    )
    assert a.text == b.text and b.timings.draft_tokens > 0


def test_draft_without_room_falls_back_to_a_decode_step(models):
    """A draft that needs a block the cache cannot give does not fail the step plain decoding
    would take: the token alone is decoded (the same logits as a decode step), nothing of the
    draft is counted or held, no block is leaked."""
    from goinfer.generation import Generation
    from goinfer.sampling import SamplingParams
    from goinfer.speculative import Speculation

    m = models()
    A = list(range(100, 112))
    ids = A + [7] + A[:3]  # 16 tokens: 2 blocks of 8
    cache = KVCache(m, max_tokens=24, block_size=8)  # 3 blocks: the next token fits, no more
    s = m.session(cache)
    gen = Generation(m, ids, 40, SamplingParams(logit_bias={A[3]: 100.0}), [])
    gen.push(s.prefill(ids))
    assert gen.tokens == [A[3]]
    assert len(prompt_lookup(np.asarray(ids + [A[3]]), 16)) > 24 - 17  # a draft past the cache
    got = Speculation(ids, 16).next_logits(s, gen)
    ref = m.session(KVCache(m, max_tokens=64))
    ref.prefill(ids)
    assert np.array_equal(got, ref.decode(A[3]))
    assert s.tokens == ids + [A[3]] and gen.drafted == 0
    assert cache.stats().blocks_used == len(s.block_table) == 3


def test_bad_draft_arguments(models):
    s = models().session()
    for kw, param in (
        (dict(draft="medusa"), "draft"),
        (dict(draft="prompt_lookup", draft_tokens=0), "draft_tokens"),
        (dict(draft="prompt_lookup", draft_tokens=1.5), "draft_tokens"),
        (dict(draft="prompt_lookup", draft_tokens=True), "draft_tokens"),
    ):
        with pytest.raises(RequestError) as e:
            s.generate([1, 2, 3], max_tokens=4, **kw)
        assert e.value.param == param
    assert s.n_tokens == 0  # nothing ran


# ============================================================================ SmolLM2

FILE = '''def load_config(path):
    """Read a JSON config file and return it as a dict."""
    with open(path) as f:
        data = json.load(f)
    data.setdefault("threads", 4)
    data.setdefault("timeout", 30)
    return data


def save_config(path, data):
    """Write a config dict to a JSON file."""
    with open(path, "w") as f:
        json.dump(data, f, indent=2)
'''


@pytest.mark.slow
def test_smollm2_copy_task_greedy(smollm2):
    """The real model editing a file it was shown: the same text with and without drafting,
    and most of the reply comes from accepted drafts."""
    msgs = [
        {
            "role": "user",
            "content": "Here is config.py:\n\n```python\n"
            + FILE
            + "```\n\nChange the default timeout to 60. Reply with the whole updated file.",
        }
    ]
    plain = smollm2.session(KVCache(smollm2, max_tokens=1024)).chat(msgs, max_tokens=160)
    spec = smollm2.session(KVCache(smollm2, max_tokens=1024)).chat(
        msgs, max_tokens=160, draft="prompt_lookup"
    )
    assert spec.text == plain.text and spec.tokens == plain.tokens
    assert spec.timings.draft_accepted >= spec.completion_tokens // 4, spec.timings
