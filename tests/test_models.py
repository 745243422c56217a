"""Each architecture against Hugging Face transformers on tiny random-weight models.

The tests build the HF model, write it to GGUF (F32, laid out as llama.cpp's converter does),
load it with goinfer and compare logits over random prompts.  float32 tolerance: both sides
compute in float32 (goinfer's attention in float64), so differences come from summation
order; they stay below 1e-4 of the logit scale."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fixtures import tinymodels
from fixtures.compare import close, hf_logits, load

ARCHS = ["llama", "mistral", "qwen2", "qwen3"]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kernels", ["compiled", "reference"])
def test_logits_match_transformers(tiny, arch, kernels):
    hf, path = tiny(arch)
    m = load(path, reference=kernels == "reference")
    rng = np.random.default_rng(1)
    for n in (1, 7, 33):
        ids = rng.integers(0, hf.config.vocab_size, n).tolist()
        close(m.logits(ids), hf_logits(hf, ids))


@pytest.mark.parametrize(
    "arch, dtype", [("llama", "f16"), ("qwen2", "f16"), ("qwen3", "f16"), ("qwen3", "q8_0")]
)
def test_kv_dtype_logits_match_reference_kernels(tiny, arch, dtype):
    """Compiled kernels over a float16 / q8_0 KV cache == the NumPy reference kernels (which
    round k and v the same way, goinfer._reference.kv_write) within float32 tolerance, for a
    prefill and decode steps; and the storage type is really used (the cache's arrays)."""
    hf, path = tiny(arch)
    m, ref = load(path, kv_dtype=dtype), load(path, reference=True, kv_dtype=dtype)
    ids = np.random.default_rng(5).integers(0, hf.config.vocab_size, 30).tolist()
    close(m.logits(ids), ref.logits(ids))
    s, r = m.session(), ref.session()
    assert s.cache.dtype == dtype and s.cache.k.dtype == {"f16": np.float16, "q8_0": np.int8}[dtype]
    got = [s.prefill(ids[:20])] + [s.decode(t) for t in ids[20:]]
    want = [r.prefill(ids[:20])] + [r.decode(t) for t in ids[20:]]
    close(np.stack(got), np.stack(want))


@pytest.mark.parametrize(
    "arch, dtype, cos_min",
    [("llama", "f16", 0.9999), ("qwen3", "f16", 0.9999), ("qwen3", "q8_0", 0.999)],
)
def test_kv_dtype_stays_close_to_transformers(tiny, arch, dtype, cos_min):
    """Rounding k and v once (f16: relative 2^-11; q8_0: half a step of amax/127 per 32
    values) keeps each position's logits near transformers' float32 ones: cosine >= 0.9999
    (f16) / 0.999 (q8_0) on these random tiny models, where f32 stays within close()."""
    hf, path = tiny(arch)
    m = load(path, kv_dtype=dtype)
    ids = np.random.default_rng(6).integers(0, hf.config.vocab_size, 40).tolist()
    ours, ref = m.logits(ids).astype(np.float64), hf_logits(hf, ids).astype(np.float64)
    cos = (ours * ref).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(ref, axis=1)
    assert float(cos.min()) >= cos_min, float(cos.min())
    assert not np.array_equal(ours, load(path).logits(ids))  # the rounding did happen


def test_arch_features_detected(tiny):
    assert load(tiny("qwen2")[1]).config.qkv_bias
    assert load(tiny("qwen3")[1]).config.qk_norm
    assert load(tiny("qwen2")[1]).config.rope_neox
    assert not load(tiny("llama")[1]).config.rope_neox


@pytest.mark.parametrize("arch", ARCHS)
def test_incremental_decode_matches_transformers(tiny, arch):
    hf, path = tiny(arch)
    m = load(path)
    ids = np.random.default_rng(2).integers(0, 320, 40).tolist()
    ref = hf_logits(hf, ids)
    s = m.session()
    got = [s.prefill(ids[:9])] + [s.decode(t) for t in ids[9:]]
    close(np.stack(got), ref[8:])


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    arch=st.sampled_from(ARCHS),
    heads=st.sampled_from([(4, 4), (4, 2), (4, 1), (6, 2)]),
    tied=st.booleans(),
    seed=st.integers(0, 1000),
    n=st.integers(1, 60),
)
def test_random_configs_match_transformers(tmp_path_factory, arch, heads, tied, seed, n):
    H, KV = heads
    over = dict(
        num_attention_heads=H,
        num_key_value_heads=KV,
        tie_word_embeddings=tied,
        hidden_size=16 * H if arch != "qwen3" else 64,
    )
    hf = tinymodels.hf_model(arch, seed, **over)
    path = tinymodels.write_gguf(hf, arch, tmp_path_factory.mktemp("cfg") / "m.gguf")
    m = load(path)
    assert m.config.tied_embeddings == tied
    ids = np.random.default_rng(seed).integers(0, 320, n).tolist()
    close(m.logits(ids), hf_logits(hf, ids))


