"""gpt-oss (GGUF arch ``gpt-oss``): OpenAI's open-weight MoE models (gpt-oss-20b, -120b).

Per layer (llama.cpp's converter layout; docs/design/families.md):
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

Attention sinks (a learned logit per head, in the softmax's denominator only) go to both
attention kernels (``sinks=``): the exact one adds the sink's weight to its float64 sum, the
fast one folds it once after every key chunk, so a row's bits stay independent of batching,
chunking and threads.  A layer whose sinks are all -inf runs without them (the same bits).
gpt-oss is an MoE family, so its decode steps run the Python path (graph.CAPTURABLE).
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np

from goinfer.errors import ModelFormatError, UnsupportedArchitectureError
from goinfer.models import llama, moe
from goinfer.models.gemma import swa_layers

SWA_PATTERN = 2  # llama.cpp's default for gpt-oss: even layers slide, odd ones are global
SWIGLU_ALPHA = 1.702
SWIGLU_LIMIT = 7.0

# ============================================================================ config


@dataclass
class GptOssConfig(moe.MoEConfig):
    swa_layers: tuple = ()  # per layer: True = sliding window
    swiglu_alpha: float = SWIGLU_ALPHA
    swiglu_limit: float = SWIGLU_LIMIT

    def describe(self) -> str:
        n_local = sum(self.swa_layers)
        return (super().describe() + f", {n_local} sliding-window layers (window "
                f"{self.sliding_window}) + {self.n_layers - n_local} global")


def read_config(g) -> GptOssConfig:
    base = moe.read_config(g, allow_yarn=True)
    cfg = GptOssConfig(**{f.name: getattr(base, f.name) for f in fields(base)})
    if cfg.rope_yarn is not None:
        cfg.rope_yarn = replace(cfg.rope_yarn, truncate=False)
    cfg.rope_neox = True
    cfg.routing = "topk_softmax"
    if cfg.d_ff_shared:
        raise UnsupportedArchitectureError(f"{g.path}: gpt-oss with a shared expert is not supported")
    cfg.swa_layers = swa_layers(g, cfg.n_layers, cfg.sliding_window, SWA_PATTERN)
    return cfg


# ============================================================================ weights


@dataclass
class GptOssLayerWeights(moe.MoELayerWeights):
    bo: np.ndarray | None = None  # (D,) attention output bias
    sinks: np.ndarray | None = None  # (H,) attention sink logits


def _vec(g, name, n):
    return llama._check_vec(name, g.load_f32(name), n)


def _expert_bias(g, name, E, n):
    b = g.load_f32(name)
    if b.shape != (E, n):
        raise ModelFormatError(f"tensor {name} has shape {b.shape}, expected ({E}, {n})")
    return np.ascontiguousarray(b, dtype=np.float32)


def load_layer(g, cfg: GptOssConfig, i: int) -> GptOssLayerWeights:
    p = f"blk.{i}."
    D, E, F, H = cfg.d_model, cfg.n_expert, cfg.d_ff_expert, cfg.n_heads
    attn = llama.load_attention(g, cfg, i)
    if attn["bqkv"] is None:
        raise ModelFormatError(f"{g.path}: gpt-oss layer {i} has no attention biases")
    router = g.load_weight(p + "ffn_gate_inp.weight")
    llama._check_shape(p + "ffn_gate_inp.weight", router, E, D)
    gates, ups, downs = (g.load_experts(p + f"ffn_{n}_exps.weight") for n in ("gate", "up", "down"))
    if not len(gates) == len(ups) == len(downs) == E:
        raise ModelFormatError(f"{g.path}: layer {i} has {len(gates)}/{len(ups)}/{len(downs)} "
                               f"gate/up/down experts, expected {E}")
    bg, bu, bd = (_expert_bias(g, p + f"ffn_{n}_exps.bias", E, m)
                  for n, m in (("gate", F), ("up", F), ("down", D)))
    experts = []
    for e in range(E):
        experts.append(moe._ffn(f"{p}expert {e}", gates[e], ups[e], downs[e], F, D,
                                (bg[e], bu[e], bd[e])))
        gates[e] = ups[e] = None
    sinks = _vec(g, p + "attn_sinks.weight", H)
    if np.isnan(sinks).any() or (sinks == np.inf).any():
        raise ModelFormatError(f"{g.path}: tensor {p}attn_sinks.weight holds NaN or +inf "
                               "(a sink logit must be finite, or -inf for none)")
    return GptOssLayerWeights(
        **attn, ffn_norm=_vec(g, p + "post_attention_norm.weight", D), w_gate_up=None,
        w_gate=None, w_up=None, w_down=None,
        moe=moe.MoEWeights(router, experts, router_bias=_vec(g, p + "ffn_gate_inp.bias", E)),
        bo=_vec(g, p + "attn_output.bias", D),
        sinks=sinks if np.isfinite(sinks).any() else None)  # all -inf: no sinks


# ============================================================================ the family


class GptOssFamily(moe.MoEFamily):
    """Llama attention with biases, sliding windows and sinks; a biased top-k MoE with the
    clamped SwiGLU."""

    read_config = staticmethod(read_config)

    def load_layer(self, g, i: int) -> GptOssLayerWeights:
        return load_layer(g, self.cfg, i)

    def layer_window(self, li: int) -> int:
        return self.cfg.sliding_window if self.cfg.swa_layers[li] else 0

    def layer_sinks(self, li: int, L: GptOssLayerWeights):
        return L.sinks

    def attention_block(self, li, L: GptOssLayerWeights, h, batch, kc, vc, out) -> None:
        super().attention_block(li, L, h, batch, kc, vc, out)
        self.K.add_bias(out, L.bo, out=out, nthreads=self.threads)

    def expert_act(self, gate, up, out):
        cfg = self.cfg
        return self.K.swiglu_oai(gate, up, cfg.swiglu_alpha, cfg.swiglu_limit, out=out,
                                 nthreads=self.threads)
