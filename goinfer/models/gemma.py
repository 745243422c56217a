"""The Gemma 3 family (GGUF arch ``gemma3``): the text models of Gemma 3, 270M to 27B.

One forward step per layer, on top of the llama step (models/llama.py):
  RMSNorm -> fused QKV -> QK-norm -> RoPE (local or global base) -> write K,V -> attention
  (a sliding window on local layers, full causal on global ones) -> output projection ->
  RMSNorm (post-attention) -> residual -> RMSNorm (pre-FFN) -> fused gate/up -> GeGLU
  (gelu-tanh) -> down -> RMSNorm (post-FFN) -> residual.
Embedding rows are scaled by sqrt(d_model); the LM head is the embedding (tied); a final logit
softcap applies when the file asks for one (``final_logit_softcapping``).  Which layers are
local: ``attention.sliding_window_pattern``, else every 6th layer is global (the registry's
swa_pattern, as llama.cpp assumes for gemma3 and every Gemma 3 checkpoint has it).

Gemma's RMSNorm multiplies by (1 + w).  llama.cpp's converter stores 1 + w in the GGUF (every
``*norm.weight`` tensor, QK-norms included), so here they are plain RMSNorms with the stored
weights; tests/test_gemma.py pins this against transformers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from goinfer.errors import ModelFormatError
from goinfer.models.base import ModelConfig, RopeCache
from goinfer.models.family import LayerWeights
from goinfer.models.llama import LlamaFamily
from goinfer.models.llama import load_layer as load_llama_layer
from goinfer.models.loading import Loader, config_fields, swa_layers

if TYPE_CHECKING:
    from goinfer.gguf import GGUFFile
    from goinfer.models.arch import Arch

ROPE_BASE_LOCAL = 10000.0  # RoPE base of the local (sliding-window) layers

# ============================================================================ config


@dataclass
class Gemma3Config(ModelConfig):
    rope_base_local: float = ROPE_BASE_LOCAL
    attn_scale: float = 0.0  # multiplies q.k
    final_softcap: float = 0.0  # 0: none

    def describe(self) -> str:
        n_local = sum(self.swa_layers)
        return (
            super().describe() + f", {n_local} local layers (window {self.sliding_window}) + "
            f"{self.n_layers - n_local} global"
        )


def read_config(g: GGUFFile, arch: Arch) -> Gemma3Config:
    fields = config_fields(g, arch)
    n = fields["n_layers"]
    fields.update(
        qk_norm=True, swa_layers=swa_layers(g, n, fields["sliding_window"], arch.swa_pattern)
    )
    scale = g.arch_get("attention.scale")
    if scale is None:
        # Gemma 3 scales q.k by query_pre_attn_scalar**-0.5, which GGUF does not carry: it is
        # head_dim in every size but 27B (62 layers), where it is d_model / n_heads.
        scalar = fields["d_model"] // fields["n_heads"] if n == 62 else fields["head_dim"]
        scale = 1.0 / float(np.sqrt(scalar))
    return Gemma3Config(
        **fields,
        attn_scale=float(scale),
        final_softcap=float(g.arch_get("final_logit_softcapping", 0.0) or 0.0),
    )


# ============================================================================ weights


@dataclass
class Gemma3LayerWeights(LayerWeights):
    post_attn_norm: np.ndarray = None  # (D,) f32, applied to the attention output
    post_ffn_norm: np.ndarray = None  # (D,) f32, applied to the FFN output


def load_layer(g: GGUFFile, cfg: Gemma3Config, i: int) -> Gemma3LayerWeights:
    ld, D = Loader.layer(g, i), cfg.d_model
    return Gemma3LayerWeights(
        **vars(load_llama_layer(g, cfg, i)),
        post_attn_norm=ld.vec("post_attention_norm.weight", D),
        post_ffn_norm=ld.vec("post_ffw_norm.weight", D),
    )


# ============================================================================ the family


class Gemma3Family(LlamaFamily):
    """Weights and forward step of Gemma 3 text models (the llama step plus Gemma's parts)."""

    capturable = True
    weight_types = (Gemma3LayerWeights,)
    ffn_act = "gelu_tanh_mul"
    read_config = staticmethod(read_config)
    load_layer = staticmethod(load_layer)

    def __init__(
        self,
        g: GGUFFile,
        cfg: Gemma3Config,
        ops,
        threads: int,
        progress=None,
        weights: dict | None = None,
    ):
        if not g.has_tensor("blk.0.attn_q_norm.weight"):
            raise ModelFormatError(f"{g.path}: gemma3 file without QK-norm tensors")
        super().__init__(g, cfg, ops, threads, progress, weights)
        # Global layers: rope.freq_base with the file's (linear) scaling; local layers: base 10k.
        self.rope_local = RopeCache(cfg.n_rot, cfg.rope_base_local, cfg.context_length)
        self.attn_scale = cfg.attn_scale  # no attention softcap: Gemma 3 has none (Gemma 2 had)
        self.embed_scale = np.float32(np.sqrt(cfg.d_model))
        self.final_softcap = cfg.final_softcap

    def layer_rope(self, li: int) -> RopeCache:
        return self.rope_local if self.cfg.swa_layers[li] else self.rope

    def attention_block(self, li, L: Gemma3LayerWeights, h, batch, kc, vc, out) -> None:
        super().attention_block(li, L, h, batch, kc, vc, out)
        self.ops.rmsnorm(out, L.post_attn_norm, self.cfg.norm_eps, out=out, nthreads=self.threads)

    def ffn_block(self, li, L: Gemma3LayerWeights, h, out) -> None:
        self.gated_ffn(L, h, out)
        self.ops.rmsnorm(out, L.post_ffn_norm, self.cfg.norm_eps, out=out, nthreads=self.threads)