def test_int_weights_track_transformers(tiny, tmp_path):
    """A GGUF with Q8_0 / Q4_0 / Q4_1 tensors against transformers running the dequantized
    weights: W4A8/W8A8 differ from float by the int8 activation rounding, so here the check is
    agreement (cosine of logits and top-1), not float tolerance."""
    import gguf
    import torch

    hf, _ = tiny("llama", 5)
    for qtype in (
        gguf.GGMLQuantizationType.Q8_0,
        gguf.GGMLQuantizationType.Q4_0,
        gguf.GGMLQuantizationType.Q4_1,
    ):
        model = tinymodels.hf_model("llama", 5)
        with torch.no_grad():  # give transformers the values the file will hold
            for name, p in model.named_parameters():
                if p.dim() == 2 and "embed" not in name:
                    q = gguf.quants.quantize(p.numpy(), qtype)
                    p.copy_(torch.from_numpy(gguf.quants.dequantize(q, qtype).reshape(p.shape)))
        path = tinymodels.write_gguf(model, "llama", tmp_path / f"q{qtype.name}.gguf", qtype=qtype)
        m = load(path)
        assert {w.kind for L in m.impl.layers for w in L.weights()} == {qtype.name.lower()}
        ids = np.random.default_rng(3).integers(0, 320, 48).tolist()
        ours, ref = m.logits(ids), hf_logits(model, ids)
        cos = (ours * ref).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(ref, axis=1)
        top1 = (ours.argmax(1) == ref.argmax(1)).mean()
        assert cos.min() > 0.995, (qtype.name, cos.min())  # measured 0.9971 (Q4_1) .. 0.9989
        assert top1 >= 0.9, (qtype.name, top1)


def test_load_options_and_keywords_are_one_set(tiny):
    """Model and Model.load take a LoadOptions and/or its fields as keywords (the keywords
    override the options); an unknown keyword is a TypeError naming it."""
    from goinfer import LoadOptions, Model
    from goinfer.gguf import GGUFFile

    path = tiny("qwen2")[1]
    opts = LoadOptions(threads=1, progress=False, layout_cache=False, kv_dtype="f32")
    a = Model(GGUFFile(path), opts)
    b = Model(GGUFFile(path), threads=1, progress=False, layout_cache=False, kv_dtype="f32")
    c = Model.load(str(path), 1, True, options=opts, kv_dtype="f16")  # threads, exact positional
    assert a.options == b.options == opts and a.threads == 1 and not a.exact
    assert c.exact and c.threads == 1 and c.kv_dtype == "f16" and c.options.progress is False
    ids = [5, 9, 200, 31]
    assert np.array_equal(a.logits(ids), b.logits(ids))
    with pytest.raises(TypeError, match="treads"):
        Model(GGUFFile(path), opts, treads=2)
    with pytest.raises(TypeError, match="treads"):
        Model.load(str(path), treads=2)
