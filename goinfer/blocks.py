"""A session's block table: which KVCache blocks hold its tokens, and the chain hash of each
full block (how the prefix cache finds them again).

Block i holds tokens [i * block_size, (i + 1) * block_size).  A full block is committed to the
cache under the hash of its tokens, its parent's hash, its numerics mode and the cache salt,
so any session of the same model and salt can reuse it; a partly filled block is the
session's own (a shared one is copied before it is written).

Sliding-window layers (a KVCache whose ``window`` is > 0, kv_cache.py): a query at position p
reads keys p - window + 1 .. p there, so the table holds the window KV of its blocks from
``window_start(n - n % block_size)`` on only, n the next position to compute (what it reads,
and what its last block boundary reads: where its points are), and lets go of the blocks
before as it computes (``trim_window``: before each chunk of a long prefill and each decode
step; a draft's rollback goes back to a position at or after the start of the step that
computed it, so it finds what it reads).  What
it still holds when it is released stays with its cached blocks until they are evicted.  Where
a prompt may resume later it keeps a point (``KVCache.keep_point``: the window KV of the
blocks before a block boundary):
  - every ``cache.window_point_every`` blocks (default 8 windows) as it computes,
  - at the block boundaries ``keep_point_at`` names: a prompt's end, and where a prompt left
    the tokens already held or cached (the next prompt with the same prefix resumes there),
  - at its end when it is released.
A session can resume at n only where every block a query at n reads still has its window KV
(``resumable``); elsewhere it resumes at the nearest earlier such point and recomputes the
tokens between (``resume_point``): never a wrong result, at most a recompute.
"""

from __future__ import annotations

import weakref

import numpy as np

from goinfer.errors import ContextLengthError
from goinfer.kv_cache import KVCache, block_hash, root_hash

__all__ = ["BlockTable"]


