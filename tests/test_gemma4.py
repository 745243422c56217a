"""Gemma 4 dense (models/gemma4.py): a tiny random-weight Gemma4ForCausalLM written by llama.cpp's
own converter (fixtures/hfconvert.py "gemma4": sliding and global layers with different head dims
and kv heads, k = v global layers, proportional RoPE, KV shared by the last 2 layers with a
double-wide MLP, per-layer embeddings, layer output scales, a final softcap) against
transformers float32 on the same ids; the numerics contract on it (prefill == decode steps ==
chunked prefill == 2 threads == continuous batching, prefix reuse, save/load, fork), its chat
template and tokenizer against transformers'.  The MoE variant (hfconvert.GEMMA4_MOE: routed
experts beside the dense MLP, router input scale, per-expert scales) likewise, and bad files.

Reference distance: llama.cpp reaches max |logit diff| 1.4e-1 (top-1 99.7%) against
transformers on the dense fixture, 9.6e-3 on the MoE one (benchmarks/families_reference.py
--family gemma4; its CPU GELU rounds its input to float16 and reads a float16 table); goinfer is
held to float32 agreement (fixtures.compare.close: 1e-4 x logit scale), far inside it, with
identical top-1."""

from __future__ import annotations

from collections import Counter

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_families import _decode_run, rewrite

from fixtures import hfconvert
from fixtures.compare import (
    assert_crossed_512,
    assert_one_prefill_is_every_schedule,
    assert_threads_agree,
    close,
    cut_points,
    cuts_of,
    hf_logits,
    lengths,
    load,
    note_512,
    pin_512,
)
from goinfer import KVCache
from goinfer._kernels import attention_counters, reset_attention_counters
from goinfer.batch import forward_sessions
from goinfer.chat import GEMMA4, tool_format
from goinfer.errors import CacheFileError, ModelFormatError, UnsupportedArchitectureError

LLAMA_CPP_DISTANCE = 1.4e-1  # max |logit diff| llama.cpp reaches on this fixture (1..300 tokens)
VOCAB = 400
# max |logit diff| / logit scale vs transformers over 1100 tokens: measured 2.3e-4 (1.4e-3 at
# positions 700..800; the NumPy reference kernels the same, float64 transformers 2.1e-4)
LONG_DISTANCE = 4e-4
SETTINGS = settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture(scope="module")
def gemma4():
    return hfconvert.build("gemma4")


@pytest.fixture(scope="module")
def gemma4moe():
    return hfconvert.build("gemma4", **hfconvert.GEMMA4_MOE)


@pytest.fixture(scope="module")
def models(gemma4):
    made = {}

    def get(threads=1, exact=False):
        if (threads, exact) not in made:
            made[threads, exact] = load(gemma4[1], threads=threads, exact=exact)
        return made[threads, exact]

    return get


def ids_(n, seed):
    return np.random.default_rng(seed).integers(0, VOCAB, n).tolist()


def agree(ours, ref):
    close(ours, ref)
    assert float(np.abs(ours - ref).max()) <= LLAMA_CPP_DISTANCE
    assert np.array_equal(ours.argmax(-1), ref.argmax(-1))


# ============================================================================ against transformers


@pytest.mark.parametrize("variant", ["gemma4", "gemma4moe"])
@pytest.mark.parametrize("kernels", ["compiled", "reference"])
def test_logits_match_transformers(variant, kernels, request):
    hf, path = request.getfixturevalue(variant)
    m = load(path, reference=kernels == "reference")
    for n in (1, 7, 70):  # 70: past the window (8) of the sliding layers
        ids = ids_(n, n)
        agree(m.logits(ids), hf_logits(hf, ids))


