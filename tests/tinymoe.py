"""Tiny random-weight Mixture-of-Experts models (transformers), written to GGUF the way
llama.cpp's converter lays them out, so goinfer's logits can be checked against transformers'.

    hf = hf_moe("qwen2moe", seed=0, num_experts=8, num_experts_per_tok=3)
    path = write_moe_gguf(hf, "qwen2moe", tmp / "m.gguf")       # F32, or qtype=Q4_0 ...

Layouts (llama.cpp's converter): experts stacked as blk.N.ffn_{gate,up}_exps (E, F, D) and
ffn_down_exps (E, D, F) (HF's fused gate_up_proj (E, 2F, D) split in half), the router
ffn_gate_inp (E, D) kept F32 even in a quantized file, mixtral written as arch "llama"
with q/k rows permuted for interleaved RoPE; qwen2moe's shared expert as ffn_*_shexp and its
gate ffn_gate_inp_shexp (D,).
"""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch
from tinymodels import CHATML, state_dict, write_attention, write_bpe_tokenizer, write_header, write_output_and_close

# arch -> (config class, model class, GGUF arch)
MOE_CLASSES = {
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", "llama"),
    "qwen2moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", "qwen2moe"),
    "qwen3moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", "qwen3moe"),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", "olmoe"),
}
MOE_ARCHS = list(MOE_CLASSES)


def hf_moe(arch: str, seed: int = 0, n_expert: int = 8, top_k: int = 3, **over):
    """A tiny random transformers MoE model (float32, eager attention)."""
    import transformers

    cfg_name, model_name, _ = MOE_CLASSES[arch]
    kw = dict(vocab_size=320, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=1024, rope_theta=10000.0,
              rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=261, eos_token_id=263,
              pad_token_id=None, num_experts_per_tok=top_k)
    if arch == "mixtral":
        kw.update(num_local_experts=n_expert, intermediate_size=64, sliding_window=None)
    elif arch == "qwen2moe":
        kw.update(num_experts=n_expert, intermediate_size=128, moe_intermediate_size=64,
                  shared_expert_intermediate_size=96, norm_topk_prob=False)
    elif arch == "qwen3moe":
        kw.update(num_experts=n_expert, intermediate_size=128, moe_intermediate_size=64,
                  head_dim=32, norm_topk_prob=True)
    elif arch == "olmoe":
        kw.update(num_experts=n_expert, intermediate_size=96, norm_topk_prob=False)
    kw.update(over)
    cfg = getattr(transformers, cfg_name)(**kw)
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(cfg).eval().to(torch.float32)
    with torch.no_grad():  # widen the tiny default init so logits and routing are not flat
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.15)
            elif "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:  # biases
                p.normal_(0.0, 0.3)
    model.config._attn_implementation = "eager"
    return model


def write_moe_gguf(model, arch: str, path: Path, qtype=None, extra_kv: dict | None = None) -> Path:
    """Write an HF MoE model to GGUF: F32, or the matrices (not the router) in ``qtype``.
    extra_kv: additional {arch}.key -> value metadata (e.g. {"expert_weights_norm": True})."""
    cfg = model.config
    ga = MOE_CLASSES[arch][2]
    sd = state_dict(model)
    E = getattr(cfg, "num_local_experts", None) or cfg.num_experts
    w = gguf.GGUFWriter(str(path), ga)
    H, KV = write_header(w, cfg, arch)
    w.add_expert_count(E)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    if getattr(cfg, "moe_intermediate_size", None) is not None:
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    if getattr(cfg, "shared_expert_intermediate_size", None) is not None:
        w.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)
    for key, value in (extra_kv or {}).items():
        if isinstance(value, bool):
            w.add_bool(f"{ga}.{key}", value)
        elif isinstance(value, int):
            w.add_uint32(f"{ga}.{key}", value)
        else:
            w.add_float32(f"{ga}.{key}", float(value))
    write_bpe_tokenizer(w, cfg.vocab_size, CHATML)

    def t(name, arr):
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        keep_f32 = arr.ndim < 2 or name == "token_embd.weight" or "ffn_gate_inp" in name
        if qtype is not None and not keep_f32:
            w.add_tensor(name, gguf.quants.quantize(arr, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, arr)

    t("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(cfg.num_hidden_layers):
        p, q = f"model.layers.{i}.", f"blk.{i}."
        write_attention(t, sd, p, q, H, KV, interleave=ga == "llama")  # mixtral: llama rows
        t(q + "ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        if p + "mlp.gate_proj.weight" in sd:  # a dense layer (qwen2moe mlp_only_layers)
            for n in ("gate", "up", "down"):
                t(q + f"ffn_{n}.weight", sd[p + f"mlp.{n}_proj.weight"])
            continue
        t(q + "ffn_gate_inp.weight", sd[p + "mlp.gate.weight"])  # (E, D)
        gate_up = sd[p + "mlp.experts.gate_up_proj"]  # (E, 2F, D): gate rows, then up rows
        F = gate_up.shape[1] // 2
        t(q + "ffn_gate_exps.weight", gate_up[:, :F])  # (E, F, D)
        t(q + "ffn_up_exps.weight", gate_up[:, F:])
        t(q + "ffn_down_exps.weight", sd[p + "mlp.experts.down_proj"])  # (E, D, F)
        if p + "mlp.shared_expert_gate.weight" in sd:
            t(q + "ffn_gate_inp_shexp.weight", sd[p + "mlp.shared_expert_gate.weight"].reshape(-1))
            for n in ("gate", "up", "down"):
                t(q + f"ffn_{n}_shexp.weight", sd[p + f"mlp.shared_expert.{n}_proj.weight"])
    write_output_and_close(w, t, sd, cfg)
    return path


def build_moe(arch: str, tmp: Path, seed: int = 0, qtype=None, **over):
    model = hf_moe(arch, seed, **over)
    suffix = "" if qtype is None else f"-{qtype.name}"
    path = write_moe_gguf(model, arch, Path(tmp) / f"tiny-{arch}-{seed}{suffix}.gguf", qtype=qtype)
    return model, path
