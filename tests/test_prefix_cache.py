"""Prefix reuse under random conversation trees: every result equals a cold recomputation bit
for bit (exact mode), evictions under a small budget included, and no block leaks."""
from __future__ import annotations

import gc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from goinfer import CacheFullError, ContextLengthError, KVCache
from goinfer.gguf import GGUFFile
from goinfer.model import Model


@pytest.fixture(scope="module")
def model(tiny):
    return Model(GGUFFile(tiny("qwen2", 11)[1]), threads=2, progress=False, exact=True,
                 context_length=256)


def cold(model, ids):
    """Logits of the last token of ids computed from scratch in a private cache."""
    s = model.session(KVCache(model, max_tokens=len(ids) + 8, block_size=8))
    return s.prefill(ids)


tokens = st.lists(st.integers(0, 255), min_size=1, max_size=40)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(data=st.data(), block_size=st.sampled_from([4, 8, 16]), budget=st.integers(12, 40))
def test_random_conversation_trees(model, data, block_size, budget):
    cache = KVCache(model, max_tokens=budget * block_size, block_size=block_size)
    sessions = []
    contexts = [[]]  # prompts seen so far: new prompts branch off them (shared prefixes)
    checked = 0
    for _ in range(data.draw(st.integers(4, 14), label="steps")):
        op = data.draw(st.sampled_from(["new", "chat", "append", "decode", "fork", "reset", "truncate"]))
        f = None
        if op == "new" or not sessions:
            sessions.append(model.session(cache))
            continue
        s = data.draw(st.sampled_from(sessions), label="session")
        before = s.tokens
        try:
            if op == "chat":  # whole-context call branching off an earlier prompt
                base = data.draw(st.sampled_from(contexts), label="base")
                cut = data.draw(st.integers(0, len(base)), label="cut")
                ids = base[:cut] + data.draw(tokens, label="suffix")
                r = s.generate(ids, max_tokens=data.draw(st.integers(0, 3)))
                assert r.cached_tokens <= len(ids) - 1
                contexts.append(ids + r.tokens)
                if r.tokens:
                    assert r.tokens[0] == int(np.argmax(cold(model, ids)))
                got, want_ids = (s.decode(5), s.tokens) if s.n_tokens < 200 else (None, None)
            elif op == "append":
                extra = data.draw(tokens, label="extra")
                got, want_ids = s.prefill(extra), before + extra
            elif op == "decode":
                t = data.draw(st.integers(0, 255))
                got, want_ids = s.decode(t), before + [t]
            elif op == "fork":
                f = s.fork()
                sessions.append(f)
                t = data.draw(st.integers(0, 255))
                got, want_ids = f.decode(t), before + [t]
                assert s.tokens == before  # the original is untouched by the fork's write
                s = f
            elif op == "reset":
                s.reset()
                got = None
            else:
                n = data.draw(st.integers(0, len(before)))
                s.truncate(n)
                got = None
                if n:
                    t = data.draw(st.integers(0, 255))
                    got, want_ids = s.decode(t), before[:n] + [t]
        except CacheFullError:
            # only the session's own spare blocks may have changed; its tokens never
            assert s.tokens[: len(before)] == before[: len(s.tokens)] or s.n_tokens == 0
            continue
        except ContextLengthError:
            continue
        if got is not None and want_ids is not None:
            assert s.tokens == want_ids
            assert np.array_equal(got, cold(model, want_ids)), op
            checked += 1
    st_ = cache.stats()
    assert st_.blocks_used + st_.blocks_cached + st_.blocks_free == st_.blocks_total
    sessions.clear()
    s = f = None  # noqa: F841
    gc.collect()
    st_ = cache.stats()
    assert st_.blocks_used == 0, st_
    assert st_.blocks_free + st_.blocks_cached == st_.blocks_total


def test_cache_salt_isolates_tenants(model):
    cache = KVCache(model, max_tokens=512, block_size=8)
    ids = list(range(40))
    a = model.session(cache, cache_salt="tenant-a")
    a.prefill(ids)
    same = model.session(cache, cache_salt="tenant-a").generate(ids + [1], max_tokens=1)
    other = model.session(cache, cache_salt="tenant-b").generate(ids + [1], max_tokens=1)
    none = model.session(cache).generate(ids + [1], max_tokens=1)
    assert same.cached_tokens == 40 and other.cached_tokens == 0 and none.cached_tokens == 0


def test_stats_count_hits_and_misses(model):
    cache = KVCache(model, max_tokens=512, block_size=8)
    s = model.session(cache)
    s.generate(list(range(30)), max_tokens=1)
    st0 = cache.stats()
    assert st0.hit_tokens == 0 and st0.miss_tokens == 30
    s2 = model.session(cache)
    r = s2.generate(list(range(30)) + [7, 8], max_tokens=1)
    st1 = cache.stats()
    assert r.cached_tokens == 24  # three full blocks of 8
    assert st1.hit_tokens - st0.hit_tokens == 24 and st1.miss_tokens - st0.miss_tokens == 8


def test_exact_mode_never_reuses_fast_blocks(model, tiny):
    """A block is keyed by the kernel its rows used: a block tagged fast (rows at positions
    >= 512 in the default mode) is never found by an exact-mode model, and is found by a
    default-mode model of the same file at a position where it runs fast."""
    from goinfer.kv_cache import FAST, block_hash, root_hash

    fast_model = Model(GGUFFile(tiny("qwen2", 11)[1]), threads=1, progress=False,
                       context_length=1024)
    cache = KVCache(model, max_tokens=1024, block_size=256)
    toks = list(range(256))
    chain = [root_hash(None)]
    for i in range(3):  # blocks 0, 1 (positions < 512): exact; block 2: fast
        mode = fast_model.mode_at(256 * (i + 1) - 1)
        b = cache.allocate()
        chain.append(block_hash(chain[-1], toks, mode))
        cache.commit(b, chain[-1], chain[-2], toks, mode)
        cache.release([b])
    assert mode == FAST
    assert model.session(cache)._extend_from_cache(toks * 3 + [1], 768) == 512
    assert fast_model.session(cache)._extend_from_cache(toks * 3 + [1], 768) == 768
