"""Mixture-of-Experts models: mixtral (GGUF arch llama with expert tensors), qwen2moe,
qwen3moe, olmoe.

Attention is the llama step's (models/llama.py), hooks and fast path included; only the
feed-forward differs: RMSNorm -> the routed experts of models/experts.py (router, top k,
expert-major GEMMs, the float64 rank-order fold) [+ the shared expert behind a sigmoid gate
(qwen2moe)].  A layer without a router (qwen2moe's mlp_only_layers) runs the dense gated FFN.
olmoe RMS-normalizes q and k over all heads at once (``qk_norm_full``), not per head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from goinfer.models.base import ModelConfig
from goinfer.models.experts import (
    ExpertFields,
    FFNWeights,
    MoEFFN,
    MoEWeights,
    load_moe,
    read_experts,
)
from goinfer.models.family import NO_FFN, LayerWeights
from goinfer.models.llama import LlamaFamily, load_attention
from goinfer.models.llama import load_layer as load_llama_layer
from goinfer.models.loading import Loader, config_fields

if TYPE_CHECKING:
    from goinfer.gguf import GGUFFile
    from goinfer.models.arch import Arch

# ============================================================================ config


@dataclass
class MoEConfig(ModelConfig, ExpertFields):
    qk_norm_full: bool = False  # olmoe: one RMSNorm over all q (k) heads, not per head

    def describe(self) -> str:
        return super().describe() + self.describe_experts()


def read_config(g: GGUFFile, arch: Arch) -> MoEConfig:
    fields = config_fields(g, arch)
    cfg = MoEConfig(**fields, **read_experts(g, arch, fields["n_layers"], fields["d_model"]))
    if cfg.qk_norm:  # per-head (qwen3moe) or over all heads at once (olmoe)?
        _, qn = g.tensor_info("blk.0.attn_q_norm.weight")
        if qn == (cfg.n_heads * cfg.head_dim,) and cfg.n_heads > 1:
            cfg.qk_norm, cfg.qk_norm_full = False, True
    return cfg


# ============================================================================ weights


@dataclass
class MoELayerWeights(LayerWeights):
    """A llama layer whose FFN fields are None when the layer is MoE (``moe`` set)."""

    moe: MoEWeights | None = None
    q_norm_full: np.ndarray | None = None  # (H*hd,) olmoe
    k_norm_full: np.ndarray | None = None  # (KV*hd,)

    def weights(self):
        return super().weights() + (self.moe.weights() if self.moe is not None else [])


def load_layer(g: GGUFFile, cfg: MoEConfig, i: int) -> MoELayerWeights:
    ld, D = Loader.layer(g, i), cfg.d_model
    if not ld.has("ffn_gate_inp.weight"):  # a dense layer inside an MoE model
        L = MoELayerWeights(**vars(load_llama_layer(g, cfg, i)))
    else:
        L = MoELayerWeights(
            **load_attention(ld, cfg),
            ffn_norm=ld.vec("ffn_norm.weight", D),
            **NO_FFN,
            moe=load_moe(ld, cfg, D),
        )
    if cfg.qk_norm_full:
        L.q_norm_full = ld.vec("attn_q_norm.weight", cfg.n_heads * cfg.head_dim)
        L.k_norm_full = ld.vec("attn_k_norm.weight", cfg.n_kv_heads * cfg.head_dim)
    return L


# ============================================================================ the family


class MoEFamily(LlamaFamily):
    """Llama-family attention with a Mixture-of-Experts feed-forward (``self.moe``)."""

    capturable = True
    weight_types = (MoELayerWeights, MoEWeights, FFNWeights)
    read_config = staticmethod(read_config)
    load_layer = staticmethod(load_layer)

    def __init__(
        self,
        g: GGUFFile,
        cfg: MoEConfig,
        ops,
        threads: int,
        progress=None,
        weights: dict | None = None,
    ):
        super().__init__(g, cfg, ops, threads, progress, weights)
        self.moe = MoEFFN(self)

    def qkv(self, L: MoELayerWeights, h):
        q, k, v = super().qkv(L, h)
        if L.q_norm_full is not None:  # olmoe: RMSNorm over all heads
            ops, T, eps, nt = self.ops, h.shape[0], self.cfg.norm_eps, self.threads
            ops.rmsnorm(q.reshape(T, -1), L.q_norm_full, eps, out=q.reshape(T, -1), nthreads=nt)
            ops.rmsnorm(k.reshape(T, -1), L.k_norm_full, eps, out=k.reshape(T, -1), nthreads=nt)
        return q, k, v

    def ffn_block(self, li: int, L: MoELayerWeights, h, out) -> None:
        if L.moe is None:
            self.gated_ffn(L, h, out)
        else:
            self.moe(L.moe, h, out)
