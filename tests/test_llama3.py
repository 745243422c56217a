"""Llama 3.x as llama.cpp converts it (fixtures/hfconvert.py, family "llama"): Llama 3.1's RoPE
scaling (rope_type "llama3", which convert_hf_to_gguf.py writes as a ``rope_freqs.weight`` tensor
of per-dimension frequency divisors) against transformers float32 on the same ids.

The tiny config (head_dim 16, theta 500000) has original_max_position_embeddings 64, so the
scaling's three bands all occur among its 8 frequencies (wavelengths 6.3: kept; 33: smoothed;
169 and longer: divided by the factor 8), and the prompt runs to position 200, three times past
the original context: a model that ignored rope_freqs (or read it inverted) is far off."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fixtures import hfconvert
from fixtures.compare import close, hf_logits, load
from goinfer.gguf import GGUFFile

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
N = 200  # prompt tokens: positions 0..199, past 64 by three times


@pytest.fixture(scope="module")
def llama31():
    return hfconvert.build("llama", seed=4, rope_parameters=LLAMA3_ROPE)


@pytest.fixture(scope="module")
def ids():
    return np.random.default_rng(11).integers(0, 320, N).tolist()


def test_rope_freqs_hold_the_three_bands(llama31):
    """The file holds what the converter computes: 1 for short wavelengths, the factor for
    long ones, a smooth blend between (checked here against Meta's formula, not the file's)."""
    _, path = llama31
    rf = GGUFFile(path).load_f32("rope_freqs.weight")  # (head_dim / 2,)
    p = LLAMA3_ROPE
    inv = 500000.0 ** (-np.arange(0, 16, 2) / 16)  # (8,)
    lo, hi = p["original_max_position_embeddings"] / np.array([1.0, 4.0])
    want = []
    for f in inv:
        wl = 2 * math.pi / f
        if wl < hi:
            want.append(1.0)
        elif wl > lo:
            want.append(p["factor"])
        else:
            s = (64 / wl - 1.0) / (4.0 - 1.0)
            want.append(1 / ((1 - s) / p["factor"] + s))
    assert np.allclose(rf, want, rtol=1e-6)
    assert rf[0] == 1.0 and 1.0 < rf[1] < 8.0 and (rf[2:] == 8.0).all()


@pytest.mark.parametrize("threads", [1, 3])
def test_logits_match_transformers(llama31, ids, threads):
    """Every position of a 200-token prompt, one prefill, against transformers; then the last
    40 tokens as decode steps (the RoPE of a single row) give the same rows bit for bit."""
    hf, path = llama31
    m = load(path, threads=threads)
    ref = hf_logits(hf, ids)  # (N, vocab)
    ours = m.logits(ids)
    close(ours, ref)
    assert (ours.argmax(-1) == ref.argmax(-1)).mean() >= 0.99
    s = m.session()
    s.prefill(ids[: N - 40])
    for i, t in enumerate(ids[N - 40 :]):
        assert np.array_equal(s.decode(t), ours[N - 40 + i]), i


def test_without_rope_freqs_it_is_another_model(llama31, ids):
    """The same weights under plain RoPE (transformers without the scaling) are far from the
    scaled model past the original context: the comparison above can tell them apart."""
    import transformers

    hf, _ = llama31
    cfg = hf.config.to_dict()
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 500000.0}
    plain = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg)).eval()
    plain.load_state_dict(hf.state_dict())
    a, b = hf_logits(hf, ids), hf_logits(plain, ids)
    scale = float(np.abs(a).max())
    assert np.abs(a[64:] - b[64:]).max() > 100 * (1e-4 * scale + 1e-5)
