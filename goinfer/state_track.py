"""Where a hybrid model's session can resume: its recurrent state and the points it is known.

A hybrid model (linear-attention layers, goinfer/recurrent.py) carries a recurrent state that,
unlike the KV blocks, cannot be cut back to an earlier token: a session can only resume at a
token count where it has the state.  Those points are its end (the live state), its marks (own
copies taken at prompt ends: the next request usually resumes there; the two most recent are
kept) and the state snapshots the KVCache stores for some full blocks (``StateStore``: every
SNAPSHOT_EVERY blocks, shared by every session of the cache).
"""
from __future__ import annotations

from goinfer.blocks import BlockTable
from goinfer.kv_cache import root_hash
from goinfer.recurrent import RecurrentState

__all__ = ["StateTrack"]


class StateTrack:
    def __init__(self, table: BlockTable, state: RecurrentState):
        self.table = table
        self.state = state  # the live state, after all of table.tokens
        self.marks: dict[int, RecurrentState] = {}  # own copies at earlier token counts

    def clear(self) -> None:
        self.state.clear()
        self.marks.clear()

    def share_into(self, other: "StateTrack") -> None:
        other.state.load(self.state)
        other.marks.update(self.marks)  # marks are never written: shared

    def mark_prompt_end(self) -> None:
        """Keep a copy of the live state at the current end (a prompt end): the next request
        usually resumes here.  The two most recent marks are kept."""
        if not self.table.tokens:
            return
        self.marks[len(self.table.tokens)] = self.state.copy()
        for m in sorted(self.marks)[:-2]:
            del self.marks[m]

    # ------------------------------------------------------------------ resume points

    def resume_point(self, n: int) -> int:
        """The largest token count <= n at which the session can have its recurrent state:
        its end, a mark, a stored snapshot of one of its blocks, or 0."""
        t = self.table
        best = len(t.tokens) if len(t.tokens) <= n else 0
        best = max([best] + [m for m in self.marks if m <= n])
        bs, store = t.block_size, t.cache.states
        for b in range(min(n, len(t.hashes) * bs) // bs, best // bs, -1):
            if t.hashes[b - 1] in store:
                return b * bs
        return best

    def rewind(self, n: int) -> None:
        """Go back to token count n, a resume_point: load the state there, drop what
        follows."""
        t = self.table
        if n < len(t.tokens):
            bs = t.block_size
            snap = self.marks.get(n)
            if snap is None and n and n % bs == 0:
                snap = t.cache.states.get(t.hashes[n // bs - 1])
            if n == 0:
                self.state.clear()
            elif snap is None:
                raise RuntimeError(f"no recurrent state at {n} tokens")  # pragma: no cover
            else:
                self.state.load(snap)
        t.truncate(n)
        for m in [m for m in self.marks if m > n]:
            del self.marks[m]

    def back_to_snapshot(self, n0: int, added: int) -> int:
        """Blocks covering tokens [n0, n0 + added) were just appended from the cache: keep
        them up to the last one that ends at a stored state snapshot, load that state, drop
        the rest.  Returns the tokens kept."""
        t = self.table
        bs, store = t.block_size, t.cache.states
        keep = 0
        for b in range(n0 // bs + 1, (n0 + added) // bs + 1):
            snap = store.get(t.hashes[b - 1])
            if snap is not None:
                keep, state = b * bs - n0, snap
        if keep:
            self.state.load(state)
        t.truncate(n0 + keep)
        return keep

    def cached_snapshot_point(self, ids: list[int], limit: int) -> int:
        """How many tokens of ids[:limit] the shared cache can serve from the start: the end
        of the deepest cached block chain of ids that has a state snapshot."""
        t = self.table
        bs, store = t.block_size, t.cache.states
        parent, best, i = root_hash(t.cache_salt), 0, 0
        while i + bs <= limit:
            h = t.hash_of(parent, ids[i:i + bs], i // bs)
            b = t.cache.lookup(h)
            if b is None:
                break
            t.cache.release([b])
            parent, i = h, i + bs
            if h in store:
                best = i
        return best

    # ------------------------------------------------------------------ snapshots while computing

    def due_snapshots(self, n_new: int) -> list[int]:
        """Token counts in (n, n + n_new] that end a snapshot block."""
        t = self.table
        bs, store = t.block_size, t.cache.states
        n = len(t.tokens)
        return [b * bs for b in range(n // bs + 1, (n + n_new) // bs + 1) if store.is_boundary(b)]

    def keep_snapshots(self, snaps: dict) -> None:
        """After the table's commit: file the snapshots taken at block ends under those
        blocks' hashes."""
        t = self.table
        for n, st in snaps.items():
            if st is not None:
                t.cache.states.put(t.hashes[n // t.block_size - 1], st)
