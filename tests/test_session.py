"""Session: exact-path bit-identity across batching, chunking, threads, reuse and forks;
generation options; typed errors that leave the session as it was."""

from __future__ import annotations

import numpy as np
import pytest

from goinfer import CacheFullError, ContextLengthError, KVCache, SamplingParams
from goinfer.gguf import GGUFFile
from goinfer.model import Model


@pytest.fixture(scope="module")
def model(tiny):
    return Model(GGUFFile(tiny("llama", 3)[1]), threads=2, progress=False)


def ids_(n, seed=0):
    return np.random.default_rng(seed).integers(0, 256, n).tolist()


def cold_logits(model, ids):
    s = model.session(KVCache(model, max_tokens=len(ids) + 32))
    return s.prefill(ids)


# ============================================================================ bit-identity (exact)


def test_prefill_equals_token_by_token(model):
    ids = ids_(50)
    one = model.session(KVCache(model, max_tokens=64)).prefill(ids)
    s = model.session(KVCache(model, max_tokens=64))
    last = s.prefill(ids[:1])
    for t in ids[1:]:
        last = s.decode(t)
    assert np.array_equal(one, last)


@pytest.mark.parametrize("cuts", [[5], [16], [1, 2, 3], [17, 33], [31, 32, 49]])
def test_chunked_prefill_is_bit_identical(model, cuts):
    ids = ids_(50, 1)
    ref = cold_logits(model, ids)
    s = model.session(KVCache(model, max_tokens=64))
    prev = 0
    for c in cuts + [len(ids)]:
        last = s.prefill(ids[prev:c])
        prev = c
    assert np.array_equal(ref, last)


def test_threads_do_not_change_bits(tiny):
    path = tiny("qwen2", 4)[1]
    ids = ids_(40, 2)
    a = Model(GGUFFile(path), threads=1, progress=False).logits(ids)
    b = Model(GGUFFile(path), threads=2, progress=False).logits(ids)
    assert np.array_equal(a, b)


def test_logits_rows_equal_session_prefixes(model):
    ids = ids_(20, 3)
    full = model.logits(ids)
    for n in (1, 9, 20):
        assert np.array_equal(full[n - 1], cold_logits(model, ids[:n]))


# ============================================================================ reuse, fork, truncate


def test_prefix_reuse_across_sessions_is_exact(model):
    cache = KVCache(model, max_tokens=512, block_size=16)
    prefix = ids_(70, 4)
    a = model.session(cache)
    a.prefill(prefix)
    b = model.session(cache)
    full = prefix + ids_(9, 5)
    r = b.generate(full, max_tokens=4)
    assert r.cached_tokens == 64  # four full blocks of the shared prefix
    c = model.session(KVCache(model, max_tokens=512))
    r_cold = c.generate(full, max_tokens=4)
    assert r_cold.cached_tokens == 0
    assert r.tokens == r_cold.tokens
    assert np.array_equal(b.decode(7), c.decode(7))


def test_whole_context_calls_reuse_own_history(model):
    s = model.session(KVCache(model, max_tokens=512))
    turn1 = ids_(40, 6)
    r1 = s.generate(turn1, max_tokens=5)
    turn2 = turn1 + r1.tokens + ids_(12, 7)
    r2 = s.generate(turn2, max_tokens=5)
    assert r2.cached_tokens >= len(turn1)
    cold = model.session(KVCache(model, max_tokens=512)).generate(turn2, max_tokens=5)
    assert r2.tokens == cold.tokens


def test_fork_copies_partial_block_on_write(model):
    cache = KVCache(model, max_tokens=256, block_size=16)
    base = ids_(21, 8)  # one full block + 5 tokens
    s = model.session(cache)
    s.prefill(base)
    f = s.fork()
    la = s.decode(3)
    lb = f.decode(4)
    assert np.array_equal(la, cold_logits(model, base + [3]))
    assert np.array_equal(lb, cold_logits(model, base + [4]))
    assert s.block_table[1] != f.block_table[1] and s.block_table[0] == f.block_table[0]


def test_truncate_then_continue(model):
    s = model.session(KVCache(model, max_tokens=256))
    a = ids_(40, 9)
    s.prefill(a)
    s.truncate(19)
    assert s.tokens == a[:19]
    got = s.prefill([5, 6, 7])
    assert np.array_equal(got, cold_logits(model, a[:19] + [5, 6, 7]))


def test_no_block_leaks(model):
    cache = KVCache(model, max_tokens=320, block_size=16)
    ss = [model.session(cache) for _ in range(3)]
    ss[0].prefill(ids_(50, 10))
    ss[1].prefill(ids_(50, 10) + [1, 2])
    f = ss[1].fork()
    f.decode(9)
    ss[2].generate(ids_(33, 11), max_tokens=3)
    del f
    for s in ss:
        s.reset()
    st = cache.stats()
    assert st.blocks_used == 0
    assert st.blocks_free + st.blocks_cached == st.blocks_total