def test_config_and_cache_layers(gemma4, models):
    hf, _ = gemma4
    m = models()
    cfg, hc = m.config, hf.config
    assert cfg.arch == "gemma4" and cfg.n_layers == hc.num_hidden_layers
    assert cfg.swa_layers == tuple(t == "sliding_attention" for t in hc.layer_types)
    assert (cfg.head_dim, cfg.head_dim_swa, cfg.sliding_window) == (32, 16, 8)
    assert cfg.layer_heads_kv == (2, 2, 2, 1, 2, 1) and cfg.layer_d_ff == (96,) * 4 + (192,) * 2
    # the last 2 layers read the KV of the last earlier layer of their kind (transformers' rule)
    assert cfg.n_kv_layers == 4 and cfg.kv_source == (0, 1, 2, 3, 2, 3)
    assert hc.kv_sharing_modes[4:] == ["reuse", "reuse"]
    assert cfg.per_layer_dim == 8 and cfg.final_softcap == 30.0 and cfg.attn_scale == 1.0
    assert all(L.k_eq_v == (not s) for L, s in zip(m.impl.layers[:4], cfg.swa_layers))
    assert "reuse earlier KV" in cfg.describe()
    cache = KVCache(m, max_tokens=64, block_size=16)
    assert [k.shape for k in cache.k] == [(4, 2, 16, 16)] * 3 + [(4, 1, 32, 16)]
    assert cache.bytes_per_token == 4 * 2 * (3 * 2 * 16 + 32)  # f32 K and V, 4 cache layers


def test_parts_matter(gemma4):
    """Each Gemma 4 part moves the logits (so the comparison above can fail without it)."""
    hf, path = gemma4
    ids = ids_(30, 3)
    ref = hf_logits(hf, ids)

    def moved(edit):
        m = load(path)
        edit(m.impl)
        return float(np.abs(m.logits(ids) - ref).max())

    def no_ple(impl):
        impl.cfg.per_layer_dim = 0

    def no_scale(impl):
        for L in impl.layers:
            L.out_scale = 1.0

    def own_kv(impl):  # shared layers read the wrong (same-kind, earlier) layer's KV
        impl.cfg.kv_source = (0, 1, 2, 3, 1, 3)

    for edit in (no_ple, no_scale, own_kv):
        assert moved(edit) > 1e-2, edit.__name__


# ============================================================================ exact paths, bit for bit


@pytest.mark.parametrize("exact", [False, True])
def test_batching_threads_hypothesis(models, exact):
    """One prefill == decode steps (the last up to 40 tokens) == a random chunking == 2
    threads, lengths across one PREFILL_CHUNK and (default mode) the fast floor at 512; 511,
    512, 513, 560 cut at 512 and 560 in one call always run."""
    seen = Counter()
    batching_threads(models, exact, seen)
    assert_crossed_512(seen)


@SETTINGS
@pin_512(seed=6)
@given(n=lengths(560), cuts=cut_points(), seed=st.integers(0, 10**6))
def batching_threads(models, exact, seen, n, cuts, seed):
    cuts = cuts_of(n, cuts)
    note_512(seen, n, cuts)
    assert_one_prefill_is_every_schedule(*(models(1, exact), models(2, exact)), ids_(n, seed), cuts)


