"""Reading a family's config and weights from a GGUF file: checked metadata reads, the config
fields every family shares, and a per-layer tensor loader.

Every check names the file and the key or tensor it is about; a missing or malformed value is a
ModelFormatError, a well-formed one goinfer does not run an UnsupportedArchitectureError.

    fields = config_fields(g, arch)              # ModelConfig's fields, from {arch}.* metadata
    ld = Loader.layer(g, i)                      # the tensors blk.{i}.*
    norm = ld.vec("attn_norm.weight", D)         # float32 (D,)
    wo = ld.mat("attn_output.weight", D, H * hd) # QWeight (D, H * hd)
    wqkv, (wq, wk, wv) = ld.fused(("attn_q.weight", H * hd, D), ("attn_k.weight", KV * hd, D),
                                  ("attn_v.weight", KV * hd, D))
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from goinfer.errors import ModelFormatError, UnsupportedArchitectureError
from goinfer.models.base import Yarn
from goinfer.quant import QWeight, concat_rows

if TYPE_CHECKING:
    from goinfer.gguf import GGUFFile
    from goinfer.models.arch import Arch

_REQUIRED = object()

# ============================================================================ metadata


def require(g: GGUFFile, key: str) -> Any:
    """The metadata value {arch}.{key}; ModelFormatError if the file has none."""
    v = g.arch_get(key)
    if v is None:
        raise ModelFormatError(f"{g.path}: metadata key {g.arch}.{key} is missing")
    return v


def scalar_int(g: GGUFFile, key: str, default: Any = _REQUIRED) -> int:
    """{arch}.{key} as one int.  A per-layer array is accepted when all its values are equal
    (UnsupportedArchitectureError otherwise).  Missing: default, or ModelFormatError."""
    v = g.arch_get(key)
    if v is None:
        if default is _REQUIRED:
            require(g, key)
        v = default
    if isinstance(v, np.ndarray):
        if v.size and np.all(v == v.flat[0]):
            return int(v.flat[0])
        raise UnsupportedArchitectureError(
            f"{g.path}: per-layer {g.arch}.{key} values are not supported"
        )
    return int(v)


def per_layer_ints(g: GGUFFile, key: str, n_layers: int, default: Any = None) -> tuple[int, ...]:
    """{arch}.{key} per layer: an array of n_layers values, or one value for every layer."""
    v = g.arch_get(key, default)
    if v is None:
        require(g, key)
    if isinstance(v, (np.ndarray, list, tuple)):
        vals = [int(x) for x in np.asarray(v).ravel()]
        if len(vals) != n_layers:
            raise ModelFormatError(
                f"{g.path}: {g.arch}.{key} has {len(vals)} entries for {n_layers} layers"
            )
        return tuple(vals)
    return (int(v),) * n_layers


def swa_layers(g: GGUFFile, n_layers: int, window: int, default_pattern: int) -> tuple[bool, ...]:
    """Which layers attend through the sliding window.

    ``attention.sliding_window_pattern`` as an array: True = sliding window, one per layer; as
    an integer n: layer i slides when i % n < n - 1 (0: every layer), llama.cpp's reading.
    Absent: n = default_pattern (the registry's ``swa_pattern``: llama.cpp's default for the
    architecture, whose converter writes none).  No sliding_window in the file: every layer
    global."""
    if window <= 0:
        return (False,) * n_layers
    pat = g.arch_get("attention.sliding_window_pattern")
    if pat is None:
        pat = default_pattern
    if isinstance(pat, (np.ndarray, list, tuple)):
        pat = [bool(v) for v in np.asarray(pat).ravel()]
        if len(pat) != n_layers:
            raise ModelFormatError(
                f"{g.path}: {g.arch}.attention.sliding_window_pattern has "
                f"{len(pat)} entries for {n_layers} layers"
            )
        return tuple(pat)
    n = int(pat)
    return tuple(n == 0 or i % n < n - 1 for i in range(n_layers))


def _rope_scaling(g: GGUFFile, allow_yarn: bool) -> tuple[float, Yarn | None]:
    """(linear position scale, YaRN or None) from rope.scaling.*."""
    scaling = g.arch_get("rope.scaling.type", "none")
    if scaling == "linear":
        return float(g.arch_get("rope.scaling.factor", 1.0)), None
    if scaling == "yarn" and allow_yarn:
        orig = g.arch_get("rope.scaling.original_context_length")
        factor = g.arch_get("rope.scaling.factor")
        if orig is None or factor is None:
            raise ModelFormatError(
                f"{g.path}: YaRN RoPE scaling without rope.scaling.factor "
                "and rope.scaling.original_context_length"
            )
        return 1.0, Yarn(
            float(factor),
            int(orig),
            float(g.arch_get("rope.scaling.yarn_beta_fast", 32.0) or 32.0),
            float(g.arch_get("rope.scaling.yarn_beta_slow", 1.0) or 1.0),
            float(g.arch_get("rope.scaling.yarn_attn_factor", 0.0) or 0.0),
        )
    if scaling not in ("none", None):
        raise UnsupportedArchitectureError(
            f"{g.path}: RoPE scaling {scaling!r} is not supported yet"
        )
    return 1.0, None


def _d_ff(g: GGUFFile) -> int:
    """feed_forward_length; an all-MoE file (qwen35moe) may carry only the experts' width."""
    if (
        g.arch_get("feed_forward_length") is None
        and g.arch_get("expert_feed_forward_length") is not None
    ):
        return scalar_int(g, "expert_feed_forward_length")
    return scalar_int(g, "feed_forward_length")


