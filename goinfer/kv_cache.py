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

Sliding-window layers (Gemma 3 and 4's local layers, gpt-oss's even layers, a Mistral file with
a window): a query at position p reads only keys p - window + 1 .. p there, so those layers'
K/V of a block is needed only while the block is within the window of a position still to be
computed, or of a point where a prompt may resume.  They live in a pool of their own, the
window slots: a block gets a slot when it is first written and loses it when a session's
window moves past it and nothing else holds it (``retain_window`` / ``release_window``: the
sessions' windows, the kept points); what a released session still held stays with its cached
blocks until they are evicted.  The other layers' K/V stays with the block as before.  A
kept point (a block boundary, keyed by the chain hash of the block before it) holds the window
KV of the blocks its next position reads; a session can resume only where every such block still has it
(goinfer/blocks.py says which points are kept; a resume elsewhere recomputes from the nearest
earlier one).
"""

from __future__ import annotations

import hashlib
import heapq
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
from goinfer.memory import default_max_tokens, no_huge_pages, populate_async
from goinfer.recurrent import MAX_SNAPSHOTS, SNAPSHOT_EVERY, StateStore, states_path

EXACT = "exact"
FAST = "fast"
_ROOT = b"goinfer-kv-root"
PREFAULT_TOKENS = 256  # tokens of each layer faulted in at creation, in the background
WINDOW_POINT_SPACING = 8  # windows between the points a session keeps as it computes


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
        raise ValueError(
            f"a q8_0 KV cache quantizes blocks of 32 values along head_dim; this "
            f"model's head_dim is {head_dim}: use f16 or f32"
        )
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
_VERSION_WINDOWS = 3  # 3: some blocks are saved without their sliding-window layers' K/V
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


def _file_geometry(header: dict) -> list[tuple[int, int]]:
    """(n_kv_heads, head_dim) of each cache layer a file's header describes."""
    if header.get("layers") is not None:  # per-layer geometry (Gemma 4)
        return [(int(a), int(b)) for a, b in header["layers"]]
    return [(int(header["n_kv_heads"]), int(header["head_dim"]))] * int(header["n_layers"])


def _read_cache_file(path) -> tuple[dict, np.ndarray, list[int]]:
    """Read and verify a saved cache: (header, payload (bytes,) uint8, each block's offset in
    it; one more offset: the end).  A block's record is its K then its V, each every layer's
    in layer order, without the sliding-window layers ("window_layers") when its entry says
    "window": false (version 3).  A version 1 file (float32 only) reads as dtype "f32"."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            head = f.read(len(_MAGIC) + 12)
            if len(head) < len(_MAGIC) + 12 or head[: len(_MAGIC)] != _MAGIC:
                raise CacheFileError(f"{path}: not a goinfer KV cache file")
            version, hlen = struct.unpack("<IQ", head[len(_MAGIC) :])
            if version not in (1, _VERSION, _VERSION_WINDOWS):
                raise CacheFileError(
                    f"{path}: cache file version {version} (this goinfer reads "
                    f"1 to {_VERSION_WINDOWS})"
                )
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
                geom, bs = _file_geometry(header), int(header["block_size"])
                win = set(header.get("window_layers") or ())
                if not win <= set(range(len(geom))):
                    raise ValueError("window_layers out of range")
                full = bs * _geometry_bytes(header["dtype"], geom)
                short = bs * _geometry_bytes(
                    header["dtype"], [g for i, g in enumerate(geom) if i not in win]
                )
                offsets = [0]
                for meta in header["blocks"]:
                    offsets.append(offsets[-1] + (full if meta.get("window", True) else short))
                nbytes = int(header["payload_bytes"])
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                raise CacheFileError(f"{path}: corrupt header ({e})") from None
            if header.get("format") != _FORMAT or nbytes != offsets[-1]:
                raise CacheFileError(f"{path}: inconsistent header")
            data = f.read(nbytes + 1)
    except OSError as e:
        raise CacheFileError(f"{path}: cannot read ({e})") from None
    if len(data) != nbytes:
        raise CacheFileError(
            f"{path}: payload is {len(data)} bytes, expected {nbytes} (truncated or trailing data)"
        )
    if hashlib.sha256(data).hexdigest() != header.get("payload_sha256"):
        raise CacheFileError(f"{path}: checksum mismatch (corrupt file)")
    return header, np.frombuffer(data, dtype=np.uint8), offsets


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
    bytes_held: int  # K and V held now: blocks in use or cached, sliding-window layers' where kept
    window: int  # sliding window of the trimmed layers in tokens (0: every layer keeps all)
    window_layers: int  # cache layers whose K/V is kept only within the window
    blocks_windowed: int  # blocks holding their sliding-window layers' K/V (window slots in use)
    window_points: int  # kept points (where a prompt can resume, with the window KV before it)

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

    Sliding-window layers (the config's ``kv_windows()``) are indexed by window slot instead
    of block (``window_table``): a block's slot is kept while a session's window or a kept
    point holds it (module docstring).  Slots are handed out lowest first, so those layers'
    resident memory follows the window KV held, not the tokens.  trim_windows=False keeps
    every block's window KV (slot = block, as for any other layer).  window_point_every:
    blocks between the points a session keeps as it computes (None: 8 windows' worth; 0:
    none); the points' window KV is bounded by an eighth of the slots, least recently used
    dropped first.
    """

    def __init__(
        self,
        model,
        max_tokens: int | None = None,
        block_size: int = 16,
        max_bytes: int | None = None,
        dtype: str | None = None,
        *,
        snapshot_every: int = SNAPSHOT_EVERY,
        max_snapshots: int = MAX_SNAPSHOTS,
        trim_windows: bool = True,
        window_point_every: int | None = None,
    ):
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
        # sliding-window layers: their K/V by window slot, kept only where needed
        windows = cfg.kv_windows() if trim_windows else ()
        self.window_layers = tuple(j for j, w in enumerate(windows) if w > 0)
        self.window = max((windows[j] for j in self.window_layers), default=0)
        self.bytes_per_block_window = block_size * _geometry_bytes(
            self.dtype, [geom[j] for j in self.window_layers]
        )
        # blocks a point at a block boundary needs: those holding its window's earlier keys
        self.window_span = -(-(self.window - 1) // block_size) if self.window else 0
        if window_point_every is None:
            window_point_every = WINDOW_POINT_SPACING * self.window_span
        if not isinstance(window_point_every, int) or window_point_every < 0:
            raise ValueError(f"window_point_every must be an int >= 0, got {window_point_every!r}")
        self.window_point_every = window_point_every
        if max_tokens is not None and max_bytes is not None:
            raise ValueError("give max_tokens or max_bytes, not both")
        if max_bytes is not None:
            n_blocks = int(max_bytes) // self.bytes_per_block
        else:
            if max_tokens is None:  # 2 x context, within half the memory available now
                max_tokens = default_max_tokens(
                    cfg.context_length, self.bytes_per_block // block_size
                )
            n_blocks = -(-int(max_tokens) // block_size)
        if n_blocks < 1:
            raise ValueError(
                "the KV cache budget is smaller than one block "
                f"({self.bytes_per_block} bytes, {block_size} tokens)"
            )
        self.n_blocks = n_blocks
        self.k: np.ndarray | list[np.ndarray]  # one array of every layer, or one per layer
        self.v: np.ndarray | list[np.ndarray]
        per_layer: list[np.ndarray]
        if self.layers is None:
            n_kv, hd = geom[0] if geom else (cfg.n_kv_heads, cfg.head_dim)
            kshape, vshape, npdt = kv_shapes(self.dtype, n_blocks, n_kv, hd, block_size)
            self.k = np.zeros((n_layers, *kshape), npdt)  # (n_layers, n_blocks, n_kv, hd, bs)
            self.v = np.zeros((n_layers, *vshape), npdt)  # (n_layers, n_blocks, n_kv, bs, hd)
            per_layer = [a[li] for a in (self.k, self.v) for li in range(n_layers)]
        else:  # one array per layer: k[l] (n_blocks, n_kv_l, hd_l, bs), v[l] (.., bs, hd_l)
            shapes = [kv_shapes(self.dtype, n_blocks, n_kv, hd, block_size) for n_kv, hd in geom]
            self.k = [np.zeros(ks, npdt) for ks, _, npdt in shapes]
            self.v = [np.zeros(vs, npdt) for _, vs, npdt in shapes]
            per_layer = self.k + self.v
        # the sliding-window layers' K/V is a few window slots per layer (the lowest): small
        # pages there, or each layer's first write faults in 2 MB (memory.no_huge_pages)
        no_huge_pages(
            [
                (a.ctypes.data, a.nbytes)
                for j in self.window_layers
                for a in (per_layer[j], per_layer[n_layers + j])
            ]
        )
        # fault in the blocks of the first PREFAULT_TOKENS tokens of every layer now, in the
        # background: blocks are handed out from 0 up, so these are the first prompt's
        # (goinfer/memory.py, "first touch"); the rest is touched only as it fills
        nb = min(n_blocks, -(-PREFAULT_TOKENS // block_size))
        self._populating = populate_async(
            [(a.ctypes.data, nb * a.strides[0]) for a in per_layer], keep_alive=(self.k, self.v)
        )
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
        # window slots (used when self.window > 0)
        self._wslot = np.full(n_blocks, -1, np.int32)  # (n_blocks,) each block's slot, -1: none
        self._wref = np.zeros(n_blocks, np.int32)  # (n_blocks,) holders of its window KV
        self._wfree: list[int] = list(range(n_blocks))  # free slots, a heap (lowest first)
        self._points: OrderedDict[bytes, tuple[int, ...]] = OrderedDict()  # kept points, LRU
        self._points_of: dict[int, set[bytes]] = {}  # block -> the points holding it
        self._point_blocks = 0
        self.max_point_blocks = max(n_blocks // 8, self.window_span)

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
                    "by live sessions; close or reset sessions, or create a larger KVCache"
                )
            self._wref[b] = 0  # a fresh block: no window KV until it is written
            self._drop_window(b)
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
                        self._to_free(b)

    def refcount(self, b: int) -> int:
        return int(self._ref[b])

    def is_hashed(self, b: int) -> bool:
        return b in self._hash_of

    def writable(self, b: int) -> bool:
        """May a session holding b write into it without copying?"""
        with self._lock:
            return self._ref[b] == 1 and b not in self._hash_of

    def _to_free(self, b: int) -> None:
        """An unhashed block nobody holds goes to the free list (with its window slot)."""
        self._wref[b] = 0
        self._drop_window(b)
        self._free.append(b)

    def copy_block(self, src: int, dst: int, n_tokens: int | None = None) -> None:
        """Copy the first n_tokens (default all) of block src to dst (q8_0: the whole block,
        since its key scales interleave the tokens' bytes; slots past n_tokens are unwritten
        for the reader either way).  dst gets a window slot if src has one."""
        n = self.block_size if n_tokens is None or self.dtype == "q8_0" else n_tokens
        with self._lock:
            has_window = self._wslot[src] >= 0
            if has_window and self._wslot[dst] < 0:
                self._wslot[dst] = heapq.heappop(self._wfree)
        for li, s, d in self._layer_rows(src, has_window, dst):
            self.k[li][d, :, :, :n] = self.k[li][s, :, :, :n]
            self.v[li][d, :, :n, :] = self.v[li][s, :, :n, :]

    def _layer_rows(self, b: int, window: bool, other: int | None = None):
        """(layer, row of block b[, row of block other]) of every layer whose K/V the block
        holds: the block's own row, a sliding-window layer's window slot (skipped unless
        window)."""
        wl = set(self.window_layers)
        for li in range(self.n_layers):
            if li not in wl:
                yield (li, b) if other is None else (li, b, other)
            elif window:
                rows = (
                    (int(self._wslot[b]),)
                    if other is None
                    else (int(self._wslot[b]), int(self._wslot[other]))
                )
                yield (li, *rows)

    def _block_bytes(self, b: int, window: bool = True) -> tuple[bytes, bytes]:
        """Block b's K and V bytes as saved: every layer's, layer by layer (without the
        sliding-window layers unless window)."""
        rows = list(self._layer_rows(b, window))
        return (
            b"".join(np.ascontiguousarray(self.k[li][r]).tobytes() for li, r in rows),
            b"".join(np.ascontiguousarray(self.v[li][r]).tobytes() for li, r in rows),
        )

    def _set_block(self, b: int, kb: np.ndarray, vb: np.ndarray, window: bool = True) -> None:
        """Write block b from its saved K and V bytes (uint8 arrays; the window layers' only if
        window, into its window slot)."""
        for arrs, src in ((self.k, kb), (self.v, vb)):
            o = 0
            for li, r in self._layer_rows(b, window):
                a = arrs[li]
                n = a[r].nbytes
                a[r] = src[o : o + n].view(a.dtype).reshape(a.shape[1:])
                o += n

    # ------------------------------------------------------------------ sliding-window layers

    def window_table(self, block_table: np.ndarray, pos0: int, n: int) -> np.ndarray:
        """The window slots of a sequence's blocks (block_table (n_blocks_seq,) int32) for a
        forward step over positions pos0 .. pos0 + n - 1: a block written there gets a slot
        now; a block read there (within the window before pos0) must have one (RuntimeError
        if its window KV was released: a caller's bug, never a wrong result); every other
        entry is 0 (never read).  Without trimmed windows: block_table itself."""
        if not self.window:
            return block_table
        bs = self.block_size
        first, w0, last = max(0, pos0 - self.window + 1) // bs, pos0 // bs, (pos0 + n - 1) // bs
        ids = np.asarray(block_table[: last + 1], dtype=np.int64)
        if len(ids) <= last or ids.min() < 0 or ids.max() >= self.n_blocks:
            raise ValueError(
                f"block ids must lie in [0, {self.n_blocks}) for positions up to "
                f"{pos0 + n - 1}, got {ids.tolist()[:8]}..."
            )
        out = np.zeros(len(block_table), np.int32)  # (n_blocks_seq,)
        with self._lock:
            for b in ids[w0:]:
                if self._wslot[b] < 0:
                    self._wslot[b] = heapq.heappop(self._wfree)
            out[: last + 1] = self._wslot[ids]
        gone = np.flatnonzero(out[first:w0] < 0)
        if len(gone):
            j = first + int(gone[0])
            raise RuntimeError(
                f"the sliding-window KV of block {j} (tokens {j * bs}..{j * bs + bs - 1}) "
                f"was released, but position {pos0} reads it"
            )
        out[out < 0] = 0
        return out

    def retain_window(self, blocks) -> None:
        """Hold the window KV of each block (a session's window, a kept point)."""
        if self.window:
            with self._lock:
                for b in blocks:
                    self._wref[b] += 1

    def release_window(self, blocks, keep: bool = False) -> None:
        """Drop one hold on each block's window KV; a block nobody holds loses it (its slot
        goes back to the pool), unless keep: then it stays with the block while the block is
        cached, for whoever resumes there (a released session's last blocks)."""
        if not self.window:
            return
        with self._lock:
            for b in blocks:
                if self._wref[b] <= 0:
                    raise RuntimeError(f"window KV of block {b} released more often than retained")
                self._wref[b] -= 1
                if self._wref[b] == 0 and not keep:
                    self._drop_window(b)

    def _drop_window(self, b: int) -> None:
        s = int(self._wslot[b])
        if s >= 0:
            heapq.heappush(self._wfree, s)
            self._wslot[b] = -1

    def window_slot(self, b: int) -> int:
        """Block b's window slot (the row of the sliding-window layers' arrays holding its K/V),
        -1 if it has none; b itself when no window is trimmed."""
        return int(self._wslot[b]) if self.window else b

    def last_without_window(self, blocks) -> int:
        """The index in blocks of the last one without its window KV, or -1 (all have it, or
        no layer is trimmed)."""
        if not self.window or not len(blocks):
            return -1
        with self._lock:
            gone = np.flatnonzero(self._wslot[np.asarray(blocks, dtype=np.int64)] < 0)
        return int(gone[-1]) if len(gone) else -1

    def keep_point(self, hashes, blocks) -> bool:
        """Keep the window KV of blocks (the blocks before a block boundary that its next
        position reads, in chain order; hashes: their chain hashes) as a point, keyed by the
        last hash.  False when it cannot: a block is not the cached one for its hash, or has
        lost its window KV.  Points past an eighth of the slots are dropped least recently
        used first."""
        if not self.window or not len(blocks):
            return False
        with self._lock:
            key = hashes[-1]
            if key in self._points:
                self._points.move_to_end(key)
                return True
            if any(
                self._block_of.get(h) != b or self._wslot[b] < 0 for h, b in zip(hashes, blocks)
            ):
                return False
            self._points[key] = tuple(int(b) for b in blocks)
            self._point_blocks += len(blocks)
            for b in blocks:
                self._wref[b] += 1
                self._points_of.setdefault(int(b), set()).add(key)
            while self._point_blocks > self.max_point_blocks and len(self._points) > 1:
                self._drop_point(next(iter(self._points)))
            return True

    def _drop_point(self, key: bytes) -> None:
        blocks = self._points.pop(key)
        self._point_blocks -= len(blocks)
        for b in blocks:
            keys = self._points_of.get(b)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._points_of[b]
        self.release_window(blocks)

    # ------------------------------------------------------------------ prefix index

    def _unhash(self, b: int) -> None:
        """Forget block b's hash, and the kept points that hold it."""
        for key in list(self._points_of.get(b, ())):
            self._drop_point(key)
        h = self._hash_of.pop(b, None)
        self._meta.pop(b, None)
        if h is not None and self._block_of.get(h) == b:
            del self._block_of[h]

    def commit(self, b: int, h: bytes, parent: bytes, tokens, mode: str) -> None:
        """Register a block the session just filled under its chain hash.  A block already
        known under h stays, unless it lost its window KV and b has it: then b replaces it
        (both hold the same bits; the old one stays with the sessions holding it, unhashed)."""
        with self._lock:
            if b in self._hash_of:
                return
            old = self._block_of.get(h)
            if old is not None:
                if not (self.window and self._wslot[old] < 0 <= self._wslot[b]):
                    return  # already known (another session computed the same block)
                self._unhash(old)
                if self._ref[old] == 0:
                    self._lru.pop(old, None)
                    self._to_free(old)
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
            # sliding-window layers: a block without its window KV is saved without them
            win = [not self.window or self._wslot[b] >= 0 for b in blocks]
            header = {
                "format": _FORMAT,
                "fingerprint": self.model_fingerprint,
                "block_size": self.block_size,
                "n_layers": self.n_layers,
                "n_kv_heads": self.n_kv_heads,
                "head_dim": self.head_dim,
                "dtype": self.dtype,
                "layers": self.layers,
                "blocks": [
                    {
                        "hash": self._hash_of[b].hex(),
                        "parent": self._meta[b][0].hex(),
                        "mode": self._meta[b][2],
                        "tokens": list(self._meta[b][1]),
                        **({} if w else {"window": False}),
                    }
                    for b, w in zip(blocks, win)
                ],
            }
            version = _VERSION if all(win) else _VERSION_WINDOWS
            if not all(win):
                header["window_layers"] = list(self.window_layers)
            if self._points:  # kept points, as the chain hashes of their blocks
                header["points"] = [
                    [self._hash_of[b].hex() for b in span] for span in self._points.values()
                ]
            sha = hashlib.sha256()
            fd, tmp = tempfile.mkstemp(
                prefix=path.name + ".", suffix=".tmp", dir=path.parent or "."
            )
            try:
                with os.fdopen(fd, "wb") as f:
                    # payload first into the temp file after a placeholder header: we need its hash
                    nbytes = 0
                    for b, w in zip(blocks, win):
                        for buf in self._block_bytes(b, w):
                            sha.update(buf)
                            nbytes += len(buf)
                    header["payload_sha256"] = sha.hexdigest()
                    header["payload_bytes"] = nbytes
                    hb = json.dumps(header).encode()
                    f.write(_MAGIC + struct.pack("<IQ", version, len(hb)) + hb)
                    for b, w in zip(blocks, win):
                        for buf in self._block_bytes(b, w):
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
            header, payload, offsets = _read_cache_file(path)
            n = len(header["blocks"])
            cache = self_or_cls(
                model,
                block_size=int(header["block_size"]),
                dtype=header["dtype"],
                max_tokens=kwargs.pop("max_tokens", None)
                or max((n + 1) * int(header["block_size"]), 2 * model.config.context_length),
                **kwargs,
            )
            cache._insert(header, payload, offsets)
            if cache.states is not None:
                cache.states.load(states_path(path), cache.model_fingerprint)
            return cache
        header, payload, offsets = _read_cache_file(args[0])
        if self_or_cls.states is not None:  # check the snapshots file before adding anything
            snaps = self_or_cls.states.read(states_path(args[0]), self_or_cls.model_fingerprint)
        n = self_or_cls._insert(header, payload, offsets)
        if self_or_cls.states is not None:
            self_or_cls.states.add(snaps)
        return n

    def _insert(self, header: dict, payload: np.ndarray, offsets: list[int]) -> int:
        want = dict(
            fingerprint=self.model_fingerprint,
            block_size=self.block_size,
            n_layers=self.n_layers,
            n_kv_heads=self.n_kv_heads,
            head_dim=self.head_dim,
            layers=self.layers,
        )
        for k, v in want.items():
            if header.get(k) != v:
                raise CacheFileError(
                    f"cache file {k} {header.get(k)!r} does not match this cache "
                    f"({v!r}): it was saved for another model or geometry"
                )
        if header["dtype"] != self.dtype:
            # not converted: a later layer's K/V depend on the attention over the earlier
            # layers' stored values, so converted blocks would not be this cache's blocks
            raise CacheFileError(
                f"cache file holds {header['dtype']} keys and values, this cache "
                f"stores {self.dtype}: load it with KVCache.load(model, path) "
                f"(a cache of the file's type) or recompute the prefix"
            )
        saved_win = header.get("window_layers")
        if saved_win is not None and self.window and tuple(saved_win) != self.window_layers:
            raise CacheFileError(
                f"cache file trims the sliding window of layers {saved_win}, this "
                f"cache of layers {list(self.window_layers)}"
            )
        loaded = 0
        with self._lock:
            for i, meta in enumerate(header["blocks"]):
                h = bytes.fromhex(meta["hash"])
                window = meta.get("window", True)
                if h in self._block_of or (not window and not self.window):
                    continue  # known, or without window KV that this cache keeps for every block
                if not self._free and not self._lru:
                    break  # full of blocks in use: keep what fitted (heads first)
                b = self.allocate()
                row = payload[offsets[i] : offsets[i + 1]]
                if window and self.window:
                    self._wslot[b] = heapq.heappop(self._wfree)
                self._set_block(b, row[: len(row) // 2], row[len(row) // 2 :], window)
                self._ref[b] = 0
                self._hash_of[b] = h
                self._block_of[h] = b
                self._meta[b] = (bytes.fromhex(meta["parent"]), tuple(meta["tokens"]), meta["mode"])
                self._lru[b] = None
                loaded += 1
            for span in header.get("points") or ():  # the kept points whose blocks are here
                hashes = [bytes.fromhex(x) for x in span]
                blocks = [self._block_of.get(x) for x in hashes]
                if None not in blocks:
                    self.keep_point(hashes, blocks)
        return loaded

    # ------------------------------------------------------------------ introspection

    def stats(self) -> CacheStats:
        with self._lock:
            used = int((self._ref > 0).sum())
            held = used + len(self._lru)
            windowed = int((self._wslot >= 0).sum()) if self.window else held
            per_window = self.bytes_per_block_window if self.window else 0
            return CacheStats(
                block_size=self.block_size,
                blocks_total=self.n_blocks,
                blocks_used=used,
                blocks_cached=len(self._lru),
                blocks_free=len(self._free),
                hit_tokens=self.hit_tokens,
                miss_tokens=self.miss_tokens,
                evictions=self.evictions,
                bytes_total=self.n_blocks * self.bytes_per_block,
                bytes_per_block=self.bytes_per_block,
                dtype=self.dtype,
                bytes_per_token=self.bytes_per_token,
                bytes_held=held * (self.bytes_per_block - per_window) + windowed * per_window,
                window=self.window,
                window_layers=len(self.window_layers),
                blocks_windowed=windowed,
                window_points=len(self._points),
            )

    def clear(self) -> None:
        """Forget every cached (unreferenced) block and every kept point; blocks in use are
        untouched."""
        with self._lock:
            for key in list(self._points):
                self._drop_point(key)
            while self._lru:
                b, _ = self._lru.popitem(last=False)
                self._unhash(b)
                self._to_free(b)

    def __repr__(self) -> str:
        s = self.stats()
        win = f", {s.window_layers} layers keep a {s.window}-token window" if s.window else ""
        return (
            f"KVCache({s.blocks_total} blocks x {s.block_size} tokens, {s.dtype}, used "
            f"{s.blocks_used}, cached {s.blocks_cached}, free {s.blocks_free}, "
            f"{s.bytes_total / 2**20:.0f} MiB, {s.bytes_per_token} bytes/token{win}, held "
            f"{s.bytes_held / 2**20:.1f} MiB)"
        )
