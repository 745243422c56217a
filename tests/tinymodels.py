"""Tiny random-weight Hugging Face models, written to GGUF the way llama.cpp's converter lays
them out, so goinfer's logits can be checked against transformers' on the same weights.

    hf, path = build("llama", tmp_path)            # transformers model + a GGUF (F32 weights)
"""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch

# ============================================================================ vocabulary


def _byte_chars() -> list[str]:
    """GPT-2's printable stand-in character of every byte."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + n)
            n += 1
    return [chars[b] for b in range(256)]


SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def tiny_vocab(vocab_size: int):
    """Byte-level BPE vocab: 256 byte tokens, a few merges, ChatML specials, padding tokens."""
    toks = _byte_chars()
    types = [1] * 256
    merges = []
    for a, b in [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a")]:
        merges.append(f"{a} {b}")
        toks.append(a + b)
        types.append(1)
    for s in SPECIALS:
        toks.append(s)
        types.append(3)
    while len(toks) < vocab_size:
        toks.append(f"<unused{len(toks)}>")
        types.append(4)
    assert len(toks) == vocab_size
    return toks, types, merges


# ============================================================================ HF models

ARCH_CLASSES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
}


def hf_model(arch: str, seed: int = 0, **over):
    import transformers

    cfg_cls, model_cls = (getattr(transformers, n) for n in ARCH_CLASSES[arch])
    kw = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
              rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
              bos_token_id=256 + 5, eos_token_id=256 + 5 + 2)
    if arch == "qwen3":
        kw["head_dim"] = 32  # qwen3 decouples head_dim from hidden/heads
    if arch == "mistral":
        kw["sliding_window"] = None
    kw.update(over)
    cfg = cfg_cls(**kw)
    torch.manual_seed(seed)
    model = model_cls(cfg).eval().to(torch.float32)
    with torch.no_grad():  # random init is tiny (std 0.02); widen it so logits are not flat
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.15)
            elif "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:  # biases
                p.normal_(0.0, 0.3)
    model.config._attn_implementation = "eager"
    return model


# ============================================================================ GGUF writer


def _interleave_rope_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF q/k rows (rotate-half pairs i, i+hd/2) -> GGUF llama rows (adjacent pairs 2i, 2i+1)."""
    hd = w.shape[0] // n_head
    return w.reshape(n_head, 2, hd // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def state_dict(model) -> dict:
    return {k: v.detach().cpu().numpy().astype(np.float32) for k, v in model.state_dict().items()}


def write_header(w, cfg, arch: str) -> tuple[int, int]:
    """The model keys shared by the llama-style families (names, sizes, RoPE, norm eps);
    returns (heads, kv heads)."""
    H, KV = cfg.num_attention_heads, cfg.num_key_value_heads
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // H
    w.add_name(f"tiny-{arch}")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(H)
    w.add_head_count_kv(KV)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_dimension_count(hd)
    theta = getattr(cfg, "rope_theta", None)
    if theta is None:
        theta = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    w.add_rope_freq_base(float(theta))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    return H, KV


def write_bpe_tokenizer(w, vocab_size: int, chat_template: str | None) -> None:
    toks, types, merges = tiny_vocab(vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(toks)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(toks.index("<|endoftext|>"))
    w.add_eos_token_id(toks.index("<|im_end|>"))
    w.add_add_bos_token(False)
    if chat_template:
        w.add_chat_template(chat_template)


def write_attention(t, sd: dict, p: str, q: str, H: int, KV: int, interleave: bool) -> None:
    """HF layer p's attention (input norm, q/k/v/o, biases, QK-norm) as GGUF blk q, through
    t(name, array); interleave: llama-layout RoPE rows for q and k."""
    wq, wk = sd[p + "self_attn.q_proj.weight"], sd[p + "self_attn.k_proj.weight"]
    if interleave:
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


def write_output_and_close(w, t, sd: dict, cfg) -> None:
    t("output_norm.weight", sd["model.norm.weight"])
    if not cfg.tie_word_embeddings:
        t("output.weight", sd["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_gguf(model, arch: str, path: Path, gguf_arch: str | None = None,
               chat_template: str | None = CHATML, qtype=None) -> Path:
    """Write an HF llama/mistral/qwen2/qwen3 model to GGUF: F32 tensors, or the 2-D weights of
    the layers and the output in ``qtype`` (a gguf.GGMLQuantizationType) when given."""
    cfg = model.config
    ga = gguf_arch or ("llama" if arch == "mistral" else arch)
    sd = state_dict(model)
    w = gguf.GGUFWriter(str(path), ga)
    H, KV = write_header(w, cfg, arch)
    if getattr(cfg, "sliding_window", None) and arch == "mistral":
        w.add_sliding_window(cfg.sliding_window)
    write_bpe_tokenizer(w, cfg.vocab_size, chat_template)

    def t(name, arr):
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if qtype is not None and arr.ndim == 2 and name != "token_embd.weight":
            w.add_tensor(name, gguf.quants.quantize(arr, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, arr)

    t("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(cfg.num_hidden_layers):
        p, q = f"model.layers.{i}.", f"blk.{i}."
        write_attention(t, sd, p, q, H, KV, interleave=ga in ("llama", "mistral"))
        t(q + "ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        t(q + "ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
        t(q + "ffn_up.weight", sd[p + "mlp.up_proj.weight"])
        t(q + "ffn_down.weight", sd[p + "mlp.down_proj.weight"])
    write_output_and_close(w, t, sd, cfg)
    return path


def build(arch: str, tmp: Path, seed: int = 0, **over):
    model = hf_model(arch, seed, **over)
    path = write_gguf(model, arch, Path(tmp) / f"tiny-{arch}-{seed}.gguf")
    return model, path


def load(path, reference=False, threads=1, kv_dtype="f32", **kw):
    """A goinfer Model of a tiny GGUF (reference=True: the NumPy reference kernels).  Its KV
    caches are float32 by default: these models are compared with transformers' float32 within
    float32 summation tolerance (close()); the storage types' own distance is tested in
    test_models.py (test_kv_dtype_*)."""
    from goinfer.gguf import GGUFFile
    from goinfer.model import Model

    return Model(GGUFFile(path), threads=threads, progress=False, _reference_kernels=reference,
                 kv_dtype=kv_dtype, **kw)


def close(ours, ref):
    """Logits within float32 tolerance of transformers': |diff| <= 1e-4 * logit scale + 1e-5
    (both compute in float32 and differ by summation order)."""
    scale = float(np.abs(ref).max())
    err = float(np.abs(ours - ref).max())
    assert err <= 1e-4 * scale + 1e-5, f"max |diff| {err} vs logit scale {scale}"


def hf_logits(model, ids) -> np.ndarray:
    with torch.no_grad():
        out = model(torch.tensor([list(ids)], dtype=torch.long))
    return out.logits[0].float().numpy()


def prefill_chunks(model, ids, cuts, block_size: int = 16) -> np.ndarray:
    """Prefill ids into a fresh session in pieces cut at `cuts` -> logits of the last token
    (the bit-identity properties compare this with one call and with decode steps)."""
    from goinfer import KVCache

    s = model.session(KVCache(model, max_tokens=len(ids) + 64, block_size=block_size))
    prev, last = 0, None
    for c in list(cuts) + [len(ids)]:
        if c > prev:
            last = s.prefill(ids[prev:c])
            prev = c
    return last


def assert_one_prefill_is_every_schedule(m1, m2, ids, cuts) -> None:
    """m1 (1 thread) and m2 (2 threads) of one model: one prefill == 2 threads == the prefill
    cut at `cuts` == a prefill then decode steps for the last up to 40 tokens, bit for bit."""
    from goinfer import KVCache

    one = prefill_chunks(m1, ids, [])
    assert np.array_equal(one, prefill_chunks(m2, ids, []))
    assert np.array_equal(one, prefill_chunks(m2, ids, cuts))
    s = m1.session(KVCache(m1, max_tokens=1024))
    k = max(1, len(ids) - 40)
    last = s.prefill(ids[:k])
    for t in ids[k:]:
        last = s.decode(t)
    assert np.array_equal(one, last)
