"""gpt-oss (GGUF arch ``gpt-oss``): OpenAI's open-weight MoE models (gpt-oss-20b, -120b).

Per layer (llama.cpp's converter layout; docs/design/families.md), the llama step (models/llama.py)
with the routed experts of models/experts.py:
  h = RMSNorm(x, attn_norm)
  q, k, v = h attn_{q,k,v} + bias;  q, k = RoPE_neox(YaRN)       # biases on q, k, v and o
  a = attention(q, K, V; sliding window on even layers, full on odd ones; per-head sinks)
  x = x + (a attn_output + attn_output.bias)
  h = RMSNorm(x, post_attention_norm)
  logits = h ffn_gate_inp + bias;  the top k experts, softmax over their logits
  per expert: g = h ffn_gate + b, u = h ffn_up + b,  f = min(g, 7) sigmoid(1.702 min(g, 7))
              (clamp(u, -7, 7) + 1),  y = f ffn_down + b          # (swiglu_oai kernel)
  x = x + sum_r w_r y_r
logits = RMSNorm(x, output_norm) output

Expert matrices come as GGUF MXFP4 (what OpenAI ships) and run natively as the int8 path's
``mxfp4`` kind; the other weights in whatever type the file holds.  YaRN (factor 32 over
4096 positions) with the correction range not truncated, as gpt-oss's own config says
(``truncate: false``; the GGUF carries no key for it).  The clamped SwiGLU's alpha and limit
are not in the GGUF either: llama.cpp fixes them at 1.702 and 7.0, as every gpt-oss has them.
Which layers slide: every even one (the registry's swa_pattern 2, llama.cpp's default), unless
the file gives ``attention.sliding_window_pattern``.

Attention sinks (a learned logit per head, in the softmax's denominator only) go to both
attention kernels (``sinks=``): the exact one adds the sink's weight to its float64 sum, the
fast one folds it once after every key chunk, so a row's bits stay independent of batching,
chunking and threads.  A layer whose sinks are all -inf runs without them (the same bits).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from goinfer.errors import ModelFormatError, UnsupportedArchitectureError
from goinfer.models.base import ModelConfig
from goinfer.models.experts import (
    ExpertFields,
    FFNWeights,
    MoEFFN,
    MoEWeights,
    load_moe,
    read_experts,
)
from goinfer.models.family import NO_FFN
from goinfer.models.llama import LlamaFamily, load_attention
from goinfer.models.loading import Loader, config_fields, swa_layers
from goinfer.models.moe import MoELayerWeights

if TYPE_CHECKING:
    from goinfer.gguf import GGUFFile
    from goinfer.models.arch import Arch

SWIGLU_ALPHA = 1.702
SWIGLU_LIMIT = 7.0

# ============================================================================ config


@dataclass
class GptOssConfig(ModelConfig, ExpertFields):
    swiglu_alpha: float = SWIGLU_ALPHA
    swiglu_limit: float = SWIGLU_LIMIT

    def describe(self) -> str:
        n_local = sum(self.swa_layers)
        return (
            super().describe() + self.describe_experts() + f", {n_local} sliding-window "
            f"layers (window {self.sliding_window}) + {self.n_layers - n_local} global"
        )


def read_config(g: GGUFFile, arch: Arch) -> GptOssConfig:
    fields = config_fields(g, arch, allow_yarn=True)
    experts = read_experts(g, arch, fields["n_layers"], fields["d_model"])
    if experts["d_ff_shared"]:
        raise UnsupportedArchitectureError(
            f"{g.path}: gpt-oss with a shared expert is not supported"
        )
    if fields["rope_yarn"] is not None:
        fields["rope_yarn"] = replace(fields["rope_yarn"], truncate=False)
    fields["swa_layers"] = swa_layers(
        g, fields["n_layers"], fields["sliding_window"], arch.swa_pattern
    )
    return GptOssConfig(**fields, **experts)


# ============================================================================ weights


@dataclass
class GptOssLayerWeights(MoELayerWeights):
    bo: np.ndarray | None = None  # (D,) attention output bias
    sinks: np.ndarray | None = None  # (H,) attention sink logits


def load_layer(g: GGUFFile, cfg: GptOssConfig, i: int) -> GptOssLayerWeights:
    ld, D = Loader.layer(g, i), cfg.d_model
    attn = load_attention(ld, cfg)
    if attn["bqkv"] is None:
        raise ModelFormatError(f"{g.path}: gpt-oss layer {i} has no attention biases")
    moe = load_moe(ld, cfg, D, biases=True)
    sinks = ld.vec("attn_sinks.weight", cfg.n_heads)
    if np.isnan(sinks).any() or (sinks == np.inf).any():
        raise ld.error(
            f"tensor {ld.prefix}attn_sinks.weight holds NaN or +inf "
            "(a sink logit must be finite, or -inf for none)"
        )
    return GptOssLayerWeights(
        **attn,
        ffn_norm=ld.vec("post_attention_norm.weight", D),
        **NO_FFN,
        moe=moe,
        bo=ld.vec("attn_output.bias", D),
        sinks=sinks if np.isfinite(sinks).any() else None,
    )  # all -inf: no sinks


# ============================================================================ the family


class GptOssFamily(LlamaFamily):
    """Llama attention with biases, sliding windows and sinks; a biased top-k MoE with the
    clamped SwiGLU."""

    capturable = True
    weight_types = (GptOssLayerWeights, MoEWeights, FFNWeights)
    read_config = staticmethod(read_config)
    load_layer = staticmethod(load_layer)

    def __init__(
        self,
        g: GGUFFile,
        cfg: GptOssConfig,
        ops,
        threads: int,
        progress=None,
        weights: dict | None = None,
    ):
        super().__init__(g, cfg, ops, threads, progress, weights)
        self.moe = MoEFFN(self, "swiglu_oai", (cfg.swiglu_alpha, cfg.swiglu_limit))

    def layer_sinks(self, li: int, L: GptOssLayerWeights):
        return L.sinks

    def attention_block(self, li, L: GptOssLayerWeights, h, batch, kc, vc, out) -> None:
        super().attention_block(li, L, h, batch, kc, vc, out)
        self.ops.add_bias(out, L.bo, out=out, nthreads=self.threads)

    def ffn_block(self, li: int, L: GptOssLayerWeights, h, out) -> None:
        self.moe(L.moe, h, out)