@pytest.mark.parametrize("exact", [False, True], ids=["default", "exact"])
def test_long_prompt_across_512(gemma4, models, exact):
    """1100 tokens (three prefill chunks, 137 sliding windows; in the default mode rows from 512
    on the fast kernel): one prefill == 2 threads == cut at 512 and 1024 == decode steps for the
    last 40, bit for bit, and the logits of every position against transformers' (LONG_DISTANCE:
    from about 500 tokens on the distance passes close()'s 1e-4 x logit scale)."""
    ids = ids_(1100, 12)
    reset_attention_counters()
    assert_one_prefill_is_every_schedule(models(1, exact), models(2, exact), ids, [512, 1024])
    assert (attention_counters()["fast_queries"] > 0) != exact
    ours, ref = models(1, exact).logits(ids), hf_logits(gemma4[0], ids)
    scale = float(np.abs(ref).max())
    assert float(np.abs(ours - ref).max()) <= LONG_DISTANCE * scale
    top2 = np.sort(ref, -1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 2 * LONG_DISTANCE * scale  # top-1 not within the distance
    assert clear.mean() > 0.95 and np.array_equal(ours.argmax(-1)[clear], ref.argmax(-1)[clear])


def test_threads_1_3_7(gemma4, many_shares):
    """1, 3 and 7 threads (odd counts split every kernel's work unevenly): the same bits for a
    prefill across 512 and batched decode steps."""
    assert_threads_agree(gemma4[1])


@SETTINGS
@given(data=st.data(), seed=st.integers(0, 10**6), block_size=st.sampled_from([16, 48]))
def test_prefix_reuse_hypothesis(models, data, seed, block_size):
    """A second session reuses the first one's cached blocks (the shared layers read them
    too), prefills the rest and gets a cold prefill's bits."""
    n = data.draw(st.integers(20, 300), label="n")
    shared = data.draw(st.integers(1, n - 1), label="shared")
    ids = ids_(n, seed)
    m = models(2)
    cache = KVCache(m, max_tokens=2 * n + 128, block_size=block_size)
    a = m.session(cache)
    a.prefill(ids[:shared] + ids_(5, seed + 1))
    b = m.session(cache)
    r = b.generate(ids, max_tokens=0)
    lcp = next(
        (i for i in range(min(len(a.tokens), n)) if a.tokens[i] != ids[i]), min(len(a.tokens), n)
    )
    assert r.cached_tokens == (min(lcp, n - 1) // block_size) * block_size
    assert np.array_equal(
        b.prefill([7]), m.session(KVCache(m, max_tokens=n + 64)).prefill(ids + [7])
    )


def test_fork_batching_and_save_load(models, tmp_path):
    m = models(2)
    ids = ids_(120, 5)
    ref = m.logits(ids)
    cache = KVCache(m, max_tokens=1024)
    s = m.session(cache)
    s.prefill(ids[:70])
    f = s.fork()
    assert np.array_equal(f.prefill(ids[70:100]), ref[99])
    assert np.array_equal(s.prefill(ids[70:90]), ref[89])  # the fork did not touch s
    a, b = m.session(cache), m.session(cache)  # continuous batching: a prefill beside a decode
    a.prefill(ids[:40])
    b.prefill(ids[:20])
    la, lb = forward_sessions([(a, ids[40:57]), (b, [ids[20]])])
    assert np.array_equal(la, ref[56]) and np.array_equal(lb, ref[20])
    path = tmp_path / "c.kv"
    assert cache.save(path) > 0
    loaded = KVCache.load(m, path)
    t = m.session(loaded)
    assert t.generate(ids[:110], max_tokens=0).cached_tokens == 96
    assert np.array_equal(t.prefill(ids[110:]), ref[-1])
    raw = bytearray(path.read_bytes())
    raw[-10] ^= 0xFF  # payload corrupted: refused, nothing added
    path.write_bytes(bytes(raw))
    other = KVCache(m, max_tokens=1024)
    with pytest.raises(CacheFileError):
        other.load(path)
    assert other.stats().blocks_cached == 0


@pytest.mark.parametrize("threads", [1, 2])
def test_decode_graph_replay_is_exact(gemma4, many_shares, threads):
    """Gemma 4 decode steps replayed as one graph (per-layer KV arrays, shared layers, the
    per-layer embeddings, the softcap kernel) give the Python path's bits: 3 sequences batched,
    then a session and its fork in turn through one plan."""
    _, path = gemma4
    prompts = [ids_(n, 40 + n) for n in (5, 13, 2)]
    ref = _decode_run(load(path, graph=False), prompts, 20)
    m = load(path, threads=threads)
    assert m.graph is not None
    assert np.array_equal(_decode_run(m, prompts, 20), ref)
    assert m.graph.replays == 20 and m.graph.captures == 1  # (an unbindable op disables it)
    ref1 = _decode_run(load(path, graph=False), prompts[:1], 16, fork_at=5)
    m1 = load(path, threads=threads)
    assert np.array_equal(_decode_run(m1, prompts[:1], 16, fork_at=5), ref1)
    assert m1.graph.captures == 1 and m1.graph.replays == 16


# ============================================================================ template, bad input


def test_chat_template_and_tokenizer_match_transformers(gemma4, models):
    from transformers import AutoTokenizer

    _, path = gemma4
    m = models()
    ht = AutoTokenizer.from_pretrained(path.parent / "hf")
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "the weather in\n\nParis, \u00e9t\u00e9 \U0001f999?"},
    ]
    text = m.apply_chat_template(msgs)
    assert text == ht.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<bos><|turn>system\n")
    assert text.endswith("<|turn>model\n<|channel>thought\n<channel|>")
    ids = m.tokenize_chat(text)
    assert (
        ids == ht(text, add_special_tokens=False).input_ids and ids.count(m.tokenizer.bos_id) == 1
    )
    assert m.detokenize(ids) == text
    # tools, a call and its result in Gemma 4's own format, with and without thinking
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather of a city",
                "parameters": {
                    "type": "object",
                    "required": ["city"],
                    "properties": {
                        "city": {"type": "string", "description": "the city"},
                        "days": {"type": "integer"},
                        "units": {"type": "string", "enum": ["c", "f"]},
                    },
                },
            },
        }
    ]
    hist = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": '{"t": 21}'},
        {"role": "assistant", "content": "Sunny."},
        {"role": "user", "content": "and then?"},
    ]
    for kw in ({}, {"enable_thinking": True}):
        text = m.apply_chat_template(hist, tools=tools, **kw)
        assert text == ht.apply_chat_template(
            hist, tools=tools, tokenize=False, add_generation_prompt=True, **kw
        )
        assert '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:2}<tool_call|>' in text
        assert m.tokenize_chat(text) == ht(text, add_special_tokens=False).input_ids
    # tool requests use Gemma 4's own format (tests/test_gemma4_tools.py parses and
    # constrains it and checks the history against transformers)
    assert tool_format(m) is GEMMA4