# ============================================================================ errors


def test_prompt_longer_than_context(tiny):
    m = Model(GGUFFile(tiny("llama", 3)[1]), threads=1, progress=False, context_length=64)
    s = m.session()
    s.prefill(ids_(10))
    with pytest.raises(ContextLengthError):
        s.prefill(ids_(60))
    assert s.n_tokens == 10  # nothing lost
    with pytest.raises(ContextLengthError):
        s.generate(ids_(60), max_tokens=10)
    with pytest.raises(ContextLengthError):
        m.logits(ids_(65))


def test_cache_full_leaves_session_intact(model):
    cache = KVCache(model, max_tokens=64, block_size=16)  # 4 blocks
    a = model.session(cache)
    a.prefill(ids_(40, 12))  # 3 blocks
    b = model.session(cache)
    with pytest.raises(CacheFullError):
        b.prefill(ids_(40, 13))
    assert b.n_tokens == 0 and cache.stats().blocks_used == 3
    assert np.array_equal(a.decode(1), cold_logits(model, ids_(40, 12) + [1]))


def test_cache_full_after_reusing_cached_blocks_leaves_session_intact(model):
    """prefill() that first takes cached blocks, then cannot get a new one: the session gives
    them back (a retry must not append the reused tokens twice)."""
    cache = KVCache(model, max_tokens=64, block_size=16)  # 4 blocks
    shared = ids_(40, 16)
    a = model.session(cache)
    a.prefill(shared)  # 3 blocks, the first 2 hashed
    model.session(cache).prefill(ids_(5, 17))  # (garbage collected at once: its block is free)
    c = model.session(cache)
    c.prefill(ids_(5, 17))  # the last block
    before = cache.stats()
    b = model.session(cache)
    with pytest.raises(CacheFullError):
        b.prefill(shared[:32] + [1, 2])  # reuses a's 2 hashed blocks, then needs a new one
    assert b.n_tokens == 0 and cache.stats() == before
    f = a.fork()
    f.truncate(16)
    with pytest.raises(CacheFullError):
        f.prefill(shared[16:32] + [1, 2])  # reuses a's second block, then needs a new one
    assert f.tokens == shared[:16]
    c.reset()  # room again: the retries compute the right history
    assert np.array_equal(b.prefill(shared[:32] + [1, 2]), cold_logits(model, shared[:32] + [1, 2]))
    assert b.tokens == shared[:32] + [1, 2]
    b.reset()
    assert np.array_equal(
        f.prefill(shared[16:32] + [1, 2]), cold_logits(model, shared[:32] + [1, 2])
    )
    assert f.tokens == shared[:32] + [1, 2]


# ============================================================================ generation


def test_generate_options(model):
    s = model.session()
    p = ids_(12, 14)
    r = s.generate(p, max_tokens=8)
    assert r.finish_reason in ("length", "stop") and r.completion_tokens == len(r.tokens) <= 8
    assert r.prompt_tokens == 12
    t = r.timings
    assert t.prefill_ms > 0 and t.prefill_tok_s > 0
    r1 = s.generate(p, max_tokens=8, temperature=0.9, top_k=40, top_p=0.9, seed=5)
    r2 = s.generate(p, max_tokens=8, temperature=0.9, top_k=40, top_p=0.9, seed=5)
    assert r1.tokens == r2.tokens
    with pytest.raises(ValueError):
        s.generate(p, temperature=-1)
    with pytest.raises(ValueError):
        s.generate(p, top_p=0)


def test_generate_takes_sampling_params_and_overrides(model):
    """generate(prompt, params, **overrides): a SamplingParams, its fields as keywords, or
    both (the keywords win); any other keyword is a TypeError naming it."""
    s = model.session()
    p = ids_(12, 14)
    kw = dict(temperature=0.9, top_k=40, top_p=0.9, seed=5)
    ref = s.generate(p, max_tokens=8, **kw).tokens
    assert s.generate(p, SamplingParams(**kw), max_tokens=8).tokens == ref
    assert s.generate(p, SamplingParams(**dict(kw, seed=99)), max_tokens=8, seed=5).tokens == ref
    assert (
        s.generate(p, SamplingParams(), max_tokens=8).tokens == s.generate(p, max_tokens=8).tokens
    )  # the defaults are greedy
    for call in (s.generate, s.chat):
        arg = p if call == s.generate else [{"role": "user", "content": "hi"}]
        with pytest.raises(TypeError, match="unexpected keyword argument 'temprature'"):
            call(arg, max_tokens=2, temprature=0.5)
        with pytest.raises(TypeError, match="SamplingParams"):
            call(arg, {"temperature": 0.5}, max_tokens=2)
        with pytest.raises(ValueError):
            call(arg, SamplingParams(), max_tokens=2, top_p=0)


