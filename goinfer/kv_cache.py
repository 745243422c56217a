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
"""
from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from goinfer.errors import CacheFullError

EXACT = "exact"
FAST = "fast"
_ROOT = b"goinfer-kv-root"


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

    def as_dict(self) -> dict:
        return dict(self.__dict__)


class KVCache:
    """A pool of KV blocks for one model.

    ``KVCache(model, max_tokens=8192, block_size=16)``, or ``max_bytes=`` for a memory budget.
    Arrays per layer (see docs/design/kernels.md):
      k: (n_layers, n_blocks, n_kv_heads, head_dim, block_size) float32
      v: (n_layers, n_blocks, n_kv_heads, block_size, head_dim) float32
    """

    def __init__(self, model, max_tokens: int | None = None, block_size: int = 16,
                 max_bytes: int | None = None):
        cfg = model.config
        if not isinstance(block_size, int) or block_size < 1 or block_size > 1024:
            raise ValueError(f"block_size must be an int in 1..1024, got {block_size!r}")
        self.model_fingerprint = model.fingerprint
        self.block_size = block_size
        self.n_layers = cfg.n_layers
        self.n_kv_heads = cfg.n_kv_heads
        self.head_dim = cfg.head_dim
        self.bytes_per_block = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * block_size * 4
        if max_tokens is not None and max_bytes is not None:
            raise ValueError("give max_tokens or max_bytes, not both")
        if max_bytes is not None:
            n_blocks = int(max_bytes) // self.bytes_per_block
        else:
            if max_tokens is None:
                max_tokens = 2 * cfg.context_length
            n_blocks = -(-int(max_tokens) // block_size)
        if n_blocks < 1:
            raise ValueError("the KV cache budget is smaller than one block "
                             f"({self.bytes_per_block} bytes, {block_size} tokens)")
        self.n_blocks = n_blocks
        # (n_layers, n_blocks, n_kv_heads, head_dim, block_size)
        self.k = np.zeros((cfg.n_layers, n_blocks, cfg.n_kv_heads, cfg.head_dim, block_size), np.float32)
        # (n_layers, n_blocks, n_kv_heads, block_size, head_dim)
        self.v = np.zeros((cfg.n_layers, n_blocks, cfg.n_kv_heads, block_size, cfg.head_dim), np.float32)
        self._lock = threading.RLock()
        self._ref = np.zeros(n_blocks, np.int32)
        self._hash_of: dict[int, bytes] = {}
        self._block_of: dict[bytes, int] = {}
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
        n = self.block_size if n_tokens is None else n_tokens
        self.k[:, dst, :, :, :n] = self.k[:, src, :, :, :n]
        self.v[:, dst, :, :n, :] = self.v[:, src, :, :n, :]

    # ------------------------------------------------------------------ prefix index

    def _unhash(self, b: int) -> None:
        h = self._hash_of.pop(b, None)
        if h is not None and self._block_of.get(h) == b:
            del self._block_of[h]

    def commit(self, b: int, h: bytes) -> None:
        """Register a block the session just filled under its chain hash."""
        with self._lock:
            if b in self._hash_of or h in self._block_of:
                return  # already known (another session computed the same block)
            self._hash_of[b] = h
            self._block_of[h] = b

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

    # ------------------------------------------------------------------ introspection

    def stats(self) -> CacheStats:
        with self._lock:
            used = int((self._ref > 0).sum())
            return CacheStats(
                block_size=self.block_size, blocks_total=self.n_blocks, blocks_used=used,
                blocks_cached=len(self._lru), blocks_free=len(self._free),
                hit_tokens=self.hit_tokens, miss_tokens=self.miss_tokens,
                evictions=self.evictions, bytes_total=self.n_blocks * self.bytes_per_block,
                bytes_per_block=self.bytes_per_block)

    def clear(self) -> None:
        """Forget every cached (unreferenced) block; blocks in use are untouched."""
        with self._lock:
            while self._lru:
                b, _ = self._lru.popitem(last=False)
                self._unhash(b)
                self._free.append(b)

    def __repr__(self) -> str:
        s = self.stats()
        return (f"KVCache({s.blocks_total} blocks x {s.block_size} tokens, used {s.blocks_used}, "
                f"cached {s.blocks_cached}, free {s.blocks_free}, {s.bytes_total / 2**20:.0f} MiB)")
