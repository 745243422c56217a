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
from tinymodels import CHATML, _interleave_rope_rows, tiny_vocab

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
    sd = {k: v.detach().cpu().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    H, KV = cfg.num_attention_heads, cfg.num_key_value_heads
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // H
    E = getattr(cfg, "num_local_experts", None) or cfg.num_experts
    w = gguf.GGUFWriter(str(path), ga)
    w.add_name(f"tiny-{arch}")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(H)
    w.add_head_count_kv(KV)
    if getattr(cfg, "head_dim", None):
        w.add_key_length(hd)
        w.add_value_length(hd)
    w.add_rope_dimension_count(hd)
    theta = getattr(cfg, "rope_theta", None)
    if theta is None:
        theta = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    w.add_rope_freq_base(float(theta))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
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
    toks, types, merges = tiny_vocab(cfg.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(toks)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(toks.index("<|endoftext|>"))
    w.add_eos_token_id(toks.index("<|im_end|>"))
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)

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
        wq, wk = sd[p + "self_attn.q_proj.weight"], sd[p + "self_attn.k_proj.weight"]
        if ga == "llama":  # mixtral: interleaved RoPE rows
            wq, wk = _interleave_rope_rows(wq, H), _interleave_rope_rows(wk, KV)
        t(q + "attn_norm.weight", sd[p + "input_layernorm.weight"])
        t(q + "attn_q.weight", wq)
        t(q + "attn_k.weight", wk)
        t(q + "attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        t(q + "attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        for n in "qkv":
            b = sd.get(p + f"self_attn.{n}_proj.bias")
            if b is not None:
                t(q + f"attn_{n}.bias", b)
        if p + "self_attn.q_norm.weight" in sd:
            t(q + "attn_q_norm.weight", sd[p + "self_attn.q_norm.weight"])
            t(q + "attn_k_norm.weight", sd[p + "self_attn.k_norm.weight"])
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
    t("output_norm.weight", sd["model.norm.weight"])
    if not cfg.tie_word_embeddings:
        t("output.weight", sd["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def build_moe(arch: str, tmp: Path, seed: int = 0, qtype=None, **over):
    model = hf_moe(arch, seed, **over)
    suffix = "" if qtype is None else f"-{qtype.name}"
    path = write_moe_gguf(model, arch, Path(tmp) / f"tiny-{arch}-{seed}{suffix}.gguf", qtype=qtype)
    return model, path