def greedy_reference(model, prompt, n, bias):
    """n greedy tokens by the definition: argmax of Model.logits of the growing sequence plus
    the bias (ties to the lower id), stopping at a stop token."""
    add = np.zeros(model.vocab_size)
    for t, v in bias.items():
        add[t] += v
    ids, out = list(prompt), []
    for _ in range(n):
        t = int(np.argmax(model.logits(ids)[-1].astype(np.float64) + add))
        if t in model.tokenizer.stop_ids:
            break
        out.append(t)
        ids.append(t)
    return out


def test_logit_bias_forces_token(model):
    r = model.session().generate(ids_(5), max_tokens=4, logit_bias={65: 100.0})
    assert r.tokens == [65] * 4


def test_logit_bias_shifts_greedy_choice(model):
    """A bias that bans the unbiased first choice and lifts the fifth just past the second:
    the fifth is chosen, and every later step is the argmax of the logits plus that bias."""
    p = ids_(8, 15)
    lg = model.logits(p)[-1].astype(np.float64)
    order = np.argsort(-lg, kind="stable")
    lift = float(lg[order[1]] - lg[order[4]]) + 0.05
    assert lift > 0.2  # so that half the bias, or none, would not make the fifth win
    bias = {int(order[0]): -np.inf, int(order[4]): lift}
    r = model.session().generate(p, max_tokens=6, logit_bias=bias)
    assert r.tokens[0] == int(order[4])
    assert r.tokens == greedy_reference(model, p, 6, bias)
    plain = model.session().generate(p, max_tokens=6)
    assert plain.tokens == greedy_reference(model, p, 6, {}) and plain.tokens[0] == int(order[0])


THE = 258  # the tiny vocabulary's token " the" (4 characters)


@pytest.mark.parametrize(
    "stops",
    [
        ["the"],  # starts inside the first token
        ["e t"],  # ends in the second token
        ["he the t"],  # spans three tokens, from inside the first
        ["e the the"],  # starts inside the first token, ends with the third
        [" the the the"],  # whole tokens, at offset 0
        ["zzz", "the t", "e th"],  # the earliest match wins, whatever the list order
        ["zzz"],  # never matches: the whole text, finish_reason "length"
    ],
)
def test_stop_strings_anywhere(model, stops):
    """Output steered to " the the the ..." (6 tokens); each stop string cuts the text at
    its first occurrence (computed here with str.find), streamed or not."""
    s = model.session()
    p = ids_(8, 15)
    full_text = " the" * 6
    hits = [full_text.find(x) for x in stops if x in full_text]
    cut = min(hits) if hits else len(full_text)
    want = full_text[:cut]
    r = s.generate(p, max_tokens=6, logit_bias={THE: 100.0}, stop=stops)
    assert r.text == want
    assert r.finish_reason == ("stop" if hits else "length")
    if hits:  # generation ends with the token that completed the earliest stop string
        end = min(full_text.find(x) + len(x) for x in stops if x in full_text)
        assert r.tokens == [THE] * -(-end // 4)
    pieces = list(s.generate(p, max_tokens=6, logit_bias={THE: 100.0}, stop=stops, stream=True))
    assert "".join(x for x in pieces[:-1]) == want and pieces[-1].text == want
    assert all(isinstance(x, str) and x for x in pieces[:-1])


def test_stream_and_stop_strings(model):
    s = model.session()
    p = ids_(8, 15)
    full = s.generate(p, max_tokens=12, logit_bias={65: 100.0})
    assert full.text == "A" * 12
    pieces = list(s.generate(p, max_tokens=12, logit_bias={65: 100.0}, stream=True))
    assert pieces[-1].text == "".join(pieces[:-1]) == full.text
    assert len(pieces) > 2  # streamed in several pieces, not at the end
    r = s.generate(p, max_tokens=12, logit_bias={65: 100.0}, stop=["AAA"])
    assert r.text == "" and r.finish_reason == "stop"
    streamed = list(s.generate(p, max_tokens=12, logit_bias={65: 100.0}, stop=["AAA"], stream=True))
    assert "".join(x for x in streamed if isinstance(x, str)) == ""


def test_decode_batch_equals_single_decodes(model):
    from goinfer.batch import decode_batch

    cache = KVCache(model, max_tokens=512)
    ss = [model.session(cache) for _ in range(3)]
    prompts = [ids_(5, 20), ids_(23, 21), ids_(40, 22)]
    for s, p in zip(ss, prompts):
        s.prefill(p)
    got = decode_batch(ss, [1, 2, 3])
    for p, t, g in zip(prompts, [1, 2, 3], got):
        assert np.array_equal(g, cold_logits(model, p + [t]))