def config_fields(
    g: GGUFFile,
    arch: Arch,
    *,
    allow_yarn: bool = False,
    n_kv_heads: int | None = None,
    d_ff: int | None = None,
) -> dict:
    """The fields of ModelConfig every family shares, read from the file's metadata.

    allow_yarn: the family runs YaRN RoPE scaling (otherwise a YaRN file is an
    UnsupportedArchitectureError).  n_kv_heads, d_ff: the values to use where the file holds
    one per layer (Gemma 4), instead of the scalar keys."""
    d_model = int(require(g, "embedding_length"))
    n_heads = scalar_int(g, "attention.head_count")
    n_kv = (
        n_kv_heads if n_kv_heads is not None else scalar_int(g, "attention.head_count_kv", n_heads)
    )
    head_dim = int(g.arch_get("attention.key_length", d_model // n_heads))
    v_dim = int(g.arch_get("attention.value_length", head_dim))
    if v_dim != head_dim:
        raise UnsupportedArchitectureError(
            f"{g.path}: key_length {head_dim} != value_length {v_dim}"
        )
    if n_heads % n_kv:
        raise ModelFormatError(f"{g.path}: {n_heads} heads is not a multiple of {n_kv} kv heads")
    vocab = g.arch_get("vocab_size")
    if vocab is None:
        toks = g.get("tokenizer.ggml.tokens")
        vocab = len(toks) if toks is not None else g.tensor_info("token_embd.weight")[1][0]
    rope_scale, yarn = _rope_scaling(g, allow_yarn)
    return dict(
        arch=g.arch,
        n_layers=int(require(g, "block_count")),
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        d_ff=d_ff if d_ff is not None else _d_ff(g),
        vocab_size=int(vocab),
        context_length=int(g.arch_get("context_length", 4096)),
        norm_eps=float(g.arch_get("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_base=float(g.arch_get("rope.freq_base", 10000.0)),
        rope_dim=int(g.arch_get("rope.dimension_count", head_dim)),
        rope_neox=arch.rope_neox,
        rope_scale=rope_scale,
        rope_yarn=yarn,
        qkv_bias=g.has_tensor("blk.0.attn_q.bias"),
        qk_norm=g.has_tensor("blk.0.attn_q_norm.weight"),
        tied_embeddings=not g.has_tensor("output.weight"),
        sliding_window=int(g.arch_get("attention.sliding_window", 0) or 0),
    )


# ============================================================================ tensors


class Loader:
    """Checked reads of a GGUF's tensors under one name prefix: ``Loader.layer(g, i)`` for the
    tensors of layer i (``blk.{i}.``), ``Loader(g)`` for the model's own.  Every shape is
    checked against what the config says."""

    def __init__(self, g: GGUFFile, prefix: str = ""):
        self.g = g
        self.prefix = prefix

    @classmethod
    def layer(cls, g: GGUFFile, i: int) -> Loader:
        return cls(g, f"blk.{i}.")

    def has(self, name: str) -> bool:
        return self.g.has_tensor(self.prefix + name)

    def error(self, message: str) -> ModelFormatError:
        """A ModelFormatError about this file."""
        return ModelFormatError(f"{self.g.path}: {message}")

    def check(self, name: str, w: QWeight, n_out: int, n_in: int) -> QWeight:
        """w (loaded as name) must be (n_out, n_in)."""
        if (w.n_out, w.n_in) != (n_out, n_in):
            raise self.error(
                f"tensor {self.prefix}{name} has shape ({w.n_out}, {w.n_in}), "
                f"expected ({n_out}, {n_in})"
            )
        return w

    def array(self, name: str, *shape: int) -> np.ndarray:
        """A float32 tensor of exactly this shape (C-contiguous)."""
        a = self.g.load_f32(self.prefix + name)
        if a.shape != shape:
            raise self.error(f"tensor {self.prefix}{name} has shape {a.shape}, expected {shape}")
        return np.ascontiguousarray(a, dtype=np.float32)

    def vec(self, name: str, n: int) -> np.ndarray:
        """A float32 vector (n,): a norm weight, a bias."""
        return self.array(name, n)

    def mat(self, name: str, n_out: int, n_in: int) -> QWeight:
        """A weight matrix (n_out, n_in) in its native kind."""
        return self.check(name, self.g.load_weight(self.prefix + name), n_out, n_in)

    def fused(
        self, *parts: tuple[str, int, int]
    ) -> tuple[QWeight | None, tuple[QWeight | None, ...]]:
        """Matrices (name, n_out, n_in) that read the same input, as one matmul when their kinds
        allow (quant.concat_rows): (fused, (None, ...)), else (None, (the parts)).  Rows are
        independent, so both give the same bits."""
        ws = [self.mat(*p) for p in parts]
        w = concat_rows(ws)
        if w is not None:
            return w, (None,) * len(ws)
        return None, tuple(ws)

    def stacked(self, name: str) -> list[QWeight]:
        """A stacked (n, n_out, n_in) tensor (experts) as one weight per slice."""
        return self.g.load_experts(self.prefix + name)
