"""KVCache: a paged pool of key/value blocks shared by the sessions of one model.

A session owns a block table (a list of block ids).  Full blocks are content-addressed by a
hash chain (parent hash, the block's tokens, the numerics mode that computed it, an optional
cache salt), shared by reference count, and kept after release until evicted (least recently
used first; a released chain is queued tail first, so tails go before heads).  A new prompt
reuses the longest chain of cached blocks; the caller always re-prefills at least one token.

Block states:
  in use   ref > 0                  (owned by one or more sessions)
  cached   ref == 0, hashed         (in the LRU, reusable by hash, evictable)
  free     ref == 0, not hashed     (on the free list)
A block is written only by a session that holds it alone (ref == 1) and while it is not
hashed; otherwise the session copies it first (copy on write).

Storage types (``dtype``): "f16" (default; half the bytes of float32), "f32", "q8_0" (int8 in
blocks of 32 values of one token with a float16 scale, about a quarter).  Keys and values are
rounded once when written (kernels.kv_write); the attention kernels read the stored type.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from goinfer.errors import CacheFileError, CacheFullError
from goinfer.memory import default_max_tokens, populate_async
from goinfer.recurrent import MAX_SNAPSHOTS, SNAPSHOT_EVERY, StateStore, states_path

EXACT = "exact"
FAST = "fast"
_ROOT = b"goinfer-kv-root"
PREFAULT_TOKENS = 256  # tokens of each layer faulted in at creation, in the background


def block_hash(parent: bytes, tokens, mode: str, salt: str | None = None) -> bytes:
    """Hash of a full block: its parent's hash, its tokens, the mode that computed it, a salt."""
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(mode.encode())
    if salt:
        h.update(b"\x00salt\x00" + salt.encode())
    h.update(np.asarray(tokens, dtype=np.int64).tobytes())
    return h.digest()


def root_hash(salt: str | None = None) -> bytes:
    return block_hash(_ROOT, (), "root", salt)


# ============================================================================ storage types

KV_DTYPES = ("f16", "f32", "q8_0")
DEFAULT_KV_DTYPE = "f16"
_NP_DTYPE = {"f32": np.float32, "f16": np.float16, "q8_0": np.int8}


def check_kv_dtype(dtype, head_dim: int | None = None) -> str:
    """The storage type name, or ValueError (q8_0 needs a head_dim that is a multiple of 32)."""
    if dtype not in KV_DTYPES:
        raise ValueError(f"KV cache dtype must be one of {', '.join(KV_DTYPES)}, got {dtype!r}")
    if dtype == "q8_0" and head_dim is not None and head_dim % 32 != 0:
        raise ValueError(f"a q8_0 KV cache quantizes blocks of 32 values along head_dim; this "
                         f"model's head_dim is {head_dim}: use f16 or f32")
    return dtype


def kv_shapes(dtype: str, n_blocks: int, n_kv: int, hd: int, bs: int):
    """(k shape, v shape, numpy dtype) of one layer's cache (src/kv_types.h):
    f32/f16 k (nb, n_kv, hd, bs), v (nb, n_kv, bs, hd); q8_0 int8 with the float16 scales in
    hd/16 extra rows: k (nb, n_kv, hd + hd/16, bs), v (nb, n_kv, bs, hd + hd/16)."""
    rows = hd + hd // 16 if dtype == "q8_0" else hd
    return (n_blocks, n_kv, rows, bs), (n_blocks, n_kv, bs, rows), _NP_DTYPE[dtype]


def kv_bytes_per_token(dtype: str, n_layers: int, n_kv: int, hd: int) -> int:
    """Bytes of K and V of one token over every layer."""
    k, _, npdt = kv_shapes(dtype, 1, n_kv, hd, 1)
    return 2 * n_layers * int(np.prod(k)) * np.dtype(npdt).itemsize


def _geometry_bytes(dtype: str, geom) -> int:
    return sum(kv_bytes_per_token(dtype, 1, n_kv, hd) for n_kv, hd in geom)


# ============================================================================ cache files

