"""The Gemma 3 family (GGUF arch ``gemma3``): the text models of Gemma 3, 270M to 27B.

One forward step per layer, on top of the llama step (models/llama.py):
  RMSNorm -> fused QKV -> QK-norm -> RoPE (local or global base) -> write K,V -> attention
  (a sliding window on local layers, full causal on global ones) -> output projection ->
  RMSNorm (post-attention) -> residual -> RMSNorm (pre-FFN) -> fused gate/up -> GeGLU
  (gelu-tanh) -> down -> RMSNorm (post-FFN) -> residual.
Embedding rows are scaled by sqrt(d_model); the LM head is the embedding (tied); a final logit
softcap applies when the file asks for one (``final_logit_softcapping``).

Gemma's RMSNorm multiplies by (1 + w).  llama.cpp's converter stores 1 + w in the GGUF (every
``*norm.weight`` tensor, QK-norms included), so here they are plain RMSNorms with the stored
weights; tests/test_gemma.py pins this against transformers.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from goinfer.errors import ModelFormatError
from goinfer.models import llama
from goinfer.models.base import ModelConfig, RopeCache

SWA_PATTERN = 6  # no pattern in the file: every 6th layer is global (all Gemma 3 checkpoints)
ROPE_BASE_LOCAL = 10000.0  # RoPE base of the local (sliding-window) layers

# ============================================================================ config


@dataclass
class Gemma3Config(ModelConfig):
    swa_layers: tuple = ()  # per layer: True = local (sliding-window) attention
    rope_base_local: float = ROPE_BASE_LOCAL
    attn_scale: float = 0.0  # multiplies q.k
    final_softcap: float = 0.0  # 0: none

    def describe(self) -> str:
        n_local = sum(self.swa_layers)
        return (super().describe() + f", {n_local} local layers (window {self.sliding_window}) + "
                f"{self.n_layers - n_local} global")


def swa_layers(g, n_layers: int, window: int, default_pattern: int = SWA_PATTERN) -> tuple:
    """Which layers attend through the sliding window.

    ``attention.sliding_window_pattern`` as an array: True = sliding window, one per layer; as
    an integer n: layer i is local when i % n < n - 1 (0: every layer local), llama.cpp's
    reading.  Absent: n = default_pattern (6, as llama.cpp assumes for gemma3: the converter
    writes no pattern, and every Gemma 3 config has it).  No sliding_window in the file: every
    layer global."""
    if window <= 0:
        return (False,) * n_layers
    pat = g.arch_get("attention.sliding_window_pattern")
    if pat is None:
        pat = default_pattern
    if isinstance(pat, (np.ndarray, list, tuple)):
        pat = [bool(v) for v in np.asarray(pat).ravel()]
        if len(pat) != n_layers:
            raise ModelFormatError(f"{g.path}: {g.arch}.attention.sliding_window_pattern has "
                                   f"{len(pat)} entries for {n_layers} layers")
        return tuple(pat)
    n = int(pat)
    return tuple(n == 0 or i % n < n - 1 for i in range(n_layers))


def read_config(g) -> Gemma3Config:
    base = llama.read_config(g)
    fields = dict(vars(base))
    fields["rope_neox"] = True
    fields["qk_norm"] = True
    n = base.n_layers
    swa = swa_layers(g, n, base.sliding_window)
    scale = g.arch_get("attention.scale")
    if scale is None:
        # Gemma 3 scales q.k by query_pre_attn_scalar**-0.5, which GGUF does not carry: it is
        # head_dim in every size but 27B (62 layers), where it is d_model / n_heads.
        scalar = base.d_model // base.n_heads if n == 62 else base.head_dim
        scale = 1.0 / float(np.sqrt(scalar))
    return Gemma3Config(
        **fields, swa_layers=swa,
        attn_scale=float(scale),
        final_softcap=float(g.arch_get("final_logit_softcapping", 0.0) or 0.0))


# ============================================================================ weights


@dataclass
class Gemma3LayerWeights(llama.LayerWeights):
    post_attn_norm: np.ndarray = None  # (D,) f32, applied to the attention output
    post_ffn_norm: np.ndarray = None  # (D,) f32, applied to the FFN output


# ============================================================================ the family


class Gemma3Family(llama.LlamaFamily):
    """Weights and forward step of Gemma 3 text models (the llama step plus Gemma's parts)."""

    read_config = staticmethod(read_config)
    ffn_act = "gelu_tanh_mul"

    def __init__(self, g, cfg: Gemma3Config, kernels, threads: int, progress=None,
                 weights: dict | None = None):
        if not g.has_tensor("blk.0.attn_q_norm.weight"):
            raise ModelFormatError(f"{g.path}: gemma3 file without QK-norm tensors")
        super().__init__(g, cfg, kernels, threads, progress, weights)
        # Global layers: rope.freq_base with the file's (linear) scaling; local layers: base 10k.
        self.rope_local = RopeCache(cfg.n_rot, cfg.rope_base_local, cfg.context_length)
        self.attn_scale = cfg.attn_scale  # no attention softcap: Gemma 3 has none (Gemma 2 had)
        self.embed_scale = np.float32(np.sqrt(cfg.d_model))

    def load_layer(self, g, i: int) -> Gemma3LayerWeights:
        L = super().load_layer(g, i)
        p, D = f"blk.{i}.", self.cfg.d_model
        return Gemma3LayerWeights(
            **vars(L),
            post_attn_norm=llama._check_vec(p + "post_attention_norm.weight",
                                            g.load_f32(p + "post_attention_norm.weight"), D),
            post_ffn_norm=llama._check_vec(p + "post_ffw_norm.weight",
                                           g.load_f32(p + "post_ffw_norm.weight"), D))

    # ------------------------------------------------------------------ per-layer attention

    def layer_rope(self, li: int) -> RopeCache:
        return self.rope_local if self.cfg.swa_layers[li] else self.rope

    def layer_window(self, li: int) -> int:
        return self.cfg.sliding_window if self.cfg.swa_layers[li] else 0

    # ------------------------------------------------------------------ forward hooks

    def embed(self, tokens: np.ndarray, out: np.ndarray) -> np.ndarray:
        x = super().embed(tokens, out)  # (T, D)
        return self.K.scale(x, self.embed_scale, out=x, nthreads=self.threads)

    def attention_block(self, li, L: Gemma3LayerWeights, h, batch, kc, vc, out) -> None:
        super().attention_block(li, L, h, batch, kc, vc, out)
        self.K.rmsnorm(out, L.post_attn_norm, self.cfg.norm_eps, out=out, nthreads=self.threads)

    def ffn_block(self, li, L: Gemma3LayerWeights, h, out) -> None:
        super().ffn_block(li, L, h, out)
        self.K.rmsnorm(out, L.post_ffn_norm, self.cfg.norm_eps, out=out, nthreads=self.threads)

    def head(self, x: np.ndarray, rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        logits = super().head(x, rows, out)  # (R, vocab)
        cap = self.cfg.final_softcap
        if cap > 0:  # tanh(logits / cap) * cap, per element (a kernel: graph-captured too)
            self.K.softcap(logits, cap, out=logits, nthreads=self.threads)
        return logits
