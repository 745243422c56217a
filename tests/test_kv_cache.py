"""KVCache: block accounting, LRU eviction order, save/load with typed errors."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

from goinfer import CacheFileError, KVCache
from goinfer.gguf import GGUFFile
from goinfer.kv_cache import EXACT, block_hash, root_hash
from goinfer.memory import populate
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
        h = block_hash(h, ids[i * block_size : (i + 1) * block_size], EXACT)
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
    assert np.array_equal(
        after, model.session(KVCache(model, max_tokens=256)).prefill(ids + [5, 6])
    )
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
    cases = [
        raw[: len(raw) // 2],
        raw[:10],
        b"nonsense" * 10,
        raw[:-1],
        raw[:-5] + bytes([raw[-5] ^ 1]) + raw[-4:],
        raw + b"x",
    ]
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


# ============================================================================ storage types


@pytest.fixture(scope="module")
def model32(tiny):
    """qwen3-style tiny model: head_dim 32, so every storage type (q8_0 included) fits"""
    return Model(GGUFFile(tiny("qwen3", 3)[1]), threads=2, progress=False)


def _per_value_bytes(dtype):
    return {"f32": 4.0, "f16": 2.0, "q8_0": 34 / 32}[dtype]  # q8_0: 32 int8 + a float16 scale


@pytest.mark.parametrize("dtype", ["f16", "f32", "q8_0"])
def test_dtype_bytes_and_stats(model32, dtype):
    """bytes per token from the layout (independent formula), the arrays' real size, the
    default type f16 (half of f32), ValueError for an unknown type or a q8_0 head_dim that is
    not a multiple of 32."""
    cfg = model32.config
    c = KVCache(model32, max_tokens=64, block_size=16, dtype=dtype)
    want = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * _per_value_bytes(dtype)
    st = c.stats()
    assert st.dtype == dtype and st.bytes_per_token == want == c.bytes_per_token
    assert c.k.nbytes + c.v.nbytes == st.bytes_total == 4 * 16 * want
    assert KVCache(model32, max_tokens=64).dtype == "f16" == model32.kv_dtype


def test_dtype_errors(model, model32):
    with pytest.raises(ValueError):
        KVCache(model32, max_tokens=64, dtype="f8")
    with pytest.raises(ValueError):  # the tiny llama's head_dim is 16
        KVCache(model, max_tokens=64, dtype="q8_0")
    with pytest.raises(ValueError):
        Model(GGUFFile(model.path), threads=1, progress=False, kv_dtype="q8_0")
    with pytest.raises(ValueError):
        Model(GGUFFile(model.path), threads=1, progress=False, kv_dtype="bf16")


@pytest.mark.parametrize("dtype", ["f16", "f32", "q8_0"])
def test_dtype_save_load_fork_evict(model32, dtype, tmp_path):
    """Per storage type: a saved and reloaded cache (the class call takes the file's type)
    serves the prefix and gives the cold run's tokens; a fork copies its partial block on
    write (copy_block) and both continuations equal cold runs; eviction reuses blocks."""
    ids = ids_(40, 11)
    c = KVCache(model32, max_tokens=128, block_size=16, dtype=dtype)
    s = model32.session(c)
    s.prefill(ids)
    assert c.save(tmp_path / "kv.bin") == 2
    loaded = KVCache.load(model32, tmp_path / "kv.bin")
    assert loaded.dtype == dtype
    cold = model32.session(KVCache(model32, max_tokens=128, dtype=dtype))
    r = model32.session(loaded).generate(ids + [7], max_tokens=4)
    assert r.cached_tokens == 32 and r.tokens == cold.generate(ids + [7], max_tokens=4).tokens
    f = s.fork()  # 40 tokens: block 2 is partial and shared
    la, lb = s.decode(3), f.decode(4)
    for got, nxt in ((la, 3), (lb, 4)):
        ref = model32.session(KVCache(model32, max_tokens=128, dtype=dtype)).prefill(ids + [nxt])
        assert np.array_equal(got, ref)
    assert s.block_table[2] != f.block_table[2]
    s.reset()
    f.reset()
    small = KVCache(model32, max_tokens=64, block_size=16, dtype=dtype)  # 4 blocks
    model32.session(small).prefill(ids_(33, 1))
    model32.session(small).prefill(ids_(60, 2))
    assert small.stats().evictions > 0


def test_dtype_mismatch_and_version1_files(model32, tmp_path):
    """A file of another storage type raises CacheFileError (no conversion: a later layer's
    K/V depend on the attention over the earlier layers' stored values, so converted blocks
    would not be this cache's blocks) and changes nothing; a version 1 file (float32, written
    before storage types existed) still loads into an f32 cache."""
    import json
    import struct

    from goinfer import kv_cache as kvc

    ids = ids_(40, 12)
    c32 = KVCache(model32, max_tokens=128, block_size=16, dtype="f32")
    model32.session(c32).prefill(ids)
    c32.save(tmp_path / "f32.bin")
    target = KVCache(model32, max_tokens=128, block_size=16, dtype="f16")
    model32.session(target).prefill(ids_(20, 5))
    before, k_before = target.stats(), target.k.copy()
    with pytest.raises(CacheFileError, match="f32"):
        target.load(tmp_path / "f32.bin")
    assert target.stats() == before and np.array_equal(target.k, k_before)
    # the same payload under a version 1 header (dtype "float32")
    raw = (tmp_path / "f32.bin").read_bytes()
    n0 = len(kvc._MAGIC)
    _, hlen = struct.unpack("<IQ", raw[n0 : n0 + 12])
    header = json.loads(raw[n0 + 12 : n0 + 12 + hlen])
    header["dtype"] = "float32"
    hb = json.dumps(header).encode()
    v1 = kvc._MAGIC + struct.pack("<IQ", 1, len(hb)) + hb + raw[n0 + 12 + hlen :]
    (tmp_path / "v1.bin").write_bytes(v1)
    old = KVCache(model32, max_tokens=128, block_size=16, dtype="f32")
    assert old.load(tmp_path / "v1.bin") == 2
    r = model32.session(old).generate(ids + [9], max_tokens=3)
    cold = model32.session(KVCache(model32, max_tokens=128, dtype="f32")).generate(
        ids + [9], max_tokens=3
    )
    assert r.cached_tokens == 32 and r.tokens == cold.tokens
    with pytest.raises(CacheFileError):
        KVCache(model32, max_tokens=128, dtype="q8_0").load(tmp_path / "v1.bin")
    header["dtype"] = "float16"  # a version 1 file was always float32
    hb = json.dumps(header).encode()
    (tmp_path / "bad.bin").write_bytes(
        kvc._MAGIC + struct.pack("<IQ", 1, len(hb)) + hb + raw[n0 + 12 + hlen :]
    )
    with pytest.raises(CacheFileError):
        KVCache.load(model32, tmp_path / "bad.bin")


# ============================================================================ first touch


def _resident(addr: int, n: int) -> np.ndarray:
    """(pages,) bool: which whole pages of [addr, addr + n) are in memory (mincore(2))."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    page = mmap.PAGESIZE
    start, stop = -(-addr // page) * page, (addr + n) // page * page
    vec = np.zeros(max(0, stop - start) // page, np.uint8)
    assert libc.mincore(start, stop - start, vec.ctypes.data) == 0, ctypes.get_errno()
    return (vec & 1).astype(bool)


def _kernel_at_least(major, minor):
    import platform

    try:
        v = tuple(int(x) for x in platform.release().split("-")[0].split(".")[:2])
    except ValueError:
        return False
    return v >= (major, minor)


@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="mincore / MADV_POPULATE_WRITE: Linux"
)
def test_populate_faults_pages_in_and_keeps_their_contents():
    import mmap

    buf = mmap.mmap(-1, 16 << 20)  # fresh anonymous pages, 4 KB ones: not resident yet
    a = np.frombuffer(buf, np.uint8)
    a[::65536] = 7  # some pages written before
    before = _resident(a.ctypes.data, a.nbytes)
    assert before.mean() < 0.5
    ok = populate([(a.ctypes.data, a.nbytes)])
    assert ok == _kernel_at_least(5, 14)
    if ok:
        assert _resident(a.ctypes.data, a.nbytes).all()
    assert (a[::65536] == 7).all() and int(a.sum()) == 7 * len(a[::65536])


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or not _kernel_at_least(5, 14),
    reason="MADV_POPULATE_WRITE: Linux >= 5.14",
)
def test_kv_cache_faults_in_the_first_blocks_of_every_layer(tiny):
    """The blocks of the first PREFAULT_TOKENS tokens of each layer are resident once the
    background thread is done, the rest of the cache is not (it is touched as it fills).
    Checked in a fresh process: in a long-lived one the allocator may hand the cache memory
    that earlier work left resident."""
    import json
    import subprocess

    code = """
import json, sys
import numpy as np
from goinfer import Model
from goinfer.gguf import GGUFFile
from goinfer.kv_cache import PREFAULT_TOKENS, KVCache
from test_kv_cache import _resident
model = Model(GGUFFile(sys.argv[1]), threads=2, progress=False)
# > 32 MB per array: a fresh mapping (smaller ones may come from reused, resident heap)
c = KVCache(model, max_tokens=1 << 19, block_size=16)
c._populating.join()
nb = -(-PREFAULT_TOKENS // 16)
out = []
for a in (c.k, c.v):
    assert a.strides[0] >= 8 << 20 and a.nbytes > 32 << 20  # several 2 MB pages a layer
    for li in range(c.n_layers):
        base = a.ctypes.data + li * a.strides[0]
        first = _resident(base, nb * a.strides[1])
        # the middle of the layer: past the huge page of the first blocks, before the next
        middle = _resident(base + (4 << 20), a.strides[0] - (6 << 20))
        out.append([int(first.sum()), len(first), int(middle.sum())])
print(json.dumps({"layers": out, "zero": not c.k.any() and not c.v.any()}))
"""
    here = Path(__file__).resolve().parent
    path = os.pathsep.join(p for p in (str(here), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    r = subprocess.run(
        [sys.executable, "-c", code, str(tiny("llama", 3)[1])],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(res["layers"]) == 2 * 2 and res["zero"]  # k and v of 2 layers, still zeros
    for resident_first, pages_first, resident_middle in res["layers"]:
        assert resident_first == pages_first > 0 and resident_middle == 0


def _vm_flags(addr: int) -> set[str]:
    """The VmFlags of the mapping holding addr (/proc/self/smaps)."""
    hit = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                hit = lo <= addr < hi
            elif hit and head == "VmFlags:":
                return set(line.split()[1:])
    raise AssertionError(f"no mapping holds {addr:#x}")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="smaps, madvise: Linux")
def test_window_layers_get_small_pages_only():
    """A sliding-window layer's K/V (a few window slots, the lowest) is marked for small pages
    (MADV_NOHUGEPAGE: VmFlags "nh") before anything touches it, so its first write does not
    fault in 2 MB; a global layer's is left to the system (it fills from its start)."""
    import os
    from types import SimpleNamespace

    from goinfer.models.base import ModelConfig

    cfg = ModelConfig(
        "gemma3", 4, 64, 4, 1, 256, 128, 400, 8192, 1e-6, sliding_window=512,
        swa_layers=(True, False, True, True),
    )  # fmt: skip
    m = SimpleNamespace(config=cfg, fingerprint="window-pages", kv_dtype="f16")
    c = KVCache(m, block_size=16)  # 2 x 8192 tokens: 8 KB a block and layer, 8 MB a layer
    c._populating.join()
    assert c.window_layers == (0, 2, 3)
    thp = os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled")
    for a in (c.k, c.v):
        for li in range(c.n_layers):
            base = a.ctypes.data + li * a.strides[0]
            inside = [base + a.strides[0] // 2, base + a.strides[0] - 4096]  # whole pages
            for addr in inside:
                assert ("nh" in _vm_flags(addr)) == (thp and li != 1), (li, addr)
