"""What every architecture family shares: the config, the batch description, scratch buffers,
RoPE tables, and the activation helper that quantizes a layer input once for all its matmuls."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from goinfer.quant import INT_KINDS, QAct, QWeight

if TYPE_CHECKING:
    from goinfer.recurrent import StateSpec

# ============================================================================ config


@dataclass(frozen=True)
class Yarn:
    """YaRN RoPE scaling (transformers' ``rope_type: yarn``; GGUF ``rope.scaling.*``)."""

    factor: float
    orig_ctx: int  # rope.scaling.original_context_length
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attn_factor: float = 0.0  # 0: the paper's 0.1 ln(factor) + 1
    truncate: bool = True  # floor/ceil the correction range (gpt-oss: False)

    @property
    def mscale(self) -> float:
        if self.attn_factor:
            return float(self.attn_factor)
        return 1.0 if self.factor <= 1 else 0.1 * math.log(self.factor) + 1.0

    def inv_freq(self, n_rot: int, base: float) -> np.ndarray:
        """(n_rot/2,) float64: per dimension pair a blend of the interpolated (1/(factor
        base^(2i/n))) and the original (1/base^(2i/n)) frequency, by a linear ramp over the
        correction range [low, high] of dimension pairs (transformers' _compute_yarn_parameters,
        in float64)."""

        def corr(n_rotations):
            return (
                n_rot * math.log(self.orig_ctx / (n_rotations * 2 * math.pi)) / (2 * math.log(base))
            )

        low, high = corr(self.beta_fast), corr(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, n_rot - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(n_rot // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
        pos_freqs = base ** (np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
        extrapolate = 1.0 - ramp  # weight of the original frequency
        return (1.0 / (self.factor * pos_freqs)) * ramp + (1.0 / pos_freqs) * extrapolate


@dataclass
class ModelConfig:
    arch: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    vocab_size: int
    context_length: int
    norm_eps: float
    rope_base: float = 10000.0
    rope_dim: int = 0  # rotated dims per head (0: head_dim)
    rope_neox: bool = False  # pairs (i, i + n/2) instead of (2i, 2i+1)
    rope_scale: float = 1.0  # linear position scaling
    rope_yarn: Yarn | None = None  # YaRN scaling (families that allow it)
    qkv_bias: bool = False
    qk_norm: bool = False
    tied_embeddings: bool = False
    sliding_window: int = 0  # 0: full attention in every layer
    swa_layers: tuple = ()  # per layer: True = sliding window; (): every layer (if a window)
    extra: dict = field(default_factory=dict)

    @property
    def n_rot(self) -> int:
        return self.rope_dim or self.head_dim

    # ------------------------------------------------------------------ what the layers hold

    @property
    def n_kv_layers(self) -> int:
        """Layers that hold their own KV (the KV cache's layers): all of them here."""
        return self.n_layers

    @property
    def n_attn_layers(self) -> int:
        """Layers that run attention (over their own KV or an earlier layer's)."""
        return self.n_kv_layers

    def kv_geometry(self) -> tuple[tuple[int, int], ...]:
        """(n_kv_heads, head_dim) of every KV cache layer, in order."""
        return ((self.n_kv_heads, self.head_dim),) * self.n_kv_layers

    def kv_windows(self) -> tuple[int, ...]:
        """Sliding window in tokens of every KV cache layer, in order (0: full attention): the
        window of the layers that attend over it (cache layer j is layer j here)."""
        return tuple(self.window(j) for j in range(self.n_kv_layers))

    @property
    def state_spec(self) -> StateSpec | None:
        """The recurrent state a sequence carries besides its KV (goinfer/recurrent.py), or None."""
        return None

    def window(self, li: int) -> int:
        """Sliding window of layer li in tokens (0: full causal attention)."""
        if self.swa_layers and not self.swa_layers[li]:
            return 0
        return self.sliding_window

    def describe(self) -> str:
        return (
            f"{self.arch}: {self.n_layers} layers, d_model {self.d_model}, {self.n_heads} heads "
            f"({self.n_kv_heads} kv) x {self.head_dim}, ffn {self.d_ff}, vocab {self.vocab_size}, "
            f"context {self.context_length}"
        )


# ============================================================================ batch


@dataclass
class Segment:
    """The rows [start, stop) of a forward batch that belong to one sequence."""

    start: int
    stop: int
    block_table: np.ndarray  # (n_blocks_seq,) int32
    rec: object = None  # hybrid models: the sequence's recurrent.SeqRecurrent (state, snapshots)
    window_table: np.ndarray | None = (
        None  # (n_blocks_seq,) int32 window slots (KVCache.window_table)
    )

    def table_for(self, window: int) -> np.ndarray:
        """The block table a layer with this sliding window (0: none) attends through."""
        return self.window_table if window and self.window_table is not None else self.block_table


@dataclass
class Batch:
    tokens: np.ndarray  # (T,) int32
    positions: np.ndarray  # (T,) int32 absolute positions
    slots: np.ndarray  # (T,) int64 cache slots: block * block_size + offset
    segments: list[Segment]
    logit_rows: np.ndarray  # (R,) int64 rows that need logits
    fast_from: int | None = None  # rows at positions >= this run fast attention (None: none)
    hidden: bool = False  # give the rows' final-normed hidden states (R, D), not logits
    wslots: np.ndarray | None = None  # (T,) int64 slots in the sliding-window layers (None: slots)
    # RoPE -> (cos, sin (T, n_rot/2) float64, rows (T,) int32) of these positions (RopeCache.rows)
    rope: dict = field(default_factory=dict)

    def slots_for(self, window: int) -> np.ndarray:
        """The cache slots a layer with this sliding window (0: none) writes: a trimmed
        window layer's are window slots (KVCache.window_table), every other layer's blocks."""
        return self.wslots if window and self.wslots is not None else self.slots


# ============================================================================ RoPE


class RopeCache:
    """The RoPE cos / sin of the positions a batch rotates, computed for that batch.

    ``rows(batch)`` -> cos, sin (T, n_rot/2) float64 of the batch's positions and the row of
    each position in them (T,) int32 (0 .. T-1), what ops.rope reads; computed once per batch
    and kept on it (every layer with this RoPE reuses them).  Each value has the bits of row
    ``pos`` of a table of every position (angle (pos / scale) * inv_freq_i, times YaRN's
    mscale): the same float64 operations on the same numbers, element by element.  No table of every position up to the context is kept (for
    Gemma 3 270M at a 30k context its two tables took 117 MiB); a prefill chunk of 512 rows
    needs 0.5 MiB per RoPE, a decode step one row.  ``max_pos``: the context length (positions
    past it are the caller's error, checked before a forward runs)."""

    def __init__(
        self,
        n_rot: int,
        base: float,
        max_pos: int,
        freq_factors=None,
        scale: float = 1.0,
        yarn: Yarn | None = None,
    ):
        self.args = (n_rot, base)
        self.freq_factors = freq_factors
        self.scale = scale
        self.yarn = yarn
        self.max_pos = max_pos
        self._inv: tuple[tuple, np.ndarray] | None = None  # (what it was computed from, inv_freq)

    def inv_freq(self) -> np.ndarray:
        """(n_rot/2,) float64 per-pair frequencies: base^(-2i/n_rot) (YaRN: yarn.inv_freq) /
        freq_factors (recomputed when yarn or freq_factors are replaced)."""
        key = (self.yarn, id(self.freq_factors), self.args)
        if self._inv is None or self._inv[0] != key:
            n_rot, base = self.args
            i = np.arange(n_rot // 2, dtype=np.float64)
            inv = (
                base ** (-2.0 * i / n_rot) if self.yarn is None else self.yarn.inv_freq(n_rot, base)
            )
            if self.freq_factors is not None:
                inv = inv / np.asarray(self.freq_factors, dtype=np.float64)
            self._inv = (key, inv)
        return self._inv[1]

    def fill(self, positions: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> None:
        """cos, sin (T, n_rot/2) float64 <- the angles of positions (T,), in place."""
        ang = (np.asarray(positions, dtype=np.float64) / self.scale)[:, None] * self.inv_freq()[
            None, :
        ]  # (T, n_rot/2)
        np.cos(ang, out=cos)
        np.sin(ang, out=sin)
        if self.yarn is not None and self.yarn.mscale != 1.0:
            np.multiply(cos, self.yarn.mscale, out=cos)
            np.multiply(sin, self.yarn.mscale, out=sin)

    def at(self, positions) -> tuple[np.ndarray, np.ndarray]:
        """cos, sin (T, n_rot/2) float64 of positions (T,)."""
        T, half = len(positions), self.args[0] // 2
        cos, sin = np.empty((T, half)), np.empty((T, half))
        self.fill(positions, cos, sin)
        return cos, sin

    def rows(self, batch: Batch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(cos, sin, row of each position) for batch (see the class); kept in batch.rope."""
        got = batch.rope.get(self)
        if got is None:
            cos, sin = self.at(batch.positions)
            got = batch.rope[self] = (cos, sin, np.arange(len(cos), dtype=np.int32))
        return got


# ============================================================================ activations


class Act:
    """A layer input x (T, K) float32, quantized to int8 at most once for the matmuls reading it."""

    __slots__ = ("x", "_q", "_qbuf", "_ops", "_nt")

    def __init__(self, ops, x: np.ndarray, qbuf: QAct, nthreads: int):
        self._ops = ops  # the kernels module (goinfer._kernels, or a stand-in)
        self.x = x
        self._qbuf = qbuf
        self._q = None
        self._nt = nthreads

    def for_weight(self, w: QWeight):
        """What a matmul with w reads: the int8 rows for an integer weight kind, else x."""
        if w.kind in INT_KINDS:
            if self._q is None:
                self._q = self._ops.quantize_act(
                    self.x, out=self._qbuf.rows(self.x.shape[0]), nthreads=self._nt
                )
            return self._q
        return self.x


class Scratch:
    """Per-model work buffers, sized for the largest batch seen (grown on demand)."""

    def __init__(self):
        self._bufs: dict[str, np.ndarray] = {}
        self._qacts: dict[int, QAct] = {}

    def get(self, name: str, T: int, *shape, dtype=np.float32) -> np.ndarray:
        buf = self._bufs.get(name)
        if buf is None or buf.shape[0] < T or buf.shape[1:] != tuple(shape) or buf.dtype != dtype:
            buf = np.empty((max(T, 1),) + tuple(shape), dtype=dtype)
            self._bufs[name] = buf
        return buf[:T]

    def qact(self, T: int, K: int) -> QAct:
        q = self._qacts.get(K)
        if q is None or q.qa.shape[0] < T:
            q = QAct.empty(max(T, 1), K)
            self._qacts[K] = q
        return q
