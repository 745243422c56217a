"""Tiny random-weight Hugging Face models of the newer families (SmolLM3, Qwen3.5, ...), written
to GGUF by llama.cpp's own converter (convert_hf_to_gguf.py), built once and cached.

    hf, path = build("qwen35", seed=0)           # transformers model (float32) + its GGUF (F32)
    hf_logits(hf, ids)                           # transformers' logits, float32

Why the real converter: the tensor layouts, renames and metadata of these families (Qwen3.5's
V-head reordering, its "+1" norms, the ssm_* keys; SmolLM3's permuted q/k rows) are exactly
what goinfer must read; a hand-written writer would repeat our own assumptions.

Where the converter comes from (the first that exists):
  1. $GOINFER_CONVERTER: a llama.cpp source directory (convert_hf_to_gguf.py, conversion/,
     gguf-py/), e.g. the peers setup's /tmp/peers-build/sdist/.../vendor/llama.cpp;
  2. the cache: $GOINFER_HOME/test-fixtures/llama.cpp-<version>/ (the files below, extracted);
  3. PyPI: ``pip download --no-deps --no-binary :all: llama-cpp-python==<version>`` (76 MB,
     about 15 s), of which only convert_hf_to_gguf.py, conversion/, gguf-py/, LICENSE (MIT),
     models/templates/ and a few models/ggml-vocab-* files are kept in the cache (3 MB + vocabs).
The converter runs in a subprocess with the sdist's own gguf-py first on sys.path (it needs a
newer gguf package than the one goinfer reads files with).

Tokenizer: the converter needs one in the HF directory.  A tiny byte-level BPE (256 byte tokens,
a few merges, the family's special tokens, the family's real chat template from llama.cpp's
models/templates) is built with `tokenizers`.  Its pre-tokenizer hash is unknown to the
converter (which identifies real vocabularies by hashing their output on a test string), so
the subprocess tells it the family's pre-tokenizer name (``qwen35``, ``llama-bpe``) instead of
hashing: nothing else of the conversion is touched.

Built fixtures live in $GOINFER_HOME/test-fixtures/<family>-<key>/ (hf/ and model.gguf), keyed
by a hash of the family, the config, the seed, the converter version and this file; a build
is written to a temporary directory and renamed into place, under a file lock.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np

LLAMA_CPP_PYTHON = "0.3.36"
_SDIST_ROOT = f"llama_cpp_python-{LLAMA_CPP_PYTHON}/vendor/llama.cpp/"
# members of the sdist kept in the cache (prefixes under vendor/llama.cpp/)
VOCABS = ("qwen35", "llama-bpe", "gemma-4")  # llama.cpp's tokenizer test vocabularies kept
_KEEP = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/", "LICENSE", "models/templates/") + tuple(
    f"models/ggml-vocab-{v}.gguf" for v in VOCABS)  # .gguf, .gguf.inp, .gguf.out
_PEERS = Path(f"/tmp/peers-build/sdist/llama_cpp_python-{LLAMA_CPP_PYTHON}/vendor/llama.cpp")


def fixtures_home() -> Path:
    from goinfer.hub import goinfer_home as home

    d = home() / "test-fixtures"
    d.mkdir(parents=True, exist_ok=True)
    return d


@contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# ============================================================================ the converter


def _complete(d: Path) -> bool:
    return ((d / "convert_hf_to_gguf.py").is_file() and (d / "conversion").is_dir()
            and (d / "gguf-py" / "gguf").is_dir()
            and all((d / "models" / f"ggml-vocab-{v}.gguf.out").is_file() for v in VOCABS))


def converter_dir() -> Path:
    """A llama.cpp directory holding convert_hf_to_gguf.py (see the module docstring)."""
    env = os.environ.get("GOINFER_CONVERTER")
    if env:
        if not _complete(Path(env)):
            raise FileNotFoundError(f"GOINFER_CONVERTER={env} has no convert_hf_to_gguf.py, "
                                    "conversion/ and gguf-py/")
        return Path(env)
    cached = fixtures_home() / f"llama.cpp-{LLAMA_CPP_PYTHON}"
    if _complete(cached):
        return cached
    if _complete(_PEERS):
        return _PEERS
    with _locked(fixtures_home() / ".converter.lock"):
        if not _complete(cached):
            if cached.exists():  # an older cache without some of the files kept now
                shutil.rmtree(cached)
            _download(cached)
    return cached


def _download(dest: Path) -> None:
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary",
                        ":all:", f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", tmp],
                       check=True)
        sdist = Path(tmp) / f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"
        out = Path(tmp) / "llama.cpp"
        with tarfile.open(sdist) as tf:
            for m in tf.getmembers():
                if not m.name.startswith(_SDIST_ROOT) or not m.isfile():
                    continue
                rel = m.name[len(_SDIST_ROOT):]
                if not rel.startswith(_KEEP) or "/tests/" in rel:
                    continue
                target = out / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                with tf.extractfile(m) as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst)
        os.replace(out, dest)


def template(name: str) -> str:
    """A chat template shipped with llama.cpp (models/templates/<name>.jinja)."""
    return (converter_dir() / "models" / "templates" / f"{name}.jinja").read_text(encoding="utf-8")


_RUNNER = r"""
import os, runpy, sys
root = sys.argv.pop(1)
sys.path.insert(0, root)
sys.path.insert(1, os.path.join(root, "gguf-py"))
import conversion.base as base
pre = os.environ["GOINFER_TEST_PRE"]
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
sys.argv[0] = os.path.join(root, "convert_hf_to_gguf.py")
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def convert(hf_dir: Path, out: Path, pre: str, *extra: str) -> Path:
    """Run llama.cpp's convert_hf_to_gguf.py on hf_dir -> out (F32 unless extra says otherwise)."""
    root = converter_dir()
    env = dict(os.environ, GOINFER_TEST_PRE=pre, PYTHONPATH="")
    args = [sys.executable, "-c", _RUNNER, str(root), str(hf_dir), "--outfile", str(out)]
    if not any(a.startswith("--outtype") for a in extra):
        args += ["--outtype", "f32"]
    r = subprocess.run(args + list(extra), env=env, capture_output=True, text=True)
    if r.returncode != 0 or not out.is_file():
        raise RuntimeError(f"convert_hf_to_gguf.py failed ({r.returncode}):\n{r.stderr[-4000:]}")
    return out