@pytest.mark.parametrize("variant", ["gemma4", "gemma4moe"])
def test_layout_cache_gives_the_same_bits(variant, request, tmp_path, monkeypatch):
    _, path = request.getfixturevalue(variant)
    monkeypatch.setenv("GOINFER_LAYOUT_DIR", str(tmp_path))
    ids = ids_(40, 2)
    want = load(path, layout_cache=False).logits(ids)
    built = load(path, layout_cache=True)
    mapped = load(path, layout_cache=True)
    assert (built.load_info.source, mapped.load_info.source) == ("built", "layout")
    assert np.array_equal(built.logits(ids), want) and np.array_equal(mapped.logits(ids), want)


def test_moe_config_experts_and_identities(gemma4moe):
    """The MoE file runs every layer's router and experts (counted) beside the dense MLP;
    expert-major GEMMs == token by token, prefill == decode steps == 2 threads, bit for bit."""
    _, path = gemma4moe
    m, m2 = load(path), load(path, threads=2)
    cfg = m.config
    assert type(m.impl).__name__ == "Gemma4MoEFamily" and "beside the dense MLP" in cfg.describe()
    assert (cfg.n_expert, cfg.n_expert_used, cfg.d_ff_expert) == (4, 2, 32)
    assert all(L.moe is not None and L.w_down is not None for L in m.impl.layers)
    ids = ids_(300, 11)
    m.impl.moe.stats.reset()
    one = m.logits(ids)
    assert m.impl.moe.stats.expert_rows == 4 * 300 * 2  # every layer routes every row to 2 experts
    m2.impl.moe.expert_major = False
    assert np.array_equal(one, m2.logits(ids))
    s = m.session(KVCache(m, max_tokens=512))
    s.prefill(ids[:260])
    for i in range(260, 300):
        assert np.array_equal(s.decode(ids[i]), one[i])


def test_bad_files_get_typed_errors(gemma4, gemma4moe, tmp_path):
    _, path = gemma4
    with pytest.raises(ModelFormatError, match="expert_count"):  # experts claimed, none there
        load(
            rewrite(
                path,
                tmp_path / "e.gguf",
                add=[
                    ("{arch}.expert_count", 4, gguf.GGUFValueType.UINT32),
                    ("{arch}.expert_used_count", 2, gguf.GGUFValueType.UINT32),
                ],
            )
        )
    with pytest.raises(UnsupportedArchitectureError, match="RoPE scaling 'yarn'"):
        load(
            rewrite(
                path,
                tmp_path / "y.gguf",
                add=[("{arch}.rope.scaling.type", "yarn", gguf.GGUFValueType.STRING)],
            )
        )
    with pytest.raises(ModelFormatError, match="shared-KV layers"):
        load(
            rewrite(
                path,
                tmp_path / "s.gguf",
                drop=("gemma4.attention.shared_kv_layers",),
                add=[("{arch}.attention.shared_kv_layers", 6, gguf.GGUFValueType.UINT32)],
            )
        )
    _, mpath = gemma4moe
    with pytest.raises(UnsupportedArchitectureError, match="gating function"):
        load(
            rewrite(
                mpath,
                tmp_path / "g.gguf",
                add=[("{arch}.expert_gating_func", 2, gguf.GGUFValueType.UINT32)],
            )
        )
