"""Embedding tables read a row at a time, from the layout file, not from memory.

    table = RowTable(path, weight, offsets)   # layout.load makes one per row table
    ids = table.stage(tokens)                 # the tokens' row blocks into the staging weight
    get_rows(table.weight, ids, out=x)        # the same kernel, the same bits

An embedding table that is not tied to the LM head is only ever read by token: a step reads a
few of its rows.  gpt-oss-20b's is 201,088 rows (615 MB in Q8_0), Gemma 4's per-layer table
holds 8,960 values per token of a 262,144-token vocabulary.  Mapped like the other weights it
would be resident in full; mapped on demand, each row read would still bring in the page-cache
folio around it (up to 2 MB on file systems that cache files in large folios) until the
mapping lets go.  So the layout cache leaves such a table out of the populated mapping and out
of the copy (layout.py), and a step reads the row blocks its tokens fall in with ``preadv``
into a small staging weight of the table's kind: ``ROWS`` rows of the table per block, whole
blocks, so ``get_rows`` on the staging weight gives each token's row with the bits it has in
the table.  The process holds the staging weight (at most ``capacity`` blocks), never the
table; the page cache keeps what was read, shared and reclaimable.

The staging weight and the ids buffer stay at one address for the table's life: a decode step
replayed by a graph (graph.py) binds ``get_rows`` to them once and stages its tokens before
each replay.
"""

from __future__ import annotations

import os
import threading
import weakref

import numpy as np

from goinfer import memory
from goinfer.quant import ROWS, QWeight

CAPACITY = 256  # token rows one stage() takes (a longer batch is staged in pieces)


class RowTable:
    """A weight (n_out, n_in) of the layout file at path, its arrays (qs, d, m: each
    (n_rb, ...), one contiguous row block per leading index) at the given file offsets."""

    def __init__(self, path, weight: QWeight, offsets: dict[str, int], capacity: int = CAPACITY):
        self.path = str(path)
        self.source = weight  # the table's own (mapped, never read) weight: kind, shapes
        self.capacity = capacity
        self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        self._finalizer = weakref.finalize(self, os.close, self._fd)
        self._lock = threading.Lock()
        fields = [f for f in ("qs", "d", "m") if getattr(weight, f) is not None]
        # per array: file offset, bytes per row block, the staging array (capacity, ...)
        self._arrays = []
        staged = {}
        for f in fields:
            a = getattr(weight, f)
            block = a.nbytes // a.shape[0]
            stage = np.zeros((capacity,) + a.shape[1:], a.dtype)  # (capacity, ...) row blocks
            self._arrays.append((offsets[f], block, stage))
            staged[f] = stage
        self.weight = QWeight(
            weight.kind,
            capacity * ROWS,
            weight.n_in,
            staged["qs"],
            staged.get("d"),
            staged.get("m"),
            weight.source_type,
        )
        self.ids = np.zeros(capacity, np.int64)  # (capacity,) rows of self.weight
        # faulted in now, in the background: a first touch of fresh memory is slow on virtual
        # machines whose host backs guest memory lazily (memory.py), and the first prefill
        # chunk would pay it
        memory.populate_async([(a.ctypes.data, a.nbytes) for a in staged.values()], staged)

    @property
    def n_out(self) -> int:
        return self.source.n_out

    def stage(self, tokens: np.ndarray) -> np.ndarray:
        """Read the row blocks of tokens (at most capacity of them, ids in [0, n_out)) into the
        staging weight; returns the tokens' rows in it, (len(tokens),) int64 (a view of
        self.ids)."""
        tokens = np.asarray(tokens)
        T = len(tokens)
        if T > self.capacity:
            raise ValueError(f"{T} rows to stage, the staging weight holds {self.capacity}")
        if T and (int(tokens.min()) < 0 or int(tokens.max()) >= self.n_out):
            raise ValueError(f"row id out of range 0..{self.n_out - 1}")
        blocks, slot = np.unique(tokens // ROWS, return_inverse=True)
        with self._lock:
            for off, block, stage in self._arrays:
                flat = stage.reshape(self.capacity, -1).view(np.uint8)
                for i, b in enumerate(blocks.tolist()):
                    _pread_exact(self._fd, flat[i], off + b * block)
            self.ids[:T] = slot.reshape(-1) * ROWS + tokens % ROWS
        return self.ids[:T]

    def close(self) -> None:
        """Close the layout file now (otherwise when the table is collected)."""
        self._finalizer()


def _pread_exact(fd: int, dst: np.ndarray, offset: int) -> None:
    """dst's bytes from the file at offset (os.preadv into dst; os.pread and a copy where the
    system has no preadv)."""
    view = memoryview(dst).cast("B")
    while len(view):
        if hasattr(os, "preadv"):
            n = os.preadv(fd, [view], offset)
        else:  # no preadv (macOS before Python 3.12)
            b = os.pread(fd, len(view), offset)
            n = len(b)
            view[:n] = b
        if n <= 0:
            raise OSError(f"short read of a row table at byte {offset} (the file was truncated?)")
        view, offset = view[n:], offset + n