# ============================================================================ tokenizer


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


MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("o", "n"), ("e", "r")]


# o200k's split regex (gpt-oss's tokenizer.json; llama.cpp's pre-tokenizer "gpt-4o")
O200K_REGEX = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def write_tokenizer(d: Path, specials: list[str], bos: str | None, eos: str, pad: str | None,
                    chat_template: str | None, vocab_size: int, regex: str | None = None,
                    append: str | None = None) -> None:
    """A byte-level BPE tokenizer (tokenizer.json + tokenizer_config.json) in d: 256 byte
    tokens, MERGES, the special tokens, <unusedN> fillers up to vocab_size.  regex: the split
    regex of the pre-tokenizer (None: GPT-2's, ByteLevel's own).  append: a special token
    the tokenizer's post-processor appends to every text (Qwen3-Embedding's <|endoftext|>)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = {c: i for i, c in enumerate(_byte_chars())}
    for a, b in MERGES:
        vocab[a + b] = len(vocab)
    base = len(vocab)
    n_fill = vocab_size - base - len(specials)
    if n_fill < 0:
        raise ValueError(f"vocab_size {vocab_size} < {base + len(specials)}")
    for i in range(n_fill):
        vocab[f"<unused{i}>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=list(MERGES)))
    if regex is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    if append is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"$A {append}", pair=f"$A {append} $B:1 {append}:1",
            special_tokens=[(append, tok.token_to_id(append))])
    d.mkdir(parents=True, exist_ok=True)
    tok.save(str(d / "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos, "bos_token": bos,
           "pad_token": pad, "model_max_length": 4096, "add_bos_token": False,
           "clean_up_tokenization_spaces": False}
    if chat_template:
        cfg["chat_template"] = chat_template
    (d / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1), encoding="utf-8")


# ============================================================================ families

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
                 "<think>", "</think>", "<tool_response>", "</tool_response>"]
SMOLLM3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>",
                    "<think>", "</think>", "<tool_call>", "</tool_call>"]


def _qwen35_config(**over):
    from transformers import Qwen3_5TextConfig

    kw = dict(vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=2, head_dim=32,
              linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
              linear_value_head_dim=16, linear_conv_kernel_dim=4, max_position_embeddings=2048,
              rms_norm_eps=1e-6, tie_word_embeddings=False,
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                               "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1],
                               "mrope_interleaved": True},
              bos_token_id=None, eos_token_id=258 + len(MERGES), pad_token_id=None)
    kw.update(over)
    return Qwen3_5TextConfig(**kw)


def _qwen35moe_config(**over):
    from transformers import Qwen3_5MoeTextConfig

    kw = dict(vocab_size=320, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
              linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
              moe_intermediate_size=32, shared_expert_intermediate_size=48, num_experts=6,
              num_experts_per_tok=3, max_position_embeddings=2048, rms_norm_eps=1e-6,
              tie_word_embeddings=False,
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                               "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1],
                               "mrope_interleaved": True},
              bos_token_id=None, eos_token_id=258 + len(MERGES), pad_token_id=None)
    kw.update(over)
    return Qwen3_5MoeTextConfig(**kw)


def _qwen3_config(**over):
    from transformers import Qwen3Config

    kw = dict(vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=True,
              rope_theta=10000.0, bos_token_id=None, eos_token_id=256 + len(MERGES),
              pad_token_id=None)
    kw.update(over)
    return Qwen3Config(**kw)


def _smollm3_config(**over):
    from transformers import SmolLM3Config

    kw = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
              rms_norm_eps=1e-6, tie_word_embeddings=True,
              rope_parameters={"rope_type": "default", "rope_theta": 5e6},
              bos_token_id=256 + len(MERGES), eos_token_id=259 + len(MERGES), pad_token_id=None)
    kw.update(over)
    return SmolLM3Config(**kw)


GPT_OSS_SPECIALS = ["<|startoftext|>", "<|endoftext|>", "<|start|>", "<|end|>", "<|message|>",
                    "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>"]


def _gpt_oss_config(**over):
    from transformers import GptOssConfig

    kw = dict(vocab_size=320, hidden_size=64, intermediate_size=64, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_local_experts=4,
              num_experts_per_tok=2, sliding_window=8, max_position_embeddings=4096,
              rms_norm_eps=1e-5, tie_word_embeddings=False,
              rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
                               "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                               "original_max_position_embeddings": 4096},
              bos_token_id=256 + len(MERGES), eos_token_id=263 + len(MERGES), pad_token_id=None)
    kw.update(over)
    return GptOssConfig(**kw)


# Gemma 4: its tokenizer model is "gemma4" (SentencePiece-style BPE with byte fallback), which
# the converter reads with transformers (LlamaHfVocab), not the byte-level BPE above.
GEMMA4_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<|tool>", "<tool|>",
                   "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>", '<|"|>',
                   "<|think|>", "<|channel>", "<channel|>", "<|turn>", "<turn|>"]
GEMMA4_MERGES = [("▁", "t"), ("h", "e"), ("▁t", "he"), ("i", "n"), ("▁", "a"),
                 ("o", "n"), ("e", "r"), ("\n", "\n")]


def write_gemma4_tokenizer(d: Path, chat_template: str | None, vocab_size: int) -> None:
    """A tiny Gemma-4-style tokenizer in d: the family's special tokens first (ids 0..16:
    pad, eos, bos, unk, ...), 256 <0xXX> byte tokens, "▁" and printable ASCII as single
    characters, GEMMA4_MERGES, <unusedN> fillers; spaces become "▁", text is split only
    at newline runs, characters without a token fall back to bytes (as the real one)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    vocab = {t: i for i, t in enumerate(GEMMA4_SPECIALS)}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for c in ["\u2581", "\n"] + [chr(i) for i in range(33, 127)]:
        vocab.setdefault(c, len(vocab))
    for a, b in GEMMA4_MERGES:
        vocab.setdefault(a + b, len(vocab))
    n_fill = vocab_size - len(vocab)
    if n_fill < 0:
        raise ValueError(f"vocab_size {vocab_size} < {len(vocab)}")
    for i in range(n_fill):
        vocab[f"<unused{i}>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=list(GEMMA4_MERGES), byte_fallback=True,
                               unk_token="<unk>"))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("\n+"), behavior="isolated", invert=False)
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse()])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in GEMMA4_SPECIALS])
    d.mkdir(parents=True, exist_ok=True)
    tok.save(str(d / "tokenizer.json"))
    cfg = {"tokenizer_class": "GemmaTokenizerFast", "eos_token": "<eos>", "bos_token": "<bos>",
           "pad_token": "<pad>", "unk_token": "<unk>", "model_max_length": 4096,
           "add_bos_token": True, "clean_up_tokenization_spaces": False,
           # control tokens of the real vocabulary (the converter makes the tool/channel
           # markers user-defined itself)
           "extra_special_tokens": ["<|tool>", "<tool|>", "<|think|>", "<|turn>", "<turn|>"]}
    if chat_template:
        cfg["chat_template"] = chat_template
    (d / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1), encoding="utf-8")


