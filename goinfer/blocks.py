"""A session's block table: which KVCache blocks hold its tokens, and the chain hash of each
full block (how the prefix cache finds them again).

Block i holds tokens [i * block_size, (i + 1) * block_size).  A full block is committed to the
cache under the hash of its tokens, its parent's hash, its numerics mode and the cache salt,
so any session of the same model and salt can reuse it; a partly filled block is the
session's own (a shared one is copied before it is written).
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
        # blocks go back to the cache when the table is dropped without release()
        self._finalizer = weakref.finalize(self, _release_all, cache, self.blocks)

    @property
    def block_size(self) -> int:
        return self.cache.block_size

    def as_array(self) -> np.ndarray:
        return np.asarray(self.blocks, dtype=np.int32)

    def release(self) -> None:
        """Forget every token; the full blocks stay in the cache for reuse."""
        self.cache.release(self.blocks)
        self.blocks.clear()
        self.hashes.clear()
        self.tokens.clear()

    def share_into(self, other: "BlockTable") -> None:
        """Make the empty table `other` hold this one's tokens in the same blocks (retained)."""
        self.cache.retain(self.blocks)
        other.blocks.extend(self.blocks)
        other.hashes.extend(self.hashes)
        other.tokens.extend(self.tokens)

    def truncate(self, n: int) -> None:
        """Drop the tokens after the first n and the blocks past them (spare reserved blocks
        too)."""
        keep = -(-n // self.block_size)
        if keep < len(self.blocks):
            self.cache.release(self.blocks[keep:])
            del self.blocks[keep:]
        del self.hashes[n // self.block_size:]
        del self.tokens[n:]

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
                f"{self.model.name} ({n} held + {n_new} new)", n + n_new, self.model.n_ctx)
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
            self.cache.release([old])
        self.blocks.extend(fresh)

    def commit(self, ids: list[int]) -> None:
        """ids were just computed into the reserved blocks: append them and hash every newly
        full block into the cache."""
        bs = self.block_size
        self.tokens.extend(ids)
        for bi in range(len(self.hashes), len(self.tokens) // bs):
            mode = self.block_mode(bi)
            parent, toks = self.parent_hash(), self.tokens[bi * bs:(bi + 1) * bs]
            h = block_hash(parent, toks, mode, self.cache_salt)
            self.hashes.append(h)
            self.cache.commit(self.blocks[bi], h, parent, toks, mode)

    def extend_from_cache(self, ids: list[int], limit: int) -> int:
        """Append cached full blocks matching ids[:limit] (the table must be block aligned)
        -> the number of tokens appended."""
        bs = self.block_size
        if len(self.tokens) % bs:
            return 0
        i = 0
        while i + bs <= limit:
            chunk = ids[i:i + bs]
            h = self.hash_of(self.parent_hash(), chunk, len(self.blocks))
            b = self.cache.lookup(h)
            if b is None:
                break
            self.blocks.append(b)
            self.hashes.append(h)
            self.tokens.extend(chunk)
            i += bs
        return i


def _release_all(cache: KVCache, blocks: list[int]) -> None:
    if blocks:
        cache.release(blocks)
        blocks.clear()
