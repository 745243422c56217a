"""Recurrent state of hybrid models (Qwen3.5: Gated DeltaNet layers between attention layers).

A linear-attention layer has no per-token keys and values: what the tokens so far left behind
is a fixed-size state per sequence, the last K-1 inputs of its short conv and the (Hv, dk, dv)
matrix of the delta rule.  A sequence's state after n tokens (``RecurrentState``) is a pure
function of those n tokens (and the numerics mode), like a KV block; unlike KV it cannot be
rebuilt from anything stored, and it cannot be cut back: a session that wants to resume after
n tokens needs the state *at* n.  So:

* a Session of a hybrid model owns one live state (where its tokens end) and passes it to
  every forward step (``Model.forward(..., state=)``), which updates it in place;
* snapshots: at every ``snapshot_every``-th block boundary (default 4 blocks = 64 tokens, see
  ``StateStore``) the forward step copies the state as it is right after that token (inside a
  prefill too: the kernels write it mid-call) and the KVCache keeps it beside the block, keyed
  by the block's chain hash (it names exactly the tokens 0 .. end of block and the mode);
* a new prompt reuses the longest cached chain of blocks *that ends at a snapshot*, restores
  that state and prefills the rest: at most ``snapshot_every`` blocks more than an attention
  model would;
* a session also keeps the state at the end of its last prefill (the prompt end), so an
  agent's next turn, which usually diverges right after the previous prompt (a reply that the
  template re-renders differently) or extends the whole history, prefills only its new suffix.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
import zipfile
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from goinfer.errors import CacheFileError

SNAPSHOT_EVERY = 4  # blocks between stored snapshots (block_size 16: every 64 tokens)
MAX_SNAPSHOTS = 64  # snapshots a KVCache keeps (least recently used dropped)

# ============================================================================ state


@dataclass(frozen=True)
class StateSpec:
    """Shapes of one sequence's recurrent state over the n_lin linear-attention layers."""

    n_lin: int
    conv_kernel: int  # K
    conv_dim: int  # C = 2 * Hk * dk + Hv * dv
    n_v_heads: int  # Hv
    d_k: int
    d_v: int

    @property
    def conv_shape(self) -> tuple:
        return (self.n_lin, self.conv_kernel - 1, self.conv_dim)

    @property
    def ssm_shape(self) -> tuple:
        return (self.n_lin, self.n_v_heads, self.d_k, self.d_v)

    @property
    def nbytes(self) -> int:
        return 4 * (int(np.prod(self.conv_shape)) + int(np.prod(self.ssm_shape)))


@dataclass(eq=False)
class RecurrentState:
    """One sequence's state: conv (n_lin, K-1, C) and ssm (n_lin, Hv, dk, dv), float32."""

    conv: np.ndarray
    ssm: np.ndarray

    @classmethod
    def zeros(cls, spec: StateSpec) -> RecurrentState:
        return cls(np.zeros(spec.conv_shape, np.float32), np.zeros(spec.ssm_shape, np.float32))

    def copy(self) -> RecurrentState:
        return RecurrentState(self.conv.copy(), self.ssm.copy())

    def load(self, other: RecurrentState) -> None:
        """Become a copy of other (in place: the arrays stay the same objects)."""
        self.conv[...] = other.conv
        self.ssm[...] = other.ssm

    def clear(self) -> None:
        self.conv[...] = 0.0
        self.ssm[...] = 0.0

    @property
    def nbytes(self) -> int:
        return self.conv.nbytes + self.ssm.nbytes


@dataclass(eq=False)
class SeqRecurrent:
    """What one sequence of a forward batch brings for the linear-attention layers: its live
    state (updated in place) and the rows after which to copy the state into snapshots."""

    state: RecurrentState
    snap_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # (n,) rows
    snap_conv: np.ndarray | None = None  # (n, n_lin, K-1, C)
    snap_ssm: np.ndarray | None = None  # (n, n_lin, Hv, dk, dv)

    @classmethod
    def with_snapshots(cls, state: RecurrentState, rows) -> SeqRecurrent:
        rows = np.asarray(rows, dtype=np.int32)
        n = len(rows)
        conv = np.empty((n,) + state.conv.shape, np.float32) if n else None
        ssm = np.empty((n,) + state.ssm.shape, np.float32) if n else None
        return cls(state, rows, conv, ssm)

    def layer_snaps(self, i: int):
        """kernel arguments (snap_rows, conv snaps, ssm snaps) for linear layer i."""
        if not len(self.snap_rows):
            return None, None, None
        return self.snap_rows, self.snap_conv[:, i], self.snap_ssm[:, i]

    def snapshots(self) -> list[RecurrentState]:
        return [
            RecurrentState(self.snap_conv[s], self.snap_ssm[s]) for s in range(len(self.snap_rows))
        ]