def _gemma4_config(**over):
    """6 layers: sliding x 3, global, sliding, global (window 8); sliding heads 4 x 16 (2 kv),
    global heads 4 x 32 with 1 kv head whose keys are also the values (attention_k_eq_v: no
    v_proj); proportional RoPE (a quarter of the global dims rotate); the last 2 layers reuse
    the KV of layers 2 (sliding) and 3 (global) and have a double-wide MLP; per-layer
    embeddings of width 8; final logit softcap 30.  (llama.cpp takes the reused layers at fixed
    offsets, the own-KV layers' last two must be sliding then global, as in the real models.)"""
    from transformers import Gemma4TextConfig

    kw = dict(vocab_size=400, hidden_size=64, intermediate_size=96, num_hidden_layers=6,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
              num_global_key_value_heads=1, attention_k_eq_v=True, sliding_window=8,
              layer_types=["sliding_attention"] * 3 + ["full_attention", "sliding_attention",
                                                       "full_attention"],
              num_kv_shared_layers=2, use_double_wide_mlp=True, hidden_size_per_layer_input=8,
              vocab_size_per_layer_input=400, final_logit_softcapping=30.0,
              max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=True,
              rope_parameters={
                  "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                  "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                     "rope_theta": 1000000.0}},
              pad_token_id=0, eos_token_id=1, bos_token_id=2)
    kw.update(over)
    return Gemma4TextConfig(**kw)


