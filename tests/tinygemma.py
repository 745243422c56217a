"""A tiny random-weight Gemma 3 text model (transformers), written to GGUF the way llama.cpp's
converter writes gemma3, so goinfer's logits can be checked against transformers' on the same
weights.

    hf = hf_model(seed=0, num_hidden_layers=7, sliding_window=8)
    path = write_gguf(hf, tmp_path / "g.gguf")

What the converter does and this writer repeats: every ``*norm.weight`` is stored as 1 + w
(Gemma's RMSNorm multiplies by 1 + w); q/k rows keep the Hugging Face (NeoX) layout; the LM
head is the embedding (no output.weight); metadata has the global RoPE base as
``rope.freq_base``, the window as ``attention.sliding_window``, no layer pattern (readers assume
every 6th layer global), a final logit softcap only when the config has one, linear RoPE
scaling of the global layers as ``rope.scaling.*``; a SentencePiece ("llama") vocabulary with
``add_bos_token`` true and no chat template.
"""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch

# ============================================================================ vocabulary

CONTROL, USER_DEFINED, BYTE, NORMAL = 3, 4, 6, 1
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
WORDS = ["▁the", "▁a", "▁of", "▁is", "▁to", "▁and", "▁in", "▁Hi", "▁Hello", "▁Bye", "▁there",
         "▁brief", "▁Be", "er", "in", "th", "he", "an", "re", "on", "at", "en", "es", "or"]


def tiny_vocab(vocab_size: int):
    """Gemma-like SentencePiece vocab: controls, "\\n", 256 byte tokens, letters, a few words,
    then unused controls.  -> (tokens, scores, types)"""
    toks = list(SPECIALS) + ["\n"]
    types = [CONTROL] * len(SPECIALS) + [USER_DEFINED]
    scores = [-1000.0] * len(toks)
    for b in range(256):
        toks.append(f"<0x{b:02X}>")
        types.append(BYTE)
        scores.append(0.0)
    pieces = ["▁"] + [chr(c) for c in range(ord("a"), ord("z") + 1)] + \
        [chr(c) for c in range(ord("A"), ord("Z") + 1)] + list(".,!?'") + WORDS
    for i, p in enumerate(pieces):
        toks.append(p)
        types.append(NORMAL)
        scores.append(-float(i))
    while len(toks) < vocab_size:
        toks.append(f"<unused{len(toks)}>")
        types.append(CONTROL)
        scores.append(-1000.0)
    if len(toks) != vocab_size:
        raise ValueError(f"vocab_size {vocab_size} is smaller than the {len(toks)} base tokens")
    return toks, scores, types


# ============================================================================ HF model


def hf_model(seed: int = 0, **over):
    """A float32, eager-attention Gemma3ForCausalLM with widened random weights."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    kw = dict(vocab_size=400, hidden_size=64, intermediate_size=128, num_hidden_layers=7,
              num_attention_heads=4, num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=32,
              sliding_window=8, max_position_embeddings=512, rms_norm_eps=1e-6,
              pad_token_id=0, eos_token_id=1, bos_token_id=2, tie_word_embeddings=True,
              attn_implementation="eager")
    kw.update(over)
    cfg = Gemma3TextConfig(**kw)
    torch.manual_seed(seed)
    model = Gemma3ForCausalLM(cfg).eval().to(torch.float32)
    with torch.no_grad():  # random init is tiny (std 0.02, norms 0); widen it so logits are not flat
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.15)
            elif "norm" in name:  # Gemma norms multiply by 1 + w
                p.copy_(0.2 * torch.randn_like(p))
    model.config._attn_implementation = "eager"
    return model


def hf_logits(model, ids) -> np.ndarray:
    with torch.no_grad():
        out = model(torch.tensor([list(ids)], dtype=torch.long))
    return out.logits[0].float().numpy()


# ============================================================================ GGUF writer


def write_gguf(model, path: Path, *, pattern=None, attention_scale=None) -> Path:
    """Write the HF Gemma 3 model as llama.cpp's converter does (F32 tensors).

    pattern / attention_scale: optionally also write ``attention.sliding_window_pattern`` (int or
    per-layer bools) / ``attention.scale`` (the converter writes neither)."""
    cfg = model.config
    sd = {k: v.detach().cpu().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_name("tiny-gemma3")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    full = cfg.rope_parameters["full_attention"]
    w.add_rope_freq_base(float(full["rope_theta"]))
    if full.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(float(full["factor"]))
    if cfg.final_logit_softcapping:
        w.add_final_logit_softcapping(float(cfg.final_logit_softcapping))
    if cfg.sliding_window:
        w.add_sliding_window(int(cfg.sliding_window))
    w.add_head_count_kv(cfg.num_key_value_heads)
    if pattern is not None:
        w.add_sliding_window_pattern(pattern)
    if attention_scale is not None:
        w.add_float32(gguf.Keys.Attention.SCALE.format(arch="gemma3"), float(attention_scale))
    toks, scores, types = tiny_vocab(cfg.vocab_size)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(toks)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(False)

    def t(name, arr):
        if name.endswith("norm.weight"):
            arr = arr + np.float32(1.0)
        w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))

    t("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(cfg.num_hidden_layers):
        p, q = f"model.layers.{i}.", f"blk.{i}."
        t(q + "attn_norm.weight", sd[p + "input_layernorm.weight"])
        t(q + "attn_q.weight", sd[p + "self_attn.q_proj.weight"])
        t(q + "attn_k.weight", sd[p + "self_attn.k_proj.weight"])
        t(q + "attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        t(q + "attn_q_norm.weight", sd[p + "self_attn.q_norm.weight"])
        t(q + "attn_k_norm.weight", sd[p + "self_attn.k_norm.weight"])
        t(q + "attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        t(q + "post_attention_norm.weight", sd[p + "post_attention_layernorm.weight"])
        t(q + "ffn_norm.weight", sd[p + "pre_feedforward_layernorm.weight"])
        t(q + "ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
        t(q + "ffn_up.weight", sd[p + "mlp.up_proj.weight"])
        t(q + "ffn_down.weight", sd[p + "mlp.down_proj.weight"])
        t(q + "post_ffw_norm.weight", sd[p + "post_feedforward_layernorm.weight"])
    t("output_norm.weight", sd["model.norm.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
