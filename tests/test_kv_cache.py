"""KVCache: block accounting, LRU eviction order, save/load with typed errors."""
from __future__ import annotations

import numpy as np
import pytest

from goinfer import CacheFileError, KVCache
from goinfer.gguf import GGUFFile
from goinfer.model import Model


@pytest.fixture(scope="module")
def model(tiny):
    return Model(GGUFFile(tiny("llama", 3)[1]), threads=2, progress=False)


def ids_(n, seed=0):
    return np.random.default_rng(seed).integers(0, 256, n).tolist()


def test_budget_in_bytes_and_tokens(model):
    c = KVCache(model, max_tokens=100, block_size=16)
    assert c.n_blocks == 7 and c.max_tokens == 112
    c2 = KVCache(model, max_bytes=3 * c.bytes_per_block + 5, block_size=16)
    assert c2.n_blocks == 3
    with pytest.raises(ValueError):
        KVCache(model, max_bytes=10)
    with pytest.raises(ValueError):
        KVCache(model, block_size=0)


def test_released_blocks_stay_cached_then_evict_lru_tail_first(model):
    c = KVCache(model, max_tokens=64, block_size=16)  # 4 blocks
    a = model.session(c)
    a.prefill(ids_(33, 1))  # 2 full blocks hashed + 1 partial
    a.reset()
    st = c.stats()
    assert st.blocks_cached == 2 and st.blocks_free == 2 and st.blocks_used == 0
    b = model.session(c)
    b.prefill(ids_(60, 2))  # needs 4 blocks: uses 2 free, then evicts the cached tail first
    assert c.stats().evictions == 2


def test_save_load_roundtrip_is_exact(model, tmp_path):
    c = KVCache(model, max_tokens=256, block_size=16)
    s = model.session(c)
    ids = ids_(70, 3)
    s.prefill(ids)
    n_saved = c.save(tmp_path / "kv.bin")
    assert n_saved == 4
    c2 = KVCache.load(model, tmp_path / "kv.bin")
    s2 = model.session(c2)
    r = s2.generate(ids + [5, 6], max_tokens=3)
    assert r.cached_tokens == 64
    cold = model.session(KVCache(model, max_tokens=256)).generate(ids + [5, 6], max_tokens=3)
    assert r.tokens == cold.tokens
    c3 = KVCache(model, max_tokens=256, block_size=16)
    assert c3.load(tmp_path / "kv.bin") == 4
    assert c3.load(tmp_path / "kv.bin") == 0  # already there


def test_bad_cache_files_raise_and_leave_cache_as_it_was(model, tiny, tmp_path):
    c = KVCache(model, max_tokens=256, block_size=16)
    model.session(c).prefill(ids_(40, 4))
    good = tmp_path / "kv.bin"
    c.save(good)
    raw = good.read_bytes()
    target = KVCache(model, max_tokens=256, block_size=16)
    s = model.session(target)
    s.prefill(ids_(20, 5))
    before = target.stats()
    k_before = target.k.copy()
    bad = tmp_path / "bad.bin"
    cases = [raw[: len(raw) // 2], raw[:10], b"nonsense" * 10, raw[:-1],
             raw[:-5] + bytes([raw[-5] ^ 1]) + raw[-4:], raw + b"x"]
    for data in cases:
        bad.write_bytes(data)
        with pytest.raises(CacheFileError):
            target.load(bad)
    other = Model(GGUFFile(tiny("llama", 9)[1]), threads=1, progress=False)
    with pytest.raises(CacheFileError):
        KVCache(other, max_tokens=256).load(good)
    with pytest.raises(CacheFileError):
        KVCache(model, max_tokens=256, block_size=32).load(good)
    with pytest.raises(CacheFileError):
        target.load(tmp_path / "missing.bin")
    assert target.stats() == before and np.array_equal(target.k, k_before)