# Gemma 4 MoE (as 26B-A4B: no per-layer embeddings, no KV sharing): 4 layers sliding, global,
# sliding, global; 4 experts (ffn 32), top 2, beside the dense MLP (ffn 96) in every layer
GEMMA4_MOE = dict(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32,
                  num_hidden_layers=4, layer_types=["sliding_attention", "full_attention"] * 2,
                  num_kv_shared_layers=0, use_double_wide_mlp=False, hidden_size_per_layer_input=0)


# family -> (config maker, model class name, pre-tokenizer, specials, bos, eos, template, flags)
FAMILIES = {
    # with pooling=... built as Qwen3-Embedding is: tied embeddings, a sentence-transformers
    # Pooling module, a tokenizer that appends <|endoftext|>
    "qwen3": (_qwen3_config, "Qwen3ForCausalLM", "qwen2", QWEN_SPECIALS, None, "<|im_end|>",
              "Qwen-Qwen3-0.6B", ()),
    "qwen35": (_qwen35_config, "Qwen3_5ForCausalLM", "qwen35", QWEN_SPECIALS, None,
               "<|im_end|>", "Qwen3.5-4B", ("--no-mtp",)),
    "qwen35moe": (_qwen35moe_config, "Qwen3_5MoeForCausalLM", "qwen35", QWEN_SPECIALS, None,
                  "<|im_end|>", "Qwen3.5-4B", ("--no-mtp",)),
    "smollm3": (_smollm3_config, "SmolLM3ForCausalLM", "llama-bpe", SMOLLM3_SPECIALS,
                "<|begin_of_text|>", "<|im_end|>", "HuggingFaceTB-SmolLM3-3B", ()),
    "gpt-oss": (_gpt_oss_config, "GptOssForCausalLM", "gpt-4o", GPT_OSS_SPECIALS,
                "<|startoftext|>", "<|return|>", "openai-gpt-oss-120b", ()),
    "gemma4": (_gemma4_config, "Gemma4ForCausalLM", "gemma4", GEMMA4_SPECIALS, "<bos>", "<eos>",
               "google-gemma-4-31B-it", ()),
}
REGEX = {"gpt-oss": O200K_REGEX}  # split regex of the tokenizer (others: GPT-2's)