class BlockTable:
    def __init__(self, model, cache: KVCache, cache_salt: str | None = None):
        self.model = model
        self.cache = cache
        self.cache_salt = cache_salt
        self.tokens: list[int] = []
        self.blocks: list[int] = []  # cache block of each block_size tokens
        self.hashes: list[bytes] = []  # chain hash of each full block
        self._wlo = [0]  # the table holds the window KV of blocks[_wlo[0]:] (a list: see below)
        self.points_due: set[int] = set()  # block counts where a point is kept once computed
        # blocks go back to the cache when the table is dropped without release()
        self._finalizer = weakref.finalize(self, _release_all, cache, self.blocks, self._wlo)

    @property
    def block_size(self) -> int:
        return self.cache.block_size

    @property
    def trims(self) -> bool:
        """Does the cache keep sliding-window layers' KV only within the window?"""
        return self.cache.window > 0

    def as_array(self) -> np.ndarray:
        return np.asarray(self.blocks, dtype=np.int32)

    def release(self, keep_point: bool = True) -> None:
        """Forget every token; the full blocks stay in the cache for reuse (with a point at the
        last full block's end: the next turn of a conversation usually resumes there)."""
        if keep_point and self.trims:
            self._keep_point(len(self.hashes))
        self.cache.release_window(self.blocks[self._wlo[0] :], keep=True)
        self._wlo[0] = 0
        self.cache.release(self.blocks)
        self.blocks.clear()
        self.hashes.clear()
        self.tokens.clear()
        self.points_due.clear()

    def share_into(self, other: BlockTable) -> None:
        """Make the empty table `other` hold this one's tokens in the same blocks (retained)."""
        self.cache.retain(self.blocks)
        self.cache.retain_window(self.blocks[self._wlo[0] :])
        other.blocks.extend(self.blocks)
        other.hashes.extend(self.hashes)
        other.tokens.extend(self.tokens)
        other._wlo[0] = self._wlo[0]

    def truncate(self, n: int) -> None:
        """Drop the tokens after the first n and the blocks past them (spare reserved blocks
        too).  The window KV a query at n reads is held again if the cache still has it."""
        keep = -(-n // self.block_size)
        if keep < len(self.blocks):
            self.cache.release_window(self.blocks[max(keep, self._wlo[0]) :], keep=True)
            self._wlo[0] = min(self._wlo[0], keep)
            self.cache.release(self.blocks[keep:])
            del self.blocks[keep:]
        del self.hashes[n // self.block_size :]
        del self.tokens[n:]
        self.points_due = {m for m in self.points_due if m > n // self.block_size}
        if self.trims:
            self._hold_window_from(min(self._wlo[0], self.window_start(n - n % self.block_size)))

    # ------------------------------------------------------------------ hashing

    def parent_hash(self) -> bytes:
        """The hash the next full block chains from."""
        return self.hashes[-1] if self.hashes else root_hash(self.cache_salt)

    def block_mode(self, bi: int) -> str:
        """The numerics mode block bi is keyed by: that of its last position (Model.mode_at),
        so blocks below the fast floor are shared by both modes."""
        return self.model.mode_at((bi + 1) * self.block_size - 1)

    def hash_of(self, parent: bytes, chunk: list[int], bi: int) -> bytes:
        """The chain hash of block bi holding `chunk` after `parent`."""
        return block_hash(parent, chunk, self.block_mode(bi), self.cache_salt)

    # ------------------------------------------------------------------ growing

    def reserve(self, n_new: int) -> None:
        """Make room for n_new more tokens: copy a shared or hashed partial block, allocate
        more.  On failure (ContextLengthError, CacheFullError) nothing changes."""
        n = len(self.tokens)
        if n + n_new > self.model.n_ctx:
            raise ContextLengthError(
                f"{n + n_new} tokens exceed the context length {self.model.n_ctx} of "
                f"{self.model.name} ({n} held + {n_new} new)",
                n + n_new,
                self.model.n_ctx,
            )
        bs = self.block_size
        bi = n // bs  # the partly filled block, if n % bs
        cow = n % bs != 0 and not self.cache.writable(self.blocks[bi])
        fresh: list[int] = []
        try:
            if cow:
                fresh.append(self.cache.allocate())
                self.cache.copy_block(self.blocks[bi], fresh[0], n % bs)
            for _ in range(-(-(n + n_new) // bs) - len(self.blocks)):
                fresh.append(self.cache.allocate())
        except BaseException:
            self.cache.release(fresh)
            raise
        if cow:
            old, self.blocks[bi] = self.blocks[bi], fresh.pop(0)
            if bi >= self._wlo[0]:  # the copy holds the window KV in its place
                self.cache.retain_window([self.blocks[bi]])
                self.cache.release_window([old], keep=True)
            self.cache.release([old])
        self.cache.retain_window(fresh)
        self.blocks.extend(fresh)

    def commit(self, ids: list[int]) -> None:
        """ids were just computed into the reserved blocks: append them, hash every newly
        full block into the cache, keep the points due there."""
        bs = self.block_size
        self.tokens.extend(ids)
        every = self.cache.window_point_every if self.trims else 0
        for bi in range(len(self.hashes), len(self.tokens) // bs):
            mode = self.block_mode(bi)
            parent, toks = self.parent_hash(), self.tokens[bi * bs : (bi + 1) * bs]
            h = block_hash(parent, toks, mode, self.cache_salt)
            self.hashes.append(h)
            self.cache.commit(self.blocks[bi], h, parent, toks, mode)
            if self.trims and (bi + 1 in self.points_due or (every and (bi + 1) % every == 0)):
                self.points_due.discard(bi + 1)
                self._keep_point(bi + 1)

    def extend_from_cache(self, ids: list[int], limit: int) -> int:
        """Append cached full blocks matching ids[:limit] (the table must be block aligned)
        -> the number of tokens appended."""
        bs = self.block_size
        if len(self.tokens) % bs:
            return 0
        i = 0
        while i + bs <= limit:
            chunk = ids[i : i + bs]
            h = self.hash_of(self.parent_hash(), chunk, len(self.blocks))
            b = self.cache.lookup(h)
            if b is None:
                break
            self.cache.retain_window([b])
            self.blocks.append(b)
            self.hashes.append(h)
            self.tokens.extend(chunk)
            i += bs
        return i

    def cached_chain(self, ids: list[int], limit: int) -> tuple[list[bytes], list[int]]:
        """The chain hashes and blocks of the longest cached chain of full blocks that ids[:limit]
        starts with, from the root (not retained: what they hold may change after)."""
        bs = self.block_size
        hashes: list[bytes] = []
        blocks: list[int] = []
        parent, i = root_hash(self.cache_salt), 0
        while i + bs <= limit:
            h = self.hash_of(parent, ids[i : i + bs], i // bs)
            b = self.cache.lookup(h)
            if b is None:
                break
            self.cache.release([b])
            hashes.append(h)
            blocks.append(b)
            parent, i = h, i + bs
        return hashes, blocks

    # ------------------------------------------------------------------ sliding-window KV

    def window_start(self, n: int) -> int:
        """The first block whose window KV a query at position n reads."""
        return max(0, n - self.cache.window + 1) // self.block_size

    def _hold_window_from(self, j: int) -> None:
        """Hold the window KV of blocks[j:] (and not of the blocks before)."""
        j = min(max(j, 0), len(self.blocks))
        lo = self._wlo[0]
        if j > lo:
            self.cache.release_window(self.blocks[lo:j])
        elif j < lo:
            self.cache.retain_window(self.blocks[j:lo])
        self._wlo[0] = j

    def trim_window(self, n: int) -> None:
        """The next position to compute is n: let go of the window KV of the blocks wholly
        before the window of the block boundary at or before n, unless a kept point holds
        them."""
        if self.trims:
            j = self.window_start(n - n % self.block_size)
            if j > self._wlo[0]:
                self._hold_window_from(j)

    def window_gap(self, blocks, n: int) -> int:
        """For a session holding `blocks` (a chain from the root): -1 if a query at n finds the
        window KV of every block it reads, else the last block index without it."""
        if not self.trims or n == 0:
            return -1
        j0, j1 = self.window_start(n), (n - 1) // self.block_size + 1
        j = self.cache.last_without_window(blocks[j0:j1])
        return -1 if j < 0 else j0 + j

    def resumable(self, n: int) -> bool:
        """Can the table resume at n tokens (it holds them): does every block a query at n
        reads still have its window KV?"""
        return self.window_gap(self.blocks, n) < 0

    def resume_point(self, n: int, blocks=None) -> int:
        """The largest token count <= n at which a session holding `blocks` (default: the
        table's) finds the window KV it reads: n, or the start of a block whose window KV is
        gone, or 0."""
        blocks = self.blocks if blocks is None else blocks
        while (j := self.window_gap(blocks, n)) >= 0:
            n = j * self.block_size
        return n

    def keep_point_at(self, n: int) -> None:
        """Keep a point at the last block boundary <= n (now, or when computed)."""
        m = n // self.block_size
        if self.trims and m:
            if m <= len(self.hashes):
                self._keep_point(m)
            else:
                self.points_due.add(m)

    def _keep_point(self, m: int) -> None:
        """Keep the window KV a query at block boundary m reads (its blocks must be held)."""
        if m:
            j0 = self.window_start(m * self.block_size)
            self.cache.keep_point(self.hashes[j0:m], self.blocks[j0:m])


def _release_all(cache: KVCache, blocks: list[int], wlo: list[int]) -> None:
    if blocks:
        cache.release_window(blocks[wlo[0] :], keep=True)
        cache.release(blocks)
        blocks.clear()