# ============================================================================ the cache's store


class StateStore:
    """Snapshots of recurrent states kept by a KVCache, keyed by the chain hash of the block
    they end (a snapshot is valid exactly when that block is: same tokens, same mode).

    ``every``: a snapshot is stored at every every-th block boundary; ``max_snapshots``: the
    least recently used are dropped beyond it.  Memory: max_snapshots * StateSpec.nbytes."""

    def __init__(
        self, spec: StateSpec, every: int = SNAPSHOT_EVERY, max_snapshots: int = MAX_SNAPSHOTS
    ):
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"snapshot_every must be a positive int, got {every!r}")
        if not isinstance(max_snapshots, int) or max_snapshots < 0:
            raise ValueError(f"max_snapshots must be an int >= 0, got {max_snapshots!r}")
        self.spec = spec
        self.every = every
        self.max_snapshots = max_snapshots
        self._snaps: OrderedDict[bytes, RecurrentState] = OrderedDict()
        self._lock = threading.Lock()

    def is_boundary(self, n_blocks: int) -> bool:
        """Is the end of the n_blocks-th block (n_blocks full blocks) a snapshot point?"""
        return n_blocks > 0 and n_blocks % self.every == 0

    def put(self, h: bytes, state: RecurrentState) -> None:
        with self._lock:
            if h in self._snaps:
                self._snaps.move_to_end(h)
                return
            if self.max_snapshots == 0:
                return
            self._snaps[h] = state
            while len(self._snaps) > self.max_snapshots:
                self._snaps.popitem(last=False)

    def get(self, h: bytes) -> RecurrentState | None:
        with self._lock:
            s = self._snaps.get(h)
            if s is not None:
                self._snaps.move_to_end(h)
            return s

    def __contains__(self, h: bytes) -> bool:
        return h in self._snaps

    def items(self) -> list[tuple[bytes, RecurrentState]]:
        with self._lock:
            return list(self._snaps.items())

    def __len__(self) -> int:
        return len(self._snaps)

    def clear(self) -> None:
        with self._lock:
            self._snaps.clear()

    # ------------------------------------------------------------------ save and load

    def save(self, path, fingerprint: str) -> int:
        """Write every snapshot to path (npz, no pickle) atomically, with the model's
        fingerprint and a sha256 of the arrays.  Returns the count."""
        items = self.items()
        spec = self.spec
        conv = (
            np.stack([s.conv for _, s in items])
            if items
            else np.zeros((0,) + spec.conv_shape, np.float32)
        )
        ssm = (
            np.stack([s.ssm for _, s in items])
            if items
            else np.zeros((0,) + spec.ssm_shape, np.float32)
        )
        hashes = np.array([np.frombuffer(h, np.uint8) for h, _ in items], np.uint8).reshape(
            len(items), -1
        )
        meta = np.array([fingerprint, _digest(hashes, conv, ssm)])
        path = Path(path)
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent or ".")
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, meta=meta, hashes=hashes, conv=conv, ssm=ssm)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        return len(items)

    def read(self, path, fingerprint: str) -> list[tuple[bytes, RecurrentState]]:
        """The snapshots of a file written by save (none if there is no file).  Another model's
        file, wrong shapes or a checksum mismatch raise CacheFileError."""
        path = Path(path)
        if not path.exists():
            return []
        try:
            with np.load(path, allow_pickle=False) as z:
                meta, hashes, conv, ssm = z["meta"], z["hashes"], z["conv"], z["ssm"]
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
            raise CacheFileError(f"{path}: not a readable state snapshot file ({e})") from None
        if meta.shape != (2,) or str(meta[0]) != fingerprint:
            raise CacheFileError(f"{path}: state snapshots of another model")
        n = len(hashes)
        if (
            conv.shape != (n,) + self.spec.conv_shape
            or ssm.shape != (n,) + self.spec.ssm_shape
            or conv.dtype != np.float32
            or ssm.dtype != np.float32
        ):
            raise CacheFileError(f"{path}: state snapshots of another geometry")
        if str(meta[1]) != _digest(hashes, conv, ssm):
            raise CacheFileError(f"{path}: checksum mismatch (corrupt file)")
        return [(bytes(hashes[i]), RecurrentState(conv[i].copy(), ssm[i].copy())) for i in range(n)]

    def add(self, snaps: list[tuple[bytes, RecurrentState]]) -> None:
        for h, st in snaps:
            self.put(h, st)

    def load(self, path, fingerprint: str) -> int:
        snaps = self.read(path, fingerprint)
        self.add(snaps)
        return len(snaps)


def _digest(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def states_path(path) -> Path:
    """Where KVCache.save puts a hybrid model's state snapshots: beside the cache file."""
    return Path(str(path) + ".states.npz")