_MAGIC = b"GOINFERKV\x00"
_VERSION = 2  # 2: any storage type ("dtype" in the header); 1: float32 only
_FORMAT = "goinfer-kv-cache"
_MAX_HEADER = 1 << 30


class _hybridmethod:
    """A method that receives the class when called on the class, the instance otherwise."""

    def __init__(self, fn):
        self.fn = fn
        self.__doc__ = fn.__doc__

    def __get__(self, obj, cls):
        target = cls if obj is None else obj
        return lambda *a, **k: self.fn(target, *a, **k)


def _read_cache_file(path) -> tuple[dict, np.ndarray]:
    """Read and verify a saved cache: (header, payload (n_blocks, bytes per block) uint8).
    A version 1 file (float32 only) reads as dtype "f32"."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            head = f.read(len(_MAGIC) + 12)
            if len(head) < len(_MAGIC) + 12 or head[:len(_MAGIC)] != _MAGIC:
                raise CacheFileError(f"{path}: not a goinfer KV cache file")
            version, hlen = struct.unpack("<IQ", head[len(_MAGIC):])
            if version not in (1, _VERSION):
                raise CacheFileError(f"{path}: cache file version {version} (this goinfer reads "
                                     f"1 and {_VERSION})")
            if hlen > _MAX_HEADER:
                raise CacheFileError(f"{path}: header of {hlen} bytes is implausible")
            hb = f.read(hlen)
            if len(hb) != hlen:
                raise CacheFileError(f"{path}: truncated header")
            try:
                header = json.loads(hb)
                if version == 1:
                    if header.get("dtype") != "float32":
                        raise ValueError(f"version 1 dtype {header.get('dtype')!r}")
                    header["dtype"] = "f32"
                if header.get("dtype") not in KV_DTYPES:
                    raise ValueError(f"dtype {header.get('dtype')!r}")
                n = len(header["blocks"])
                if header.get("layers") is not None:  # per-layer geometry (Gemma 4)
                    per = int(header["block_size"]) * _geometry_bytes(
                        header["dtype"], [(int(a), int(b)) for a, b in header["layers"]])
                else:
                    per = int(header["block_size"]) * kv_bytes_per_token(
                        header["dtype"], int(header["n_layers"]), int(header["n_kv_heads"]),
                        int(header["head_dim"]))
                nbytes = int(header["payload_bytes"])
            except (ValueError, KeyError, TypeError) as e:
                raise CacheFileError(f"{path}: corrupt header ({e})") from None
            if header.get("format") != _FORMAT or nbytes != n * per:
                raise CacheFileError(f"{path}: inconsistent header")
            data = f.read(nbytes + 1)
    except OSError as e:
        raise CacheFileError(f"{path}: cannot read ({e})") from None
    if len(data) != nbytes:
        raise CacheFileError(f"{path}: payload is {len(data)} bytes, expected {nbytes} "
                             "(truncated or trailing data)")
    if hashlib.sha256(data).hexdigest() != header.get("payload_sha256"):
        raise CacheFileError(f"{path}: checksum mismatch (corrupt file)")
    return header, np.frombuffer(data, dtype=np.uint8).reshape(n, per)


@dataclass
class CacheStats:
    block_size: int
    blocks_total: int
    blocks_used: int  # referenced by a live session
    blocks_cached: int  # unreferenced, reusable by hash
    blocks_free: int
    hit_tokens: int  # prompt tokens served from cache
    miss_tokens: int  # prompt tokens that had to be prefilled
    evictions: int
    bytes_total: int
    bytes_per_block: int
    dtype: str  # storage type of keys and values: f16, f32, q8_0
    bytes_per_token: int  # K and V of one token, every layer

    def as_dict(self) -> dict:
        return dict(self.__dict__)


class KVCache:
    """A pool of KV blocks for one model.

    ``KVCache(model, max_tokens=8192, block_size=16, dtype=None)``, or ``max_bytes=`` for a
    memory budget.  dtype: "f16", "f32" or "q8_0" (None: the model's ``kv_dtype``, "f16" by
    default).  The default max_tokens holds 2 x the model's context length, or as many tokens
    as fit in half of the memory available when it is created if that is fewer
    (memory.default_max_tokens); pages are touched only as blocks fill, so an unused capacity
    costs address space, not memory.  Arrays per layer (see docs/design/kernels.md, ``kv_shapes``):
      k: (n_layers, n_blocks, n_kv_heads, head_dim, block_size) float16 / float32
      v: (n_layers, n_blocks, n_kv_heads, block_size, head_dim)
    (q8_0: int8 with head_dim/16 more rows holding the float16 scales).
    The layers are the ones that hold KV (the config's ``kv_geometry()``: all of them, a hybrid
    model's attention layers, Gemma 4's layers that do not reuse another layer's KV).  A model
    whose layers differ in (n_kv_heads, head_dim) (Gemma 4) gets a list of per-layer arrays
    instead: k[l] (n_blocks, n_kv_l, head_dim_l, block_size).
    """

    def __init__(self, model, max_tokens: int | None = None, block_size: int = 16,
                 max_bytes: int | None = None, dtype: str | None = None, *,
                 snapshot_every: int = SNAPSHOT_EVERY, max_snapshots: int = MAX_SNAPSHOTS):
        cfg = model.config
        if not isinstance(block_size, int) or block_size < 1 or block_size > 1024:
            raise ValueError(f"block_size must be an int in 1..1024, got {block_size!r}")
        if dtype is None:
            dtype = getattr(model, "kv_dtype", DEFAULT_KV_DTYPE)
        geom = cfg.kv_geometry()  # (n_kv_heads, head_dim) of each layer that holds KV
        self.dtype = check_kv_dtype(dtype)
        for hd in sorted({hd for _, hd in geom}):
            check_kv_dtype(dtype, hd)
        self.model_fingerprint = model.fingerprint
        self.block_size = block_size
        self.n_layers = n_layers = len(geom)
        self.n_kv_heads = cfg.n_kv_heads
        self.head_dim = cfg.head_dim
        self.layers = None if len(set(geom)) <= 1 else [list(p) for p in geom]  # per-layer
        self.bytes_per_token = _geometry_bytes(self.dtype, geom)
        self.bytes_per_block = self.bytes_per_token * block_size
        if max_tokens is not None and max_bytes is not None:
            raise ValueError("give max_tokens or max_bytes, not both")
        if max_bytes is not None:
            n_blocks = int(max_bytes) // self.bytes_per_block
        else:
            if max_tokens is None:  # 2 x context, within half the memory available now
                max_tokens = default_max_tokens(cfg.context_length, self.bytes_per_block // block_size)
            n_blocks = -(-int(max_tokens) // block_size)
        if n_blocks < 1:
            raise ValueError("the KV cache budget is smaller than one block "
                             f"({self.bytes_per_block} bytes, {block_size} tokens)")
        self.n_blocks = n_blocks
        if self.layers is None:
            nkv_hd = geom[0] if geom else (cfg.n_kv_heads, cfg.head_dim)
            kshape, vshape, npdt = kv_shapes(self.dtype, n_blocks, *nkv_hd, block_size)
            self.k = np.zeros((n_layers, *kshape), npdt)  # (n_layers, n_blocks, n_kv, hd, bs)
            self.v = np.zeros((n_layers, *vshape), npdt)  # (n_layers, n_blocks, n_kv, bs, hd)
            per_layer = [a[li] for a in (self.k, self.v) for li in range(n_layers)]
        else:  # one array per layer: k[l] (n_blocks, n_kv_l, hd_l, bs), v[l] (.., bs, hd_l)
            shapes = [kv_shapes(self.dtype, n_blocks, n_kv, hd, block_size) for n_kv, hd in geom]
            self.k = [np.zeros(ks, npdt) for ks, _, npdt in shapes]
            self.v = [np.zeros(vs, npdt) for _, vs, npdt in shapes]
            per_layer = self.k + self.v
        # fault in the blocks of the first PREFAULT_TOKENS tokens of every layer now, in the
        # background: blocks are handed out from 0 up, so these are the first prompt's
        # (goinfer/memory.py, "first touch"); the rest is touched only as it fills
        nb = min(n_blocks, -(-PREFAULT_TOKENS // block_size))
        self._populating = populate_async(
            [(a.ctypes.data, nb * a.strides[0]) for a in per_layer], keep_alive=(self.k, self.v))
        # hybrid models: recurrent-state snapshots every snapshot_every blocks (recurrent.py)
        spec = cfg.state_spec
        self.states = StateStore(spec, snapshot_every, max_snapshots) if spec is not None else None
        self._lock = threading.RLock()
        self._ref = np.zeros(n_blocks, np.int32)
        self._hash_of: dict[int, bytes] = {}
        self._block_of: dict[bytes, int] = {}
        self._meta: dict[int, tuple[bytes, tuple[int, ...], str]] = {}  # parent, tokens, mode
        self._lru: OrderedDict[int, None] = OrderedDict()  # cached blocks, least recent first
        self._free: list[int] = list(range(n_blocks - 1, -1, -1))  # pop() gives 0, 1, 2, ...
        self.hit_tokens = 0
        self.miss_tokens = 0
        self.evictions = 0

    # ------------------------------------------------------------------ allocation

    @property
    def max_tokens(self) -> int:
        return self.n_blocks * self.block_size

    def allocate(self) -> int:
        """A block for writing (ref = 1): a free one, else the least recently used cached one."""
        with self._lock:
            if self._free:
                b = self._free.pop()
            elif self._lru:
                b, _ = self._lru.popitem(last=False)
                self._unhash(b)
                self.evictions += 1
            else:
                raise CacheFullError(
                    f"KV cache full: all {self.n_blocks} blocks ({self.max_tokens} tokens) are held "
                    "by live sessions; close or reset sessions, or create a larger KVCache")
            self._ref[b] = 1
            return b

    def available_blocks(self) -> int:
        """Blocks that allocate() can hand out now (free + evictable)."""
        with self._lock:
            return len(self._free) + len(self._lru)

    def retain(self, blocks) -> None:
        with self._lock:
            for b in blocks:
                if self._ref[b] == 0:
                    self._lru.pop(b, None)
                self._ref[b] += 1

    def release(self, blocks) -> None:
        """Drop one reference to each block; the list is released tail first (tails evict first)."""
        with self._lock:
            for b in reversed(list(blocks)):
                if self._ref[b] <= 0:
                    raise RuntimeError(f"KV block {b} released more often than retained")
                self._ref[b] -= 1
                if self._ref[b] == 0:
                    if b in self._hash_of:
                        self._lru[b] = None
                        self._lru.move_to_end(b)
                    else:
                        self._free.append(b)

    def refcount(self, b: int) -> int:
        return int(self._ref[b])

    def is_hashed(self, b: int) -> bool:
        return b in self._hash_of

    def writable(self, b: int) -> bool:
        """May a session holding b write into it without copying?"""
        with self._lock:
            return self._ref[b] == 1 and b not in self._hash_of

    def copy_block(self, src: int, dst: int, n_tokens: int | None = None) -> None:
        """Copy the first n_tokens (default all) of block src to dst (q8_0: the whole block,
        since its key scales interleave the tokens' bytes; slots past n_tokens are unwritten
        for the reader either way)."""
        n = self.block_size if n_tokens is None or self.dtype == "q8_0" else n_tokens
        if self.layers is None:
            self.k[:, dst, :, :, :n] = self.k[:, src, :, :, :n]
            self.v[:, dst, :, :n, :] = self.v[:, src, :, :n, :]
            return
        for k, v in zip(self.k, self.v):
            k[dst, :, :, :n] = k[src, :, :, :n]
            v[dst, :, :n, :] = v[src, :, :n, :]

    def _block_bytes(self, b: int) -> tuple[bytes, bytes]:
        """Block b's K and V bytes as saved: every layer's, layer by layer."""
        if self.layers is None:
            return (np.ascontiguousarray(self.k[:, b]).tobytes(),
                    np.ascontiguousarray(self.v[:, b]).tobytes())
        return (b"".join(np.ascontiguousarray(k[b]).tobytes() for k in self.k),
                b"".join(np.ascontiguousarray(v[b]).tobytes() for v in self.v))

    def _set_block(self, b: int, kb: np.ndarray, vb: np.ndarray) -> None:
        """Write block b from its saved K and V bytes (uint8 arrays)."""
        if self.layers is None:
            self.k[:, b] = kb.view(self.k.dtype).reshape(self.k.shape[0], *self.k.shape[2:])
            self.v[:, b] = vb.view(self.v.dtype).reshape(self.v.shape[0], *self.v.shape[2:])
            return
        for arrs, src in ((self.k, kb), (self.v, vb)):
            o = 0
            for a in arrs:
                n = a[b].nbytes
                a[b] = src[o:o + n].view(a.dtype).reshape(a.shape[1:])
                o += n

    # ------------------------------------------------------------------ prefix index

    def _unhash(self, b: int) -> None:
        h = self._hash_of.pop(b, None)
        self._meta.pop(b, None)
        if h is not None and self._block_of.get(h) == b:
            del self._block_of[h]

    def commit(self, b: int, h: bytes, parent: bytes, tokens, mode: str) -> None:
        """Register a block the session just filled under its chain hash."""
        with self._lock:
            if b in self._hash_of or h in self._block_of:
                return  # already known (another session computed the same block)
            self._hash_of[b] = h
            self._block_of[h] = b
            self._meta[b] = (parent, tuple(int(t) for t in tokens), mode)

    def lookup(self, h: bytes) -> int | None:
        """The cached or in-use block with chain hash h, retained for the caller, or None."""
        with self._lock:
            b = self._block_of.get(h)
            if b is None:
                return None
            if self._ref[b] == 0:
                self._lru.pop(b, None)
            self._ref[b] += 1
            return b

    def count_hits(self, hit: int, miss: int) -> None:
        with self._lock:
            self.hit_tokens += hit
            self.miss_tokens += miss

    # ------------------------------------------------------------------ save and load

    def save(self, path) -> int:
        """Write every hashed block (cached or in use) to path, atomically.  Returns the count.

        The file holds the model's fingerprint, the geometry, the storage type, each block's
        chain hash, parent hash, tokens and numerics mode, a sha256 of the payload, then the
        K/V blocks as stored."""
        path = Path(path)
        with self._lock:
            blocks = self._save_order()
            header = {
                "format": _FORMAT, "fingerprint": self.model_fingerprint,
                "block_size": self.block_size, "n_layers": self.n_layers,
                "n_kv_heads": self.n_kv_heads, "head_dim": self.head_dim, "dtype": self.dtype,
                "layers": self.layers,
                "blocks": [{"hash": self._hash_of[b].hex(), "parent": self._meta[b][0].hex(),
                            "mode": self._meta[b][2], "tokens": list(self._meta[b][1])}
                           for b in blocks],
            }
            sha = hashlib.sha256()
            fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent or ".")
            try:
                with os.fdopen(fd, "wb") as f:
                    # payload first into the temp file after a placeholder header: we need its hash
                    for b in blocks:
                        for buf in self._block_bytes(b):
                            sha.update(buf)
                    header["payload_sha256"] = sha.hexdigest()
                    header["payload_bytes"] = len(blocks) * self.bytes_per_block
                    hb = json.dumps(header).encode()
                    f.write(_MAGIC + struct.pack("<IQ", _VERSION, len(hb)) + hb)
                    for b in blocks:
                        for buf in self._block_bytes(b):
                            f.write(buf)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
                if self.states is not None:  # hybrid models: the state snapshots beside it
                    self.states.save(states_path(path), self.model_fingerprint)
            except BaseException:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
                raise
            return len(blocks)

    def _save_order(self) -> list[int]:
        """Hashed blocks, parents before children (so a partial load keeps whole chains)."""
        by_hash = {h: b for b, h in self._hash_of.items()}
        depth: dict[int, int] = {}

        def d(b):
            if b not in depth:
                depth[b] = 0  # guard against cycles
                parent = by_hash.get(self._meta[b][0])
                depth[b] = 0 if parent is None else d(parent) + 1
            return depth[b]

        return sorted(self._hash_of, key=lambda b: (d(b), b))

    @_hybridmethod
    def load(self_or_cls, *args, **kwargs):
        """``KVCache.load(model, path)`` makes a cache from a file; ``cache.load(path)`` adds
        the file's blocks to this cache.  Returns the cache (class call) or the number of blocks
        loaded (instance call).  A file from another model, of another storage type than this
        cache (the class call takes the file's), a truncated or corrupt file raises
        CacheFileError and leaves the cache as it was.  Version 1 files (float32) still load."""
        if isinstance(self_or_cls, type):
            model, path = args[0], args[1]
            header, payload = _read_cache_file(path)
            n = len(header["blocks"])
            cache = self_or_cls(model, block_size=int(header["block_size"]), dtype=header["dtype"],
                                max_tokens=kwargs.pop("max_tokens", None) or max(
                                    (n + 1) * int(header["block_size"]), 2 * model.config.context_length))
            cache._insert(header, payload)
            if cache.states is not None:
                cache.states.load(states_path(path), cache.model_fingerprint)
            return cache
        header, payload = _read_cache_file(args[0])
        if self_or_cls.states is not None:  # check the snapshots file before adding anything
            snaps = self_or_cls.states.read(states_path(args[0]), self_or_cls.model_fingerprint)
        n = self_or_cls._insert(header, payload)
        if self_or_cls.states is not None:
            self_or_cls.states.add(snaps)
        return n

    def _insert(self, header: dict, payload: np.ndarray) -> int:
        want = dict(fingerprint=self.model_fingerprint, block_size=self.block_size,
                    n_layers=self.n_layers, n_kv_heads=self.n_kv_heads, head_dim=self.head_dim,
                    layers=self.layers)
        for k, v in want.items():
            if header.get(k) != v:
                raise CacheFileError(f"cache file {k} {header.get(k)!r} does not match this cache "
                                     f"({v!r}): it was saved for another model or geometry")
        if header["dtype"] != self.dtype:
            # not converted: a later layer's K/V depend on the attention over the earlier
            # layers' stored values, so converted blocks would not be this cache's blocks
            raise CacheFileError(f"cache file holds {header['dtype']} keys and values, this cache "
                                 f"stores {self.dtype}: load it with KVCache.load(model, path) "
                                 f"(a cache of the file's type) or recompute the prefix")
        nk = payload.shape[1] // 2  # bytes of K per block
        loaded = 0
        with self._lock:
            for i, meta in enumerate(header["blocks"]):
                h = bytes.fromhex(meta["hash"])
                if h in self._block_of:
                    continue
                if not self._free and not self._lru:
                    break  # full of blocks in use: keep what fitted (heads first)
                b = self.allocate()
                row = payload[i]
                self._set_block(b, row[:nk], row[nk:])
                self._ref[b] = 0
                self._hash_of[b] = h
                self._block_of[h] = b
                self._meta[b] = (bytes.fromhex(meta["parent"]), tuple(meta["tokens"]), meta["mode"])
                self._lru[b] = None
                loaded += 1
        return loaded

    # ------------------------------------------------------------------ introspection

    def stats(self) -> CacheStats:
        with self._lock:
            used = int((self._ref > 0).sum())
            return CacheStats(
                block_size=self.block_size, blocks_total=self.n_blocks, blocks_used=used,
                blocks_cached=len(self._lru), blocks_free=len(self._free),
                hit_tokens=self.hit_tokens, miss_tokens=self.miss_tokens,
                evictions=self.evictions, bytes_total=self.n_blocks * self.bytes_per_block,
                bytes_per_block=self.bytes_per_block, dtype=self.dtype,
                bytes_per_token=self.bytes_per_token)

    def clear(self) -> None:
        """Forget every cached (unreferenced) block; blocks in use are untouched."""
        with self._lock:
            while self._lru:
                b, _ = self._lru.popitem(last=False)
                self._unhash(b)
                self._free.append(b)

    def __repr__(self) -> str:
        s = self.stats()
        return (f"KVCache({s.blocks_total} blocks x {s.block_size} tokens, {s.dtype}, used "
                f"{s.blocks_used}, cached {s.blocks_cached}, free {s.blocks_free}, "
                f"{s.bytes_total / 2**20:.0f} MiB, {s.bytes_per_token} bytes/token)")
