"""GGUF files with the exact tensor shapes and metadata of real models and random weights: what
people run (1B-8B, Q4_K_M mostly), measured without downloading them.  Speed and memory do not
depend on the weights' values.

    python benchmarks/shapes.py --list
    python benchmarks/shapes.py llama-3.2-1b --type Q4_0 [--out DIR]
    python benchmarks/shapes.py llama-3.1-8b --type Q4_K_M      # needs llama-cpp-python
    python benchmarks/shapes.py qwen3.5-4b --type Q4_0 --pure   # hybrid Gated DeltaNet
    python benchmarks/shapes.py gpt-oss-20b --type MXFP4_MOE     # MXFP4 experts, Q8_0 rest
    python benchmarks/shapes.py gpt-oss-20b --type MXFP4_MOE --layers 2   # real width, 2 layers
    python benchmarks/shapes.py --check DIR/FILE.gguf           # both engines load it, same ids
    python benchmarks/shapes.py --smoke                          # the test suite's smoke run

How the weights are made:

* ``--pure``: every matrix is written directly in ``--type`` (Q8_0 / Q4_0 / Q4_1 / F16 / F32)
  from random codes: uniform int8 (or 4-bit) codes and float16 scales giving values of standard
  deviation ~0.02 (a trained model's initializer range); norms are ones, biases N(0, 0.02).
* otherwise (the default): a pure Q8_0 file is written first, then llama.cpp's own quantizer
  (``llama_cpp.llama_model_quantize``, as ``llama-quantize`` runs it) turns it into ``--type``:
  the same mix of tensor types a downloaded file has (Q4_K_M: Q4_K with Q6_K for half of
  attn_v / ffn_down and for the output; Q4_0: Q4_0 with a Q6_K output).  Needs llama-cpp-python
  (the bench extra).
* ``MXFP4_MOE`` (written directly, as ``--pure``): what ``llama-quantize MXFP4_MOE`` and the
  public gpt-oss GGUFs hold: the 3-D expert tensors in MXFP4 (random 4-bit e2m1 codes, e8m0
  scales), every other matrix Q8_0, file type 38.  A shape with ``expert_type`` (gpt-oss:
  MXFP4, as every published gpt-oss GGUF has it) keeps its experts in that type whatever
  ``--type`` says.

Families: llama-style shapes (llama, qwen2, olmoe), Qwen3.5 dense (``qwen35``: Gated DeltaNet
linear-attention layers and gated full-attention layers) and gpt-oss (``gpt-oss``: biases,
sinks, sliding/full layers, YaRN, MXFP4 experts).  Tensor names, shapes, the tensors kept in
F32 and every ``<arch>.*`` key are those llama.cpp's ``convert_hf_to_gguf.py`` writes for the
real model (Qwen3.5 as converted with ``--no-mtp``: no MTP head); tests/test_benchmarks.py
checks this against the converter's own output on the tiny shapes of both families.

Tokenizer: the model family's own vocabulary from llama.cpp's ``models/ggml-vocab-*.gguf``
(found in the llama-cpp-python sdist, ``--vocab-dir``), padded with ``[PADn]`` tokens up to the
model's embedding rows as llama.cpp's converter does; for a family without such a file the
closest one is used and the GGUF's ``general.description`` says so.  ``--vocab bytes`` writes
a 256-token byte-level vocabulary padded to the model's size (no file needed: the smoke run).
Files go to ``--out`` (default: ``shapes/`` in the system's temporary directory), never into
the repository; an 8B Q4_0 file is ~4.7 GB.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import regime

SIGMA = 0.02  # standard deviation of the random weights

# ============================================================================ the shapes


@dataclass(frozen=True)
class Shape:
    name: str
    hf: str  # the model whose config this is
    arch: str  # GGUF general.architecture
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int  # dense FFN, or one expert's FFN for MoE
    vocab: int  # embedding rows
    context: int
    rope_base: float
    norm_eps: float
    tied: bool
    vocab_file: str  # llama.cpp models/ggml-vocab-<this>.gguf
    qkv_bias: bool = False
    rope_llama3: tuple | None = (
        None  # (factor, low_freq_factor, high_freq_factor, original context)
    )
    n_expert: int = 0
    n_expert_used: int = 0
    qk_norm_full: bool = False  # OLMoE: one RMSNorm over all q (k) heads
    template: str = ""  # chat template file in llama.cpp's models/templates
    # Qwen3.5 (arch qwen35): Gated DeltaNet layers; every full_every-th layer is full attention
    lin_k_heads: int = 0  # linear_num_key_heads (ssm.group_count)
    lin_v_heads: int = 0  # linear_num_value_heads (ssm.time_step_rank)
    lin_head_dim: int = 0  # linear_key_head_dim = linear_value_head_dim (ssm.state_size)
    conv_kernel: int = 0  # linear_conv_kernel_dim
    full_every: int = 0  # full_attention_interval
    rope_dims: int = 0  # rotary dims (partial_rotary_factor * head_dim); 0: head_dim
    rope_sections: tuple = ()  # MRoPE sections (rope.dimension_sections, 4 entries)
    # gpt-oss (arch gpt-oss)
    sliding_window: int = 0
    yarn: tuple | None = None  # (factor, original context, beta_fast, beta_slow)
    expert_type: str = ""  # the experts' GGUF type whatever --type (gpt-oss: MXFP4)
    specials: tuple = ()  # ((id, text), ...) special tokens put over [PAD] rows (CONTROL)
    token_ids: tuple = ()  # ((key, id), ...): tokenizer.ggml.<key> overriding the vocabulary's

    def tensors(self) -> list[tuple[str, tuple[int, ...], str]]:
        """(name, NumPy-order shape, role) of every tensor (llama.cpp reads them in any order;
        the llama-style shapes list them in its loader's).  role: "matrix"
        (quantized), "expert" (3-D stacked experts, quantized), "norm" (F32 ones), "bias" (F32),
        "router" (F32, as llama-quantize keeps it), "rope" (F32 frequency factors), "conv"
        (F32), "ssm_a" (F32, negative: -exp(A_log))."""
        if self.arch == "qwen35":
            return _qwen35_tensors(self)
        if self.arch == "gpt-oss":
            return _gptoss_tensors(self)
        D, hd, F = self.d_model, self.head_dim, self.d_ff
        nq, nkv = self.n_heads * hd, self.n_kv_heads * hd
        out = [("token_embd.weight", (self.vocab, D), "matrix")]
        if self.rope_llama3:
            out.append(("rope_freqs.weight", (hd // 2,), "rope"))
        for i in range(self.n_layers):
            p = f"blk.{i}."
            out += [
                (p + "attn_norm.weight", (D,), "norm"),
                (p + "attn_q.weight", (nq, D), "matrix"),
                (p + "attn_k.weight", (nkv, D), "matrix"),
                (p + "attn_v.weight", (nkv, D), "matrix"),
                (p + "attn_output.weight", (D, nq), "matrix"),
            ]
            if self.qkv_bias:
                out += [
                    (p + "attn_q.bias", (nq,), "bias"),
                    (p + "attn_k.bias", (nkv,), "bias"),
                    (p + "attn_v.bias", (nkv,), "bias"),
                ]
            if self.qk_norm_full:
                out += [
                    (p + "attn_q_norm.weight", (nq,), "norm"),
                    (p + "attn_k_norm.weight", (nkv,), "norm"),
                ]
            out.append((p + "ffn_norm.weight", (D,), "norm"))
            if self.n_expert:
                E = self.n_expert
                out += [
                    (p + "ffn_gate_inp.weight", (E, D), "router"),
                    (p + "ffn_gate_exps.weight", (E, F, D), "expert"),
                    (p + "ffn_up_exps.weight", (E, F, D), "expert"),
                    (p + "ffn_down_exps.weight", (E, D, F), "expert"),
                ]
            else:
                out += [
                    (p + "ffn_gate.weight", (F, D), "matrix"),
                    (p + "ffn_up.weight", (F, D), "matrix"),
                    (p + "ffn_down.weight", (D, F), "matrix"),
                ]
        out.append(("output_norm.weight", (D,), "norm"))
        if not self.tied:
            out.append(("output.weight", (self.vocab, D), "matrix"))
        return out

    def n_params(self) -> int:
        return sum(int(np.prod(s)) for _, s, _ in self.tensors())

    def recurrent_layers(self) -> list[bool]:
        """Qwen3.5: True for a Gated DeltaNet layer (transformers' layer_types default)."""
        return [(i + 1) % self.full_every != 0 for i in range(self.n_layers)]


def _qwen35_tensors(s: Shape) -> list[tuple[str, tuple[int, ...], str]]:
    """Qwen3.5 dense, as convert_hf_to_gguf.py (Qwen3_5TextModel, --no-mtp) names and shapes
    them: attn_q holds query and gate rows per head (2 hd); linear layers hold the fused
    attn_qkv (q, k, v channels), attn_gate (z), ssm_beta / ssm_alpha, the F32 conv taps, ssm_a,
    ssm_dt.bias, the per-head ssm_norm and ssm_out."""
    D, hd, F, H, KV = s.d_model, s.head_dim, s.d_ff, s.n_heads, s.n_kv_heads
    Hk, Hv, d, K = s.lin_k_heads, s.lin_v_heads, s.lin_head_dim, s.conv_kernel
    C = 2 * Hk * d + Hv * d  # conv channels: q, k, v
    out = [("token_embd.weight", (s.vocab, D), "matrix")]
    for i, rec in enumerate(s.recurrent_layers()):
        p = f"blk.{i}."
        out.append((p + "attn_norm.weight", (D,), "norm"))
        if rec:
            out += [
                (p + "attn_qkv.weight", (C, D), "matrix"),
                (p + "attn_gate.weight", (Hv * d, D), "matrix"),
                (p + "ssm_beta.weight", (Hv, D), "matrix"),
                (p + "ssm_alpha.weight", (Hv, D), "matrix"),
                (p + "ssm_conv1d.weight", (C, K), "conv"),
                (p + "ssm_a", (Hv,), "ssm_a"),
                (p + "ssm_dt.bias", (Hv,), "bias"),
                (p + "ssm_norm.weight", (d,), "norm"),
                (p + "ssm_out.weight", (D, Hv * d), "matrix"),
            ]
        else:
            out += [
                (p + "attn_q.weight", (2 * H * hd, D), "matrix"),
                (p + "attn_k.weight", (KV * hd, D), "matrix"),
                (p + "attn_v.weight", (KV * hd, D), "matrix"),
                (p + "attn_output.weight", (D, H * hd), "matrix"),
                (p + "attn_q_norm.weight", (hd,), "norm"),
                (p + "attn_k_norm.weight", (hd,), "norm"),
            ]
        out += [
            (p + "post_attention_norm.weight", (D,), "norm"),
            (p + "ffn_gate.weight", (F, D), "matrix"),
            (p + "ffn_up.weight", (F, D), "matrix"),
            (p + "ffn_down.weight", (D, F), "matrix"),
        ]
    out.append(("output_norm.weight", (D,), "norm"))
    if not s.tied:
        out.append(("output.weight", (s.vocab, D), "matrix"))
    return out


def _gptoss_tensors(s: Shape) -> list[tuple[str, tuple[int, ...], str]]:
    """gpt-oss, as convert_hf_to_gguf.py (GptOssModel) names and shapes them: biased q/k/v/o,
    attn_sinks, post_attention_norm before the MoE, a biased F32 router, stacked experts
    (gate and up split from gate_up) with per-expert biases."""
    D, hd, F, H, KV, E = s.d_model, s.head_dim, s.d_ff, s.n_heads, s.n_kv_heads, s.n_expert
    out = [("token_embd.weight", (s.vocab, D), "matrix")]
    for i in range(s.n_layers):
        p = f"blk.{i}."
        out += [
            (p + "attn_norm.weight", (D,), "norm"),
            (p + "attn_q.weight", (H * hd, D), "matrix"),
            (p + "attn_q.bias", (H * hd,), "bias"),
            (p + "attn_k.weight", (KV * hd, D), "matrix"),
            (p + "attn_k.bias", (KV * hd,), "bias"),
            (p + "attn_v.weight", (KV * hd, D), "matrix"),
            (p + "attn_v.bias", (KV * hd,), "bias"),
            (p + "attn_output.weight", (D, H * hd), "matrix"),
            (p + "attn_output.bias", (D,), "bias"),
            (p + "attn_sinks.weight", (H,), "bias"),
            (p + "post_attention_norm.weight", (D,), "norm"),
            (p + "ffn_gate_inp.weight", (E, D), "router"),
            (p + "ffn_gate_inp.bias", (E,), "bias"),
            (p + "ffn_gate_exps.weight", (E, F, D), "expert"),
            (p + "ffn_gate_exps.bias", (E, F), "bias"),
            (p + "ffn_up_exps.weight", (E, F, D), "expert"),
            (p + "ffn_up_exps.bias", (E, F), "bias"),
            (p + "ffn_down_exps.weight", (E, D, F), "expert"),
            (p + "ffn_down_exps.bias", (E, D), "bias"),
        ]
    out.append(("output_norm.weight", (D,), "norm"))
    out.append(("output.weight", (s.vocab, D), "matrix"))
    return out


# o200k_harmony's special tokens (gpt-oss's tokenizer.json), at their ids
_HARMONY = (
    (199998, "<|startoftext|>"),
    (199999, "<|endoftext|>"),
    (200002, "<|return|>"),
    (200003, "<|constrain|>"),
    (200005, "<|channel|>"),
    (200006, "<|start|>"),
    (200007, "<|end|>"),
    (200008, "<|message|>"),
    (200012, "<|call|>"),
    (200018, "<|endofprompt|>"),
)
_L3 = "meta-llama-Llama-3.1-8B-Instruct.jinja"
_L32 = "meta-llama-Llama-3.2-3B-Instruct.jinja"
SHAPES = {
    s.name: s
    for s in [
        # Llama 3.2 / 3.1: config.json of meta-llama/Llama-3.2-1B, -3B, Llama-3.1-8B (rope_scaling llama3)
        Shape(
            "llama-3.2-1b",
            "meta-llama/Llama-3.2-1B",
            "llama",
            2048,
            16,
            32,
            8,
            64,
            8192,
            128256,
            131072,
            500000.0,
            1e-5,
            True,
            "llama-bpe",
            rope_llama3=(32.0, 1.0, 4.0, 8192),
            template=_L32,
        ),
        Shape(
            "llama-3.2-3b",
            "meta-llama/Llama-3.2-3B",
            "llama",
            3072,
            28,
            24,
            8,
            128,
            8192,
            128256,
            131072,
            500000.0,
            1e-5,
            True,
            "llama-bpe",
            rope_llama3=(32.0, 1.0, 4.0, 8192),
            template=_L32,
        ),
        Shape(
            "llama-3.1-8b",
            "meta-llama/Llama-3.1-8B",
            "llama",
            4096,
            32,
            32,
            8,
            128,
            14336,
            128256,
            131072,
            500000.0,
            1e-5,
            False,
            "llama-bpe",
            rope_llama3=(8.0, 1.0, 4.0, 8192),
            template=_L3,
        ),
        # Qwen2.5: QKV bias, tied embeddings below 7B, vocab 151936 (152064 at 7B), rope 1e6
        Shape(
            "qwen2.5-1.5b",
            "Qwen/Qwen2.5-1.5B",
            "qwen2",
            1536,
            28,
            12,
            2,
            128,
            8960,
            151936,
            32768,
            1000000.0,
            1e-6,
            True,
            "qwen2",
            qkv_bias=True,
            template="Qwen-Qwen2.5-7B-Instruct.jinja",
        ),
        Shape(
            "qwen2.5-3b",
            "Qwen/Qwen2.5-3B",
            "qwen2",
            2048,
            36,
            16,
            2,
            128,
            11008,
            151936,
            32768,
            1000000.0,
            1e-6,
            True,
            "qwen2",
            qkv_bias=True,
            template="Qwen-Qwen2.5-7B-Instruct.jinja",
        ),
        Shape(
            "qwen2.5-7b",
            "Qwen/Qwen2.5-7B",
            "qwen2",
            3584,
            28,
            28,
            4,
            128,
            18944,
            152064,
            32768,
            1000000.0,
            1e-6,
            False,
            "qwen2",
            qkv_bias=True,
            template="Qwen-Qwen2.5-7B-Instruct.jinja",
        ),
        # Mistral 7B v0.1 (llama.cpp's converter writes arch "llama"; SentencePiece vocab of 32000)
        Shape(
            "mistral-7b",
            "mistralai/Mistral-7B-v0.1",
            "llama",
            4096,
            32,
            32,
            8,
            128,
            14336,
            32000,
            32768,
            10000.0,
            1e-5,
            False,
            "llama-spm",
            template="mistralai-Mistral-Nemo-Instruct-2407.jinja",
        ),  # (no v0.1 template in llama.cpp's set)
        # OLMoE-1B-7B-0924: 64 experts of width 1024, top 8, no shared expert, QK-norm over all heads;
        # GPT-NeoX-20B's vocabulary (its real tokens, padded rows trimmed to 50304), ChatML stand-in
        Shape(
            "olmoe-1b-7b",
            "allenai/OLMoE-1B-7B-0924",
            "olmoe",
            2048,
            16,
            16,
            16,
            128,
            1024,
            50304,
            4096,
            10000.0,
            1e-5,
            False,
            "gpt-neox",
            n_expert=64,
            n_expert_used=8,
            qk_norm_full=True,
            template="chatml",
        ),
        # Qwen3.5-4B (the dense 4B of Qwen3.5; text model, no MTP head): hidden 2560, 32 layers
        # (24 Gated DeltaNet + 8 full attention, every 4th), 16 q / 4 kv heads of 256 with an output
        # gate, linear attention 16 k / 32 v heads of 128, conv 4, FFN 9216, vocab 248320, tied
        # embeddings, rope_theta 1e7 on 64 of 256 dims (partial_rotary_factor 0.25), MRoPE sections
        # [11, 11, 10] interleaved, max_position_embeddings 262144.  Source: the text_config of
        # Qwen/Qwen3.5-4B's config.json as public code pins it (Megatron model args of
        # radixark/miles and THUDM/slime scripts/models/qwen3.5-4B.sh: no --untie-embeddings, unlike
        # the 27B; Qwen3.5-4B text-config checks in public fine-tuning code), and transformers
        # 5.24's Qwen3_5TextConfig for what those leave out (conv 4, head dims 128, interval 4, whose
        # other defaults are the 9B's); [11, 11, 10] is also llama.cpp's converter default.
        # Tokenizer: llama.cpp's ggml-vocab-qwen35.gguf (151936 entries) padded to 248320 rows.
        Shape(
            "qwen3.5-4b",
            "Qwen/Qwen3.5-4B",
            "qwen35",
            2560,
            32,
            16,
            4,
            256,
            9216,
            248320,
            262144,
            10000000.0,
            1e-6,
            True,
            "qwen35",
            template="Qwen3.5-4B.jinja",
            lin_k_heads=16,
            lin_v_heads=32,
            lin_head_dim=128,
            conv_kernel=4,
            full_every=4,
            rope_dims=64,
            rope_sections=(11, 11, 10, 0),
        ),
        # gpt-oss-20b: config.json of openai/gpt-oss-20b: hidden 2880, 24 layers alternating
        # sliding (128, even layers) / full, 64 q / 8 kv heads of 64, 32 experts of width 2880, top 4,
        # YaRN factor 32 over 4096 (beta_fast 32, beta_slow 1), rope_theta 150000, eps 1e-5,
        # vocab 201088 (o200k_harmony), untied.  Experts MXFP4 as in every published gpt-oss GGUF.
        # Tokenizer: llama.cpp ships no o200k vocabulary; the closest is Llama 3's (llama-bpe,
        # cl100k-derived BPE, 128256 tokens) padded to 201088 rows, with harmony's special tokens at
        # their o200k_harmony ids and the real file's bos / eos / padding ids.
        Shape(
            "gpt-oss-20b",
            "openai/gpt-oss-20b",
            "gpt-oss",
            2880,
            24,
            64,
            8,
            64,
            2880,
            201088,
            131072,
            150000.0,
            1e-5,
            False,
            "llama-bpe",
            n_expert=32,
            n_expert_used=4,
            sliding_window=128,
            yarn=(32.0, 4096, 32.0, 1.0),
            expert_type="MXFP4",
            template="openai-gpt-oss-120b.jinja",
            specials=_HARMONY,
            token_ids=(
                ("bos_token_id", 199998),
                ("eos_token_id", 200002),
                ("padding_token_id", 199999),
            ),
        ),
        # the smoke run's model: seconds to write, runs anywhere
        Shape(
            "tiny",
            "(none: the smoke runs' model)",
            "llama",
            64,
            2,
            4,
            2,
            16,
            128,
            512,
            4096,
            10000.0,
            1e-5,
            False,
            "bytes",
            template="chatml",
        ),
        # the smoke runs' Qwen3.5 and gpt-oss: the dims of tests/fixtures/hfconvert.py's tiny configs, with
        # the tiny shape's 512 rows (the benchmarks draw prompt ids from 200 to vocab - 200)
        Shape(
            "qwen3.5-tiny",
            "(none: the smoke runs' Qwen3.5)",
            "qwen35",
            64,
            4,
            4,
            2,
            32,
            96,
            512,
            2048,
            10000.0,
            1e-6,
            False,
            "bytes",
            template="chatml",
            lin_k_heads=2,
            lin_v_heads=4,
            lin_head_dim=16,
            conv_kernel=4,
            full_every=4,
            rope_dims=8,
            rope_sections=(2, 1, 1, 0),
        ),
        Shape(
            "gpt-oss-tiny",
            "(none: the smoke runs' gpt-oss)",
            "gpt-oss",
            64,
            4,
            4,
            2,
            32,
            64,
            512,
            4096,
            150000.0,
            1e-5,
            False,
            "bytes",
            n_expert=4,
            n_expert_used=2,
            sliding_window=8,
            yarn=(32.0, 4096, 32.0, 1.0),
            expert_type="MXFP4",
            template="chatml",
        ),
    ]
}
SMOKE_SHAPES = ("tiny", "qwen3.5-tiny", "gpt-oss-tiny")

FTYPES = {
    "F32": 0,
    "F16": 1,
    "Q4_0": 2,
    "Q4_1": 3,
    "Q8_0": 7,
    "Q5_0": 8,
    "Q5_1": 9,
    "Q2_K": 10,
    "Q3_K_M": 12,
    "Q4_K_S": 14,
    "Q4_K_M": 15,
    "Q5_K_S": 16,
    "Q5_K_M": 17,
    "Q6_K": 18,
    "MXFP4_MOE": 38,
}
PURE_TYPES = ("F32", "F16", "Q8_0", "Q4_0", "Q4_1", "MXFP4_MOE")
DIRECT_TYPES = ("F32", "F16", "Q8_0", "MXFP4_MOE")  # written directly even without --pure


def tensor_type(shape: Shape, qtype: str, role: str) -> str:
    """The GGUF type a tensor of this role gets in a pure qtype file."""
    if role == "expert":
        return shape.expert_type or ("MXFP4" if qtype == "MXFP4_MOE" else qtype)
    if role == "matrix":
        return "Q8_0" if qtype == "MXFP4_MOE" else qtype
    return "F32"


# ============================================================================ tokenizer


def vocab_dirs(extra: str | None, out: Path | None = None) -> list[str]:
    """Where to look for ggml-vocab-*.gguf (and templates/): --vocab-dir, <out>/vocab, the
    llama-cpp-python sdist of the benchmark environment."""
    dirs = [extra] if extra else []
    if out is not None:
        dirs.append(str(Path(out) / "vocab"))
    dirs += sorted(
        glob.glob(
            os.path.join(
                tempfile.gettempdir(), "peers-build", "sdist", "*", "vendor", "llama.cpp", "models"
            )
        )
    )
    return dirs


def read_vocab(name: str, dirs: list[str]) -> tuple[dict, str]:
    """tokenizer.* metadata of llama.cpp's ggml-vocab-<name>.gguf -> (fields, where from)."""
    from gguf import GGUFReader

    for d in dirs:
        p = Path(d) / f"ggml-vocab-{name}.gguf"
        if p.is_file():
            r = GGUFReader(str(p))
            out = {}
            for key, f in r.fields.items():
                if key.startswith("tokenizer."):
                    out[key] = f.contents()
            return out, str(p)
    raise FileNotFoundError(
        f"ggml-vocab-{name}.gguf not found in {dirs or '(no directory)'}; "
        "pass --vocab-dir (llama.cpp's models/ directory) or --vocab bytes"
    )


def bytes_vocab() -> dict:
    """A byte-level BPE vocabulary: the 256 byte tokens, a few merges, <s> and </s>."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, n = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + n)
            n += 1
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a")]
    toks = [chars[b] for b in range(256)] + [a + b for a, b in merges] + ["<s>", "</s>"]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.tokens": toks,
        "tokenizer.ggml.token_type": [1] * 261 + [3, 3],
        "tokenizer.ggml.merges": [f"{a} {b}" for a, b in merges],
        "tokenizer.ggml.bos_token_id": 261,
        "tokenizer.ggml.eos_token_id": 262,
    }


def pad_vocab(tok: dict, n: int) -> tuple[dict, int]:
    """Pad the token list to n entries with [PADi] (type UNUSED, score 0) -> (fields, pads);
    a list longer than n loses trailing [PADi] tokens only (gpt-neox's is padded to 50432)."""
    toks = list(tok["tokenizer.ggml.tokens"])
    tok = dict(tok)
    if len(toks) > n:
        if not all(t.startswith("[PAD") for t in toks[n:]):
            raise ValueError(
                f"the vocabulary has {len(toks)} tokens, more than the model's {n} rows"
            )
        toks = toks[:n]
        for key in ("tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
            if key in tok:
                tok[key] = list(tok[key])[:n]
    pads = n - len(toks)
    tok["tokenizer.ggml.tokens"] = toks + [f"[PAD{i}]" for i in range(len(toks), n)]
    tok["tokenizer.ggml.token_type"] = list(tok["tokenizer.ggml.token_type"]) + [5] * pads
    if "tokenizer.ggml.scores" in tok:
        tok["tokenizer.ggml.scores"] = list(tok["tokenizer.ggml.scores"]) + [0.0] * pads
    return tok, pads


def put_specials(tok: dict, specials, token_ids) -> dict:
    """Special tokens (id, text) over [PAD] rows (type CONTROL), and tokenizer.ggml.<key> ids."""
    tok = dict(tok)
    toks, types = list(tok["tokenizer.ggml.tokens"]), list(tok["tokenizer.ggml.token_type"])
    for i, text in specials:
        if not toks[i].startswith("[PAD"):
            raise ValueError(f"special token {text!r} would replace token {i} {toks[i]!r}")
        toks[i], types[i] = text, 3
    tok["tokenizer.ggml.tokens"], tok["tokenizer.ggml.token_type"] = toks, types
    for key, i in token_ids:
        tok[f"tokenizer.ggml.{key}"] = i
    return tok


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def chat_template(shape: Shape, dirs: list[str]) -> str | None:
    if shape.template == "chatml":
        return CHATML
    for d in dirs:
        p = Path(d) / "templates" / shape.template
        if shape.template and p.is_file():
            return p.read_text()
    return None


# ============================================================================ random tensors


def llama3_rope_factors(shape: Shape) -> np.ndarray:
    """Meta's llama3 RoPE frequency factors (what llama.cpp's converter writes as rope_freqs)."""
    factor, low, high, old = shape.rope_llama3
    dim = shape.head_dim
    freqs = 1.0 / (shape.rope_base ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def random_blocks(qtype: str, n_el: int, rng: np.random.Generator) -> np.ndarray:
    """n_el random values of a quantized/float type as the file's raw bytes (uint8)."""
    if qtype == "F32":
        return (rng.standard_normal(n_el, dtype=np.float32) * SIGMA).view(np.uint8)
    if qtype == "F16":
        return (
            (rng.standard_normal(n_el, dtype=np.float32) * SIGMA).astype(np.float16).view(np.uint8)
        )
    nb = n_el // 32
    if qtype == "Q8_0":  # d, 32 int8 codes in -127..127 (std 73.3)
        b = np.empty((nb, 34), np.uint8)
        d = (SIGMA / 73.3 * rng.uniform(0.75, 1.25, nb)).astype(np.float16)
        b[:, :2] = d.view(np.uint8).reshape(nb, 2)
        b[:, 2:] = rng.integers(-127, 128, (nb, 32), dtype=np.int8).view(np.uint8)
        return b.reshape(-1)
    if qtype in ("Q4_0", "Q4_1"):  # d [, m], 16 bytes of nibbles (codes 0..15, std 4.6)
        head = 2 if qtype == "Q4_0" else 4
        b = np.empty((nb, head + 16), np.uint8)
        d = (SIGMA / 4.6 * rng.uniform(0.75, 1.25, nb)).astype(np.float16)
        b[:, :2] = d.view(np.uint8).reshape(nb, 2)
        if qtype == "Q4_1":  # m = -7.5 d: values centred on 0
            b[:, 2:4] = (
                (-7.5 * d.astype(np.float32)).astype(np.float16).view(np.uint8).reshape(nb, 2)
            )
        b[:, head:] = rng.integers(0, 256, (nb, 16), dtype=np.uint8)
        return b.reshape(-1)
    if (
        qtype == "MXFP4"
    ):  # e8m0 byte e, 16 bytes of e2m1 codes; value KV[code] 2^(e-128), KV std 5.85
        b = np.empty((nb, 17), np.uint8)
        b[:, 0] = rng.integers(119, 122, nb, dtype=np.uint8)  # 2^-8.2 x 5.85 ~ 0.02
        b[:, 1:] = rng.integers(0, 256, (nb, 16), dtype=np.uint8)
        return b.reshape(-1)
    raise ValueError(f"cannot write {qtype} directly (pure types: {', '.join(PURE_TYPES)})")


def arch_metadata(shape: Shape) -> list[tuple[str, object]]:
    """The <arch>.* keys, in the order and with the values llama.cpp's converter writes them
    (int: uint32, float: float32, list: array; the converter's own types)."""
    a, s = shape.arch, shape
    head = [("context_length", s.context), ("embedding_length", s.d_model)]
    kv_len = [("attention.key_length", s.head_dim), ("attention.value_length", s.head_dim)]
    if a == "qwen35":
        out = (
            [("block_count", s.n_layers)]
            + head
            + [
                ("feed_forward_length", s.d_ff),
                ("attention.head_count", s.n_heads),
                ("attention.head_count_kv", s.n_kv_heads),
                ("rope.dimension_sections", list(s.rope_sections)),
                ("rope.freq_base", s.rope_base),
                ("attention.layer_norm_rms_epsilon", s.norm_eps),
            ]
            + kv_len
            + [
                ("ssm.conv_kernel", s.conv_kernel),
                ("ssm.state_size", s.lin_head_dim),
                ("ssm.group_count", s.lin_k_heads),
                ("ssm.time_step_rank", s.lin_v_heads),
                ("ssm.inner_size", s.lin_v_heads * s.lin_head_dim),
                ("attention.recurrent_layers", s.recurrent_layers()),
                ("full_attention_interval", s.full_every),
                ("rope.dimension_count", s.rope_dims),
            ]
        )
    elif a == "gpt-oss":
        factor, orig, fast, slow = s.yarn
        out = (
            [("block_count", s.n_layers)]
            + head
            + [
                ("feed_forward_length", s.d_ff),
                ("attention.head_count", s.n_heads),
                ("attention.head_count_kv", s.n_kv_heads),
                ("rope.scaling.type", "yarn"),
                ("rope.scaling.factor", factor),
                ("rope.scaling.original_context_length", orig),
                ("rope.scaling.yarn_beta_fast", fast),
                ("rope.scaling.yarn_beta_slow", slow),
                ("rope.freq_base", s.rope_base),
                ("attention.layer_norm_rms_epsilon", s.norm_eps),
                ("expert_count", s.n_expert),
                ("expert_used_count", s.n_expert_used),
            ]
            + kv_len
            + [
                ("attention.sliding_window", s.sliding_window),
                ("expert_feed_forward_length", s.d_ff),
            ]
        )
    else:  # the llama-style shapes (this script's own key set, which llama.cpp reads)
        out = head + [
            ("block_count", s.n_layers),
            ("feed_forward_length", s.d_ff),
            ("attention.head_count", s.n_heads),
            ("attention.head_count_kv", s.n_kv_heads),
            ("rope.freq_base", s.rope_base),
            ("attention.layer_norm_rms_epsilon", s.norm_eps),
            ("rope.dimension_count", s.head_dim),
            ("vocab_size", s.vocab),
        ]
        if s.head_dim * s.n_heads != s.d_model:
            out += kv_len
        if s.n_expert:
            out += [
                ("expert_count", s.n_expert),
                ("expert_used_count", s.n_expert_used),
                ("expert_feed_forward_length", s.d_ff),
            ]
    return [(f"{a}.{k}", v) for k, v in out]


def _add(w, key: str, val) -> None:
    if isinstance(val, str):
        w.add_string(key, val)
    elif isinstance(val, (list, tuple, np.ndarray)):
        w.add_array(key, list(val))
    elif isinstance(val, (bool, np.bool_)):
        w.add_bool(key, bool(val))
    elif isinstance(val, float):
        w.add_float32(key, val)
    else:
        w.add_uint32(key, int(val))


def random_f32(shape: Shape, name: str, role: str, n_el: int, rng) -> np.ndarray:
    """The F32 tensors' values (raw bytes)."""
    if role == "norm":
        return np.ones(n_el, np.float32).view(np.uint8)
    if role == "rope":
        return llama3_rope_factors(shape).view(np.uint8)
    if role == "ssm_a":  # -exp(A_log), A_log ~ log U(1, 16) as Qwen3.5's init
        return (-rng.uniform(1.0, 16.0, n_el)).astype(np.float32).view(np.uint8)
    # router, bias, conv, sinks, dt bias
    return (rng.standard_normal(n_el, dtype=np.float32) * SIGMA).view(np.uint8)


def write_gguf(
    shape: Shape,
    qtype: str,
    path: Path,
    tok: dict,
    description: str,
    template: str | None,
    seed: int = 0,
    log=print,
) -> Path:
    """Stream a GGUF of `shape` with every matrix in qtype (pure) to path (via a temp name)."""
    import gguf
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    rng = np.random.default_rng(seed)
    tmp = path.with_name(path.name + ".partial")
    w = gguf.GGUFWriter(str(tmp), shape.arch)
    w.add_type("model")
    w.add_name(f"{shape.name} (random weights)")
    w.add_description(description)
    for key, val in arch_metadata(shape):
        _add(w, key, val)
    w.add_file_type(FTYPES[qtype])
    w.add_quantization_version(2)
    for key, val in tok.items():
        _add(w, key, val)
    if template:
        w.add_string("tokenizer.chat_template", template)
    plan = []
    for name, shp, role in shape.tensors():
        n_el = int(np.prod(shp))
        tname = tensor_type(shape, qtype, role)
        bs, ts = GGML_QUANT_SIZES[GGMLQuantizationType[tname]]
        plan.append((name, shp, role, tname, n_el // bs * ts))
    for name, shp, _role, t, nbytes in plan:
        w.add_tensor_info(
            name, shp, np.dtype(np.float32), nbytes, raw_dtype=GGMLQuantizationType[t]
        )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    t0, done, total = time.perf_counter(), 0, sum(p[4] for p in plan)
    for name, shp, role, t, nbytes in plan:
        n_el = int(np.prod(shp))
        if t == "F32":
            data = random_f32(shape, name, role, n_el, rng)
        else:
            data = random_blocks(t, n_el, rng)
        assert data.nbytes == nbytes, (name, data.nbytes, nbytes)
        w.write_tensor_data(data)
        done += nbytes
        if log and done % (1 << 30) < nbytes:
            log(
                f"  {done / 1e9:.1f} / {total / 1e9:.1f} GB written ({time.perf_counter() - t0:.0f} s)"
            )
    w.close()
    os.replace(tmp, path)
    return path


def llama_quantize(src: Path, dst: Path, qtype: str, threads: int) -> None:
    """llama.cpp's quantizer (llama_model_quantize), as llama-quantize runs it."""
    import ctypes

    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[qtype]
    params.nthread = threads
    params.allow_requantize = True  # the source is Q8_0 (random values: nothing to lose)
    tmp = dst.with_name(dst.name + ".partial")
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({src} -> {qtype}) failed with {rc}")
    os.replace(tmp, dst)


# ============================================================================ driver


def smoke_model(out, qtype: str = "Q4_0") -> Path:
    """The tiny shape (2 layers, d_model 64, byte-level vocabulary, ChatML template), pure qtype:
    what every benchmark's --smoke run loads (written in milliseconds, no download).  Its layout
    cache goes next to it (GOINFER_LAYOUT_DIR, unless set), not into GOINFER_HOME."""
    os.environ.setdefault("GOINFER_LAYOUT_DIR", str(Path(out) / "layouts"))
    return make(SHAPES["tiny"], qtype, Path(out), pure=True, vocab="bytes", log=None)


def make(
    shape: Shape,
    qtype: str,
    out: Path,
    *,
    pure: bool,
    vocab: str | None = None,
    vocab_dir: str | None = None,
    threads: int = 2,
    force: bool = False,
    log=print,
) -> Path:
    """Write (or reuse) out/<shape>-<qtype>[-pure].gguf; returns its path."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{shape.name}-{qtype}{'-pure' if pure and qtype not in DIRECT_TYPES else ''}.gguf"
    log = log or (lambda *a: None)
    if path.exists() and not force:
        log(f"{path} exists (--force rewrites it)")
        return path
    dirs = vocab_dirs(vocab_dir, out)
    vname = vocab or shape.vocab_file
    if vname == "bytes":
        tok, where = bytes_vocab(), "a 256-token byte-level vocabulary"
    else:
        tok, where = read_vocab(vname, dirs)
        where = f"llama.cpp's ggml-vocab-{vname}.gguf"
    n_real = len(tok["tokenizer.ggml.tokens"])
    tok, pads = pad_vocab(tok, shape.vocab)
    if vname != "bytes" and (shape.specials or shape.token_ids):
        tok = put_specials(tok, shape.specials, shape.token_ids)
        where += (
            f" with {shape.hf}'s {len(shape.specials)} special tokens at their ids"
            if shape.specials
            else ""
        )
    if vname == "gpt-neox" and tok.get("tokenizer.ggml.pre") not in ("gpt-2", "gpt2"):
        tok["tokenizer.ggml.pre"] = "gpt-2"  # OLMoE's (GPT-NeoX) words split like GPT-2's
    template = chat_template(shape, dirs) or tok.pop("tokenizer.chat_template", None)
    tok.pop("tokenizer.chat_template", None)
    desc = (
        f"Random weights with the tensor shapes and metadata of {shape.hf}. Tokenizer: {where}"
        f" ({n_real} tokens{f', padded with {pads} [PAD] tokens' if pads else ''}). "
        f"Chat template: {shape.template if template else 'none (goinfer built-in / ChatML)'}."
    )
    log(f"{shape.name}: {shape.n_params() / 1e9:.2f} B parameters; {desc}")
    t0 = time.perf_counter()
    if pure or qtype in DIRECT_TYPES:
        write_gguf(shape, qtype, path, tok, desc, template, log=log)
    else:
        src = out / f"{shape.name}-Q8_0.gguf"
        made_src = not src.exists()
        if made_src:
            write_gguf(shape, "Q8_0", src, tok, desc, template, log=log)
        log(f"quantizing {src.name} -> {qtype} with llama.cpp ({threads} threads)")
        llama_quantize(src, path, qtype, threads)
    log(f"wrote {path} ({path.stat().st_size / 1e9:.2f} GB) in {time.perf_counter() - t0:.0f} s")
    return path


def goinfer_logits(path, ids, threads: int = 1) -> np.ndarray:
    """goinfer's logits of every position of ids on the file (no layout cache written)."""
    from goinfer.gguf import GGUFFile
    from goinfer.model import Model

    m = Model(GGUFFile(path), threads=threads, progress=False, layout_cache=False)
    return m.logits(ids)


def llama_cpp_logits(path, ids, threads: int = 1) -> np.ndarray:
    """llama.cpp's (llama-cpp-python) logits of every position of ids on the file."""
    from llama_cpp import Llama

    llm = Llama(
        str(path),
        n_ctx=max(64, len(ids)),
        n_batch=max(64, len(ids)),
        n_threads=threads,
        n_threads_batch=threads,
        logits_all=True,
        verbose=False,
    )
    try:
        llm.eval(list(ids))
        return np.array(llm.scores[: len(ids)], dtype=np.float32)
    finally:
        llm.close()


CHECK = r"""
import json, sys, time
import numpy as np
engine, path, threads, prefill = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
text = "The capital of France is"
out = {}
if engine == "goinfer":
    import goinfer
    from goinfer import bench
    t0 = time.perf_counter()
    m = goinfer.Model.load(path, threads=threads, progress=False, context_length=4096)
    out["load_s"], out["source"] = time.perf_counter() - t0, m.load_info.source
    ids = m.tokenize(text)
    s = m.session()
    lg = s.prefill(ids)
    out["chat_ids"] = len(m.tokenize(m.apply_chat_template([{"role": "user", "content": text}])))
    def step(t):
        return s.decode(t)
else:
    import llama_cpp
    t0 = time.perf_counter()
    llm = llama_cpp.Llama(path, n_ctx=4096, n_threads=threads, n_threads_batch=threads, verbose=False)
    out["load_s"], out["source"] = time.perf_counter() - t0, "mmap"
    def last():  # the last token's logits (eval keeps none without logits_all)
        ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).copy()
    ids = llm.tokenize(text.encode(), add_bos=False)
    llm.eval(ids)
    lg = last()
    r = llm.create_chat_completion([{"role": "user", "content": text}], max_tokens=1, temperature=0.0)
    out["chat_ids"] = r["usage"]["prompt_tokens"]
    llm.reset()
    llm.eval(ids)
    def step(t):
        llm.eval([t])
        return last()
out["ids"], out["top5"], gen = [int(i) for i in ids], [int(i) for i in np.argsort(-lg)[:5]], []
for _ in range(8):
    t = int(np.argmax(lg))
    gen.append(t)
    lg = step(t)
out["generated"], out["finite"] = gen, bool(np.isfinite(lg).all())
if engine == "goinfer" and prefill:
    rng = np.random.default_rng(prefill)
    out["prefill_s"] = bench.prefill_seconds(m, [int(x) for x in rng.integers(200, m.vocab_size - 200, prefill)])
import resource
out["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
print(json.dumps(out))
"""


def check(path, threads: int = 2, prefill: int = 512) -> dict:
    """Each engine in a fresh process on a written file: load, the same text's ids and top-5
    next tokens, 8 greedy tokens, the chat template's prompt length, and (goinfer) one cold
    prefill of `prefill` random tokens.  llama.cpp is skipped when not installed."""
    import subprocess

    try:
        import llama_cpp  # noqa: F401

        engines = ["goinfer", "llama.cpp"]
    except ImportError:
        print("llama.cpp: skipped (llama-cpp-python is not installed)")
        engines = ["goinfer"]
    res = {}
    for e in engines:
        r = subprocess.run(
            [sys.executable, "-c", CHECK, e, str(path), str(threads), str(prefill)],
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            raise RuntimeError(f"{e} failed on {path} ({r.returncode}):\n{r.stderr[-3000:]}")
        res[e] = json.loads(r.stdout.strip().splitlines()[-1])
        x = res[e]
        print(
            f"{Path(path).name} {e}: load {x['load_s']:.1f} s ({x['source']}), ids {x['ids']}, "
            f"top-5 {x['top5']}, greedy {x['generated']}, chat prompt {x['chat_ids']} tokens, "
            f"peak RSS {x['peak_rss_gb']:.2f} GB"
            + (f", prefill {prefill}: {x['prefill_s']:.1f} s" if "prefill_s" in x else ""),
            flush=True,
        )
    if len(res) == 2:
        a, b = res["goinfer"], res["llama.cpp"]
        print(
            f"goinfer vs llama.cpp: same ids {a['ids'] == b['ids']}, same top-1 "
            f"{a['top5'][0] == b['top5'][0]}, top-5 overlap {len(set(a['top5']) & set(b['top5']))}/5, "
            f"same chat prompt length {a['chat_ids'] == b['chat_ids']}",
            flush=True,
        )
    return res


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shapes", nargs="*", help=f"shape names: {', '.join(SHAPES)}")
    ap.add_argument("--type", default="Q4_0", help="Q4_0, Q8_0, Q4_K_M, ... (llama.cpp ftypes)")
    ap.add_argument(
        "--pure",
        action="store_true",
        help=f"write every matrix directly in --type ({', '.join(PURE_TYPES)}), no llama.cpp",
    )
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "shapes"))
    ap.add_argument("--vocab", default=None, help="ggml-vocab-<name>.gguf to use, or 'bytes'")
    ap.add_argument("--vocab-dir", default=None, help="llama.cpp's models/ directory")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--force", action="store_true", help="rewrite existing files")
    ap.add_argument("--list", action="store_true", help="the known shapes")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="the test suite's run: the tiny shapes (llama, Qwen3.5, gpt-oss), pure, byte "
        "vocabulary, loaded by goinfer (and llama.cpp when installed)",
    )
    ap.add_argument(
        "--layers",
        type=int,
        default=0,
        help="write only the first N layers (a real-width file that loads in less memory)",
    )
    ap.add_argument(
        "--check",
        nargs="+",
        metavar="FILE",
        help="load written files in goinfer and llama.cpp (fresh processes): same ids, "
        "same top-5, a few greedy tokens, one goinfer prefill of --check-prefill",
    )
    ap.add_argument("--check-prefill", type=int, default=512)
    regime.add_json_arg(ap)
    args = ap.parse_args(argv)
    res = {
        "benchmark": "shapes",
        "regime": regime.header(args.threads, argv=argv, peer_name="llama.cpp"),
    }
    if args.check:
        res["checks"] = {
            Path(f).name: check(f, args.threads, args.check_prefill) for f in args.check
        }
        return regime.finish(res, args.json)
    if args.list or not (args.shapes or args.smoke):
        print(
            f"{'name':<14} {'params':>7} {'arch':<7} {'d':>5} {'L':>3} {'H/KV':>6} {'hd':>4} {'ffn':>6} "
            f"{'vocab':>7}  model"
        )
        for s in SHAPES.values():
            moe = f" x{s.n_expert} top{s.n_expert_used}" if s.n_expert else ""
            if s.arch == "qwen35":
                moe = f" +{sum(s.recurrent_layers())}lin"
            print(
                f"{s.name:<14} {s.n_params() / 1e9:>6.2f}B {s.arch:<7} {s.d_model:>5} {s.n_layers:>3} "
                f"{s.n_heads:>3}/{s.n_kv_heads:<2} {s.head_dim:>4} {s.d_ff:>6}{moe} {s.vocab:>7}  {s.hf}"
            )
        return regime.finish(res, args.json)
    if args.smoke:
        with tempfile.TemporaryDirectory() as d:
            files = [
                make(SHAPES["tiny"], "Q8_0", Path(d), pure=True, vocab="bytes"),
                smoke_model(d),
                make(SHAPES["qwen3.5-tiny"], "Q4_0", Path(d), pure=True, vocab="bytes"),
                make(SHAPES["gpt-oss-tiny"], "MXFP4_MOE", Path(d), pure=True, vocab="bytes"),
            ]
            try:
                import llama_cpp  # noqa: F401
            except ImportError:
                llama_cpp = None
            res["checks"] = {f.name: check(f, threads=1, prefill=64) for f in files[2:]}
            res["files"] = []
            for f in files:
                lg = goinfer_logits(f, [1, 2, 3, 4])
                row = {
                    **regime.model(f),
                    "goinfer_logits_shape": list(lg.shape),
                    "goinfer_finite": bool(np.isfinite(lg).all()),
                }
                print(
                    f"smoke: {f.name} loads in goinfer, logits {lg.shape} finite {row['goinfer_finite']}"
                )
                if llama_cpp is not None:
                    lc = llama_cpp_logits(f, [1, 2, 3, 4])
                    row.update(
                        llama_cpp_logits_shape=list(lc.shape),
                        llama_cpp_finite=bool(np.isfinite(lc).all()),
                    )
                    print(f"smoke: {f.name} loads in llama.cpp, logits {lc.shape} finite")
                res["files"].append(row)
        return regime.finish(res, args.json)
    for name in args.shapes:
        if name not in SHAPES:
            ap.error(f"unknown shape {name!r}; known: {', '.join(SHAPES)}")
        shape = SHAPES[name]
        if args.layers:
            shape = dataclasses.replace(shape, name=f"{name}-{args.layers}L", n_layers=args.layers)
        path = make(
            shape,
            args.type,
            Path(args.out),
            pure=args.pure,
            vocab=args.vocab,
            vocab_dir=args.vocab_dir,
            threads=args.threads,
            force=args.force,
        )
        res.setdefault("written", []).append(regime.model(path))
    return regime.finish(res, args.json)


if __name__ == "__main__":
    main()