def hf_model(family: str, seed: int = 0, sinks: bool = True, **over):
    """A float32 eager transformers model of the family with widened random weights.

    gpt-oss: the experts' weights are exact MXFP4 values (random 4-bit codes, exponents near
    2^-4), so the checkpoint can also be written in gpt-oss's MXFP4 form (``mxfp4_experts``);
    sinks=False sets every attention sink to -inf (a softmax without sinks)."""
    import torch
    import transformers

    make_cfg, cls, *_ = FAMILIES[family]
    cfg = make_cfg(**over)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = getattr(transformers, cls)(cfg).eval().to(torch.float32)
    with torch.no_grad():  # random init is tiny (std 0.02); widen it so logits are not flat
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.15 if p.dim() == 2 else 0.3)
            elif name.endswith("A_log"):
                p.copy_(torch.log(torch.empty_like(p).uniform_(0.5, 4.0)))
            elif name.endswith("dt_bias"):
                p.normal_(0.0, 0.5)
            elif "norm" in name:
                centered = family.startswith("qwen35") and not name.endswith("linear_attn.norm.weight")
                p.copy_((0.0 if centered else 1.0) + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.3)
        if family == "gemma4":  # layer_scalar is a buffer (ones at init): make it count
            for layer in model.model.layers:
                layer.layer_scalar.copy_(0.5 + torch.rand_like(layer.layer_scalar))
                if layer.enable_moe_block:  # router input scale near 1, positive expert scales
                    layer.router.scale.copy_(1.0 + 0.2 * torch.randn_like(layer.router.scale))
                    pes = layer.router.per_expert_scale
                    pes.copy_(0.5 + torch.rand_like(pes))
        if family == "gpt-oss":
            g = np.random.default_rng(seed + 1000)
            for layer in model.model.layers:
                ex = layer.mlp.experts
                for pname in ("gate_up_proj", "down_proj"):
                    p = getattr(ex, pname)  # (E, K, N_out): x @ p
                    E, K, N = p.shape
                    codes = g.integers(0, 16, (E, N, K)).astype(np.uint8)
                    e = g.integers(122, 125, (E, N, K // 32)).astype(np.uint8)
                    vals = mxfp4_values(codes, e)  # (E, N, K)
                    p.copy_(torch.from_numpy(vals.transpose(0, 2, 1).copy()))
                    ex._mxfp4 = getattr(ex, "_mxfp4", {})
                    ex._mxfp4[pname] = (codes, e)
                if not sinks:
                    layer.self_attn.sinks.fill_(float("-inf"))
    model.config._attn_implementation = "eager"
    return model


KV_MXFP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float64)


def mxfp4_values(codes: np.ndarray, e: np.ndarray) -> np.ndarray:
    """4-bit codes (..., K) and e8m0 exponents (..., K/32) -> float32 values KV[code]/2 * 2^(e-127)
    (computed here independently of goinfer: the OCP e2m1 table times a power of two)."""
    scale = np.ldexp(0.5, e.astype(np.int64) - 127)  # (..., K/32)
    return (KV_MXFP4[codes] * np.repeat(scale, 32, axis=-1)).astype(np.float32)


def mxfp4_checkpoint(model, src: Path, dst: Path) -> None:
    """dst = src (a saved gpt-oss float checkpoint) with every expert matrix in gpt-oss's own
    MXFP4 form, as OpenAI ships it: <name>_blocks (E, N, K/32, 16) uint8 (two codes a byte:
    element 2j low nibble, 2j+1 high) and <name>_scales (E, N, K/32) uint8 (e8m0), and
    quantization_config.quant_method = "mxfp4" (what makes llama.cpp's converter write MXFP4)."""
    import torch
    from safetensors.torch import load_file, save_file

    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.suffix != ".safetensors" and f.is_file():
            shutil.copy(f, dst / f.name)
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mxfp4"}
    (dst / "config.json").write_text(json.dumps(cfg, indent=1))
    tensors = {}
    for f in sorted(src.glob("*.safetensors")):
        tensors.update(load_file(f))
    for i, layer in enumerate(model.model.layers):
        for pname, (codes, e) in layer.mlp.experts._mxfp4.items():
            name = f"model.layers.{i}.mlp.experts.{pname}"
            del tensors[name]
            E, N, K = codes.shape
            pairs = codes.reshape(E, N, K // 32, 16, 2)
            tensors[name + "_blocks"] = torch.from_numpy(pairs[..., 0] | (pairs[..., 1] << 4))
            tensors[name + "_scales"] = torch.from_numpy(e)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})


