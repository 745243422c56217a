"""KVCache: block accounting, LRU eviction order, save/load with typed errors."""
from __future__ import annotations

import numpy as np
import pytest

from goinfer import CacheFileError, KVCache
from goinfer.gguf import GGUFFile
from goinfer.kv_cache import EXACT, block_hash, root_hash
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


def chain(ids, block_size):
    """Chain hashes of the full blocks of ids (exact mode, no salt)."""
    h, out = root_hash(None), []
    for i in range(len(ids) // block_size):
        h = block_hash(h, ids[i * block_size:(i + 1) * block_size], EXACT)
        out.append(h)
    return out


def cached(cache, h) -> bool:
    """Is a block with chain hash h in the cache?  (Looks it up and gives it back.)"""
    b = cache.lookup(h)
    if b is not None:
        cache.release([b])
    return b is not None


def test_released_blocks_stay_cached_then_evict_lru_tail_first(model):
    c = KVCache(model, max_tokens=96, block_size=16)  # 6 blocks
    A, B = ids_(33, 1), ids_(33, 2)
    a, b = model.session(c), model.session(c)
    a.prefill(A)  # 2 full blocks hashed + 1 partial
    b.prefill(B)
    a.reset()
    st = c.stats()
    assert st.blocks_cached == 2 and st.blocks_free == 1 and st.blocks_used == 3
    b.reset()  # LRU, least recent first: A2 A1 B2 B1 (each chain released tail first)
    assert c.stats().blocks_cached == 4 and c.stats().blocks_free == 2
    r = model.session(c).generate(A[:32] + [7], max_tokens=0)  # reuse A: now B2 B1 A2 A1
    assert r.cached_tokens == 32
    d = model.session(c)
    d.prefill(ids_(65, 3))  # 5 blocks: the 2 free ones, then evicts B2, B1, A2 in that order
    assert c.stats().evictions == 3
    (a1, a2), (b1, b2) = chain(A, 16), chain(B, 16)
    assert [cached(c, h) for h in (a1, a2, b1, b2)] == [True, False, False, False]


def test_save_load_roundtrip_is_exact(model, tmp_path):
    c = KVCache(model, max_tokens=256, block_size=16)
    s = model.session(c)
    ids = ids_(70, 3)
    s.prefill(ids)
    n_saved = c.save(tmp_path / "kv.bin")
    assert n_saved == 4
    before = model.session(c).prefill(ids + [5, 6])  # reads the 4 blocks from c
    c2 = KVCache.load(model, tmp_path / "kv.bin")
    s2 = model.session(c2)
    after = s2.prefill(ids + [5, 6])
    assert c2.stats().hit_tokens == 64 and c2.stats().miss_tokens == 8  # read from the file
    assert np.array_equal(after, before)
    assert np.array_equal(after, model.session(KVCache(model, max_tokens=256)).prefill(ids + [5, 6]))
    for h in chain(ids, 16):  # the K/V of every block, bit for bit
        b, b2 = c.lookup(h), c2.lookup(h)
        assert np.array_equal(c.k[:, b], c2.k[:, b2]) and np.array_equal(c.v[:, b], c2.v[:, b2])
        c.release([b])
        c2.release([b2])
    c3 = KVCache(model, max_tokens=256, block_size=16)
    assert c3.load(tmp_path / "kv.bin") == 4
    assert c3.load(tmp_path / "kv.bin") == 0  # already there
    assert np.array_equal(model.session(c3).prefill(ids + [5, 6]), before)
    assert c3.stats().hit_tokens == 64


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
