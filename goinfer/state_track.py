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

    def share_into(self, other: StateTrack) -> None:
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

    def has_snapshot(self, h: bytes) -> bool:
        """Is a state snapshot stored after the full block with chain hash h?"""
        return h in self.table.cache.states

    def back_to(self, n0: int, n: int) -> None:
        """Blocks past n0 (where the live state is) were just appended from the cache: keep
        them up to n (n0, or a block boundary with a stored snapshot), load its state, drop
        the rest."""
        t = self.table
        if n > n0:
            self.state.load(t.cache.states.get(t.hashes[n // t.block_size - 1]))
        t.truncate(n)

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