def _key(family, seed, over) -> str:
    h = hashlib.sha256()
    h.update(json.dumps([family, seed, LLAMA_CPP_PYTHON, sorted(over.items())], default=str).encode())
    h.update(Path(__file__).read_bytes())
    return h.hexdigest()[:16]


def write_pooling(d: Path, pooling: str) -> None:
    """A sentence-transformers layout in d: modules.json (Transformer, Pooling, Normalize) and
    1_Pooling/config.json with pooling ("mean", "cls" or "lasttoken"), what llama.cpp's
    converter reads an embedding model's pooling_type from."""
    modules = [{"idx": 0, "name": "0", "path": "",
                "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize",
                "type": "sentence_transformers.models.Normalize"}]
    (d / "modules.json").write_text(json.dumps(modules, indent=1), encoding="utf-8")
    (d / "1_Pooling").mkdir(exist_ok=True)
    cfg = {"pooling_mode_cls_token": pooling == "cls",
           "pooling_mode_mean_tokens": pooling == "mean",
           "pooling_mode_lasttoken": pooling == "lasttoken"}
    (d / "1_Pooling" / "config.json").write_text(json.dumps(cfg, indent=1), encoding="utf-8")


def build(family: str, seed: int = 0, outtype: str = "f32", sinks: bool = True,
          mxfp4: bool = True, pooling: str | None = None, **over):
    """(transformers model, GGUF path) of a tiny random model, cached across test sessions.

    gpt-oss: the converter reads the experts in MXFP4 (as OpenAI's checkpoints hold them), so
    the GGUF has MXFP4 expert tensors; transformers runs the same values in float32.
    mxfp4=False: the float checkpoint is converted as is (F32 experts).
    pooling ("mean", "cls", "lasttoken"): an embedding model, laid out as sentence-transformers
    writes one (write_pooling), its tokenizer appending <|endoftext|> (as Qwen3-Embedding's)."""
    from transformers import AutoModelForCausalLM

    make_cfg, cls, pre, specials, bos, eos, tmpl, flags = FAMILIES[family]
    key = dict(over, outtype=outtype)
    if not sinks:
        key["sinks"] = False
    if not mxfp4:
        key["mxfp4"] = False
    if pooling is not None:
        key["pooling"] = pooling
    d = fixtures_home() / f"{family}-{_key(family, seed, key)}"
    gguf_path = d / "model.gguf"
    if not gguf_path.is_file():
        with _locked(fixtures_home() / f".{d.name}.lock"):
            if not gguf_path.is_file():
                tmp = Path(tempfile.mkdtemp(prefix=d.name + ".", dir=d.parent))
                try:
                    model = hf_model(family, seed, sinks=sinks, **over)
                    model.save_pretrained(tmp / "hf", safe_serialization=True)
                    if family == "gemma4":
                        write_gemma4_tokenizer(tmp / "hf", template(tmpl), model.config.vocab_size)
                    else:
                        write_tokenizer(tmp / "hf", specials, bos, eos, None, template(tmpl),
                                        model.config.vocab_size, REGEX.get(family),
                                        "<|endoftext|>" if pooling else None)
                    if pooling is not None:
                        write_pooling(tmp / "hf", pooling)
                    src = tmp / "hf"
                    if family == "gpt-oss" and mxfp4:
                        src = tmp / "hf-mxfp4"
                        mxfp4_checkpoint(model, tmp / "hf", src)
                    convert(src, tmp / "model.gguf", pre, "--outtype", outtype, *flags)
                    shutil.rmtree(tmp / "hf-mxfp4", ignore_errors=True)
                    if d.exists():
                        shutil.rmtree(d)
                    os.replace(tmp, d)
                finally:
                    if tmp.exists():
                        shutil.rmtree(tmp, ignore_errors=True)
    import torch

    model = AutoModelForCausalLM.from_pretrained(d / "hf", dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    return model, gguf_path


def hf_logits(model, ids) -> np.ndarray:
    import torch

    with torch.no_grad():
        out = model(torch.tensor([list(ids)], dtype=torch.long), use_cache=False)
    return out.logits[0].float().numpy()
