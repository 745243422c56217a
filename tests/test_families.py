"""SmolLM3 (models/smollm3.py), Qwen3.5 dense and MoE (models/qwen35.py): tiny random-weight models
written by llama.cpp's own converter (fixtures/hfconvert.py) against transformers float32 on the
same ids, and the numerics contract on them (tests/test_numerics.py's identities): prefill ==
token-by-token decode == chunked prefill == 2 threads, bit for bit; on the hybrid Qwen3.5 also
prefix reuse through state snapshots, an agent's growing context, truncate, fork, continuous
batching and save/load.

Reference distance: llama.cpp itself reaches max |logit diff| 2.0e-3 against transformers on
such tiny Qwen3.5 models (tests/tools/families_reference.py measures both engines); goinfer is
held to that and to float32 agreement (fixtures.compare.close: 1e-4 x logit scale), with identical
top-1 everywhere."""

from __future__ import annotations

import json
import warnings
from collections import Counter

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
from goinfer.errors import CacheFileError, ModelFormatError, UnsupportedArchitectureError

LLAMA_CPP_DISTANCE = 2.0e-3  # max |logit diff| llama.cpp reaches on tiny Qwen3.5
SETTINGS = settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture(scope="module")
def smollm3():
    return hfconvert.build("smollm3")


@pytest.fixture(scope="module")
def qwen35():
    """4 layers: 3 Gated DeltaNet (2 key / 4 value heads: the converter reorders V heads) + 1
    attention (4 heads, 2 kv, head_dim 32, 8 rotated dims)."""
    return hfconvert.build("qwen35")


@pytest.fixture(scope="module")
def qwen35moe():
    """qwen35's mixers (3 Gated DeltaNet + 1 attention) with an MoE FFN in every layer: 6
    experts (ffn 32), top 3 renormalized, a shared expert (ffn 48) behind a sigmoid gate."""
    return hfconvert.build("qwen35moe")


@pytest.fixture(scope="module")
def models(qwen35, smollm3, qwen35moe):
    made = {}

    def get(name, threads=1, exact=False):
        key = (name, threads, exact)
        if key not in made:
            fx = {"qwen35": qwen35, "smollm3": smollm3, "qwen35moe": qwen35moe}[name]
            made[key] = load(fx[1], threads=threads, exact_prefill=exact)
        return made[key]

    return get


def ids_(n, seed, vocab=320):
    return np.random.default_rng(seed).integers(0, vocab, n).tolist()


def agree(ours, ref):
    """float32 agreement, within llama.cpp's own distance, identical top-1."""
    close(ours, ref)
    assert float(np.abs(ours - ref).max()) <= LLAMA_CPP_DISTANCE
    assert np.array_equal(ours.argmax(-1), ref.argmax(-1))


# ============================================================================ against transformers


@pytest.mark.parametrize("family", ["smollm3", "qwen35", "qwen35moe"])
@pytest.mark.parametrize("kernels", ["compiled", "reference"])
def test_logits_match_transformers(family, kernels, request):
    hf, path = request.getfixturevalue(family)
    m = load(path, reference=kernels == "reference")
    for n in (1, 7, 70):
        ids = ids_(n, n)
        agree(m.logits(ids), hf_logits(hf, ids))


QWEN_VARIANTS = {
    # 8 layers (2 attention), Hk == Hv (no V reordering), tied embeddings, conv kernel 3
    "wide": dict(
        num_hidden_layers=8,
        linear_num_value_heads=2,
        tie_word_embeddings=True,
        linear_conv_kernel_dim=3,
    ),
    # an explicit layer pattern that is not every 4th, 3 value heads per key head
    "pattern": dict(
        num_hidden_layers=5,
        layer_types=[
            "full_attention",
            "linear_attention",
            "linear_attention",
            "full_attention",
            "linear_attention",
        ],
        linear_num_value_heads=6,
        linear_num_key_heads=2,
    ),
}


@pytest.mark.parametrize("variant", sorted(QWEN_VARIANTS))
def test_qwen35_variants_match_transformers(variant):
    hf, path = hfconvert.build("qwen35", 1, **QWEN_VARIANTS[variant])
    m = load(path)
    assert m.config.recurrent == tuple(t == "linear_attention" for t in hf.config.layer_types)
    for n in (3, 50):
        ids = ids_(n, 9 + n)
        agree(m.logits(ids), hf_logits(hf, ids))


def test_qwen35moe_config_and_experts(models):
    m = models("qwen35moe")
    cfg = m.config
    assert cfg.arch == "qwen35moe" and cfg.recurrent == (True, True, True, False)
    assert (cfg.n_expert, cfg.n_expert_used, cfg.d_ff_expert, cfg.d_ff_shared) == (6, 3, 32, 48)
    assert cfg.routing == "softmax_topk" and cfg.norm_topk and m.impl.moe.renorm
    assert all(L.moe is not None and L.moe.shared is not None for L in m.impl.layers)
    assert "6 experts" in cfg.describe() and "Gated DeltaNet" in cfg.describe()
    m.impl.moe.stats.reset()
    m.logits(ids_(9, 1))
    assert m.impl.moe.stats.expert_rows == 4 * 9 * 3  # every layer routes every row to 3 experts


def test_qwen35_config_and_cache_layers(models):
    m = models("qwen35")
    cfg = m.config
    assert cfg.arch == "qwen35" and cfg.recurrent == (True, True, True, False)
    assert (cfg.n_k_heads_lin, cfg.n_v_heads_lin, cfg.d_state, cfg.conv_kernel) == (2, 4, 16, 4)
    assert cfg.n_rot == 8 and cfg.rope_neox and cfg.n_kv_layers == 1
    assert "3 Gated DeltaNet layers" in cfg.describe()
    cache = KVCache(m, max_tokens=64)
    assert cache.k.shape[0] == 1 and cache.states is not None  # KV for attention layers only


def test_smollm3_nope_layers_matter(smollm3):
    """Every 4th layer has no RoPE; with RoPE there too the logits leave transformers'."""
    hf, path = smollm3
    m = load(path)
    assert m.config.rope_layers == tuple((i + 1) % 4 != 0 for i in range(8))
    ids = ids_(40, 3)
    ref = hf_logits(hf, ids)
    agree(m.logits(ids), ref)
    m.config.rope_layers = (True,) * 8
    assert np.abs(m.logits(ids) - ref).max() > 100 * np.abs(load(path).logits(ids) - ref).max()


def test_chat_templates_come_from_the_files(models):
    """The converter writes each family's real template (llama.cpp's models/templates);
    Model.config.arch names the family (agent tool-call formats key on it)."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_time",
                "description": "Time now",
                "parameters": {"type": "object", "properties": {}},
            },
        }
    ]
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    q = models("qwen35")
    text = q.apply_chat_template(msgs, tools=tools)
    assert q.chat_template == hfconvert.template("Qwen3.5-4B")
    assert (
        "<tools>" in text
        and "get_time" in text
        and text.endswith("<|im_start|>assistant\n<think>\n")
    )
    s = models("smollm3")
    assert s.chat_template == hfconvert.template("HuggingFaceTB-SmolLM3-3B")
    assert "<|im_start|>assistant" in s.apply_chat_template(msgs)


# ============================================================================ exact paths, bit for bit


def test_batching_threads_hypothesis(models):
    """exact_prefill, lengths across one PREFILL_CHUNK: one prefill == decode steps (the last up
    to 40 tokens) == a random chunking == 2 threads.  511, 512, 513, 560 cut at 512 and 560 in
    one call always run (on Qwen3.5: the recurrent state handed from one chunk to the next)."""
    seen = Counter()
    batching_threads(models, seen)
    assert_crossed_512(seen)


@SETTINGS
@pin_512(family="qwen35", seed=4)
@given(
    n=lengths(560),
    cuts=cut_points(),
    family=st.sampled_from(["smollm3", "qwen35", "qwen35moe"]),
    seed=st.integers(0, 10**6),
)
def batching_threads(models, seen, n, cuts, family, seed):
    cuts = cuts_of(n, cuts)
    note_512(seen, n, cuts)
    ids = ids_(n, seed)
    assert_one_prefill_is_every_schedule(
        *(models(family, 1, True), models(family, 2, True)), ids, cuts
    )


@pytest.mark.parametrize("family", ["smollm3", "qwen35", "qwen35moe"])
@pytest.mark.parametrize("exact", [False, True], ids=["default", "exact"])
def test_long_prompt_across_512(models, request, family, exact):
    """1100 tokens (three prefill chunks; in the default mode the attention layers' rows from 512
    on the fast kernel): one prefill == 2 threads == cut at 512 and 1024 == decode steps for the
    last 40, bit for bit, and the logits of every position against transformers'."""
    m1, m2 = models(family, 1, exact), models(family, 2, exact)
    ids = ids_(1100, 11)
    reset_attention_counters()
    assert_one_prefill_is_every_schedule(m1, m2, ids, [512, 1024])
    assert (attention_counters()["fast_queries"] > 0) != exact
    agree(m1.logits(ids), hf_logits(request.getfixturevalue(family)[0], ids))


@SETTINGS
@given(
    data=st.data(),
    seed=st.integers(0, 10**6),
    every=st.sampled_from([1, 4]),
    family=st.sampled_from(["qwen35", "qwen35moe"]),
)
def test_hybrid_prefix_reuse_hypothesis(models, data, seed, every, family):
    """A second session reuses the first one's blocks up to the latest state snapshot (every
    `every` blocks) inside their common prefix, prefills the rest, and gets a cold prefill's
    bits."""
    m = models(family, 2)
    n = data.draw(st.integers(2, 300), label="n")
    shared = data.draw(st.integers(1, n), label="shared")
    ids = ids_(n, seed)
    cache = KVCache(m, max_tokens=2048, snapshot_every=every)
    a = m.session(cache)
    a.prefill(ids[:shared] + ids_(5, seed + 1, 300))
    lcp = next(
        (i for i in range(min(len(a.tokens), n)) if a.tokens[i] != ids[i]), min(len(a.tokens), n)
    )
    b = m.session(cache)
    r = b.generate(ids, max_tokens=0)
    step = cache.block_size * every
    assert r.cached_tokens == (min(lcp, n - 1) // step) * step
    cold = m.session(KVCache(m, max_tokens=512)).prefill(ids + [7])
    assert np.array_equal(b.prefill([7]), cold)


def test_hybrid_agent_turns_prefill_only_the_new_suffix(models):
    """Turn 2 extends turn 1's whole history (prompt + reply): only the new tokens are
    prefilled.  Turn 3 diverges right after turn 2's prompt (a re-rendered reply): it resumes
    from the state kept at that prompt end."""
    m = models("qwen35")
    cache = KVCache(m, max_tokens=2048)
    s = m.session(cache)
    p1 = ids_(150, 1)
    r1 = s.generate(p1, max_tokens=6)
    p2 = p1 + r1.tokens + ids_(30, 2)
    r2 = s.generate(p2, max_tokens=4)
    assert (
        r2.cached_tokens == len(p1) + len(r1.tokens) - 1
    )  # all it held (the last reply token was never fed)
    p3 = p2 + ids_(3, 3) + ids_(20, 4)  # a different "reply" after p2
    r3 = s.generate(p3, max_tokens=0)
    assert r3.cached_tokens == len(p2)
    fresh = m.session(KVCache(m, max_tokens=512))
    assert np.array_equal(s.prefill([5]), fresh.prefill(p3 + [5]))


def test_hybrid_truncate_fork_and_batching(models):
    m = models("qwen35", 2)
    ids = ids_(200, 5)
    ref = m.logits(ids)
    s = m.session(KVCache(m, max_tokens=1024))
    s.prefill(ids[:170])
    s.truncate(101)  # no state at 101: resumes from the snapshot at 64 and recomputes 37 tokens
    assert s.n_tokens == 101
    f = s.fork()
    assert np.array_equal(f.prefill(ids[101:140]), ref[139])
    assert np.array_equal(s.prefill(ids[101:120]), ref[119])  # the fork did not touch s
    # continuous batching: two hybrid sessions in one forward step, one prefilling across a
    # snapshot boundary, one decoding
    cache = KVCache(m, max_tokens=1024)
    a, b = m.session(cache), m.session(cache)
    a.prefill(ids[:60])
    b.prefill(ids[:30])
    la, lb = forward_sessions([(a, ids[60:75]), (b, [ids[30]])])
    assert np.array_equal(la, ref[74]) and np.array_equal(lb, ref[30])
    assert len(cache.states) == 1  # the snapshot at 64 was taken inside a's batched step
    c = m.session(cache)
    assert c.generate(ids[:100], max_tokens=0).cached_tokens == 64


def test_hybrid_cache_full_after_reuse_restores_state(models):
    """prefill() that takes cached blocks (and loads their recurrent state), then cannot get
    a new block: the session gives the blocks back and gets its own state back."""
    from goinfer import CacheFullError

    m = models("qwen35")
    cache = KVCache(m, max_tokens=64, block_size=16, snapshot_every=1)  # 4 blocks
    shared = ids_(40, 16)
    a = m.session(cache)
    a.prefill(shared)  # 3 blocks, the first 2 hashed, with state snapshots
    c = m.session(cache)
    c.prefill(ids_(5, 17))  # the last block
    b = m.session(cache)
    with pytest.raises(CacheFullError):
        b.prefill(shared[:32] + [1, 2])
    assert b.n_tokens == 0
    f = a.fork()
    f.truncate(16)
    with pytest.raises(CacheFullError):
        f.prefill(shared[16:32] + [1, 2])
    assert f.tokens == shared[:16]
    c.reset()  # room again; these prefills reuse nothing, so they run on each one's own state
    assert np.array_equal(b.prefill([3, 4, 5]), m.logits([3, 4, 5])[-1])
    b.reset()
    assert np.array_equal(f.prefill([3, 4, 5]), m.logits(shared[:16] + [3, 4, 5])[-1])


def test_hybrid_save_and_load(models, tmp_path):
    m = models("qwen35")
    ids = ids_(160, 6)
    cache = KVCache(m, max_tokens=1024)
    m.session(cache).prefill(ids[:150])
    path = tmp_path / "c.kv"
    cache.save(path)
    loaded = KVCache.load(m, path)
    s = m.session(loaded)
    assert s.generate(ids, max_tokens=0).cached_tokens == 128
    assert np.array_equal(s.prefill([1]), m.session(KVCache(m, max_tokens=512)).prefill(ids + [1]))
    # a corrupt snapshot file is refused and nothing is added
    states = path.with_name("c.kv.states.npz")
    raw = bytearray(states.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # inside the ssm array data
    states.write_bytes(bytes(raw))
    other = KVCache(m, max_tokens=1024)
    with pytest.raises(CacheFileError):
        other.load(path)
    assert len(other.states) == 0 and other.stats().blocks_cached == 0


# ============================================================================ bad input


def rewrite(src, dst, arch=None, add=(), drop=(), block_delta=0, copy_block=None):
    """Copy a GGUF with changed metadata: add [(key, value)], drop key names, block_count +
    block_delta, copy_block (src_i, dst_i) duplicates a layer's tensors."""
    r = gguf.GGUFReader(str(src))
    a0 = r.fields["general.architecture"].contents()
    arch = arch or a0
    w = gguf.GGUFWriter(str(dst), arch)
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture" or k in drop:
            continue
        v = f.contents()
        k2 = k.replace(a0 + ".", arch + ".", 1)
        if k2 == f"{arch}.block_count":
            v += block_delta
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            w.add_key_value(k2, v, vt, sub_type=f.types[-1])
        else:
            w.add_key_value(k2, v, vt)
    for k, v, vt in add:
        w.add_key_value(k.format(arch=arch), v, vt)
    for t in r.tensors:
        w.add_tensor(
            t.name,
            np.array(t.data),
            raw_shape=list(reversed(t.shape.tolist())),
            raw_dtype=t.tensor_type,
        )
        if copy_block and t.name.startswith(f"blk.{copy_block[0]}."):
            w.add_tensor(
                t.name.replace(f"blk.{copy_block[0]}.", f"blk.{copy_block[1]}.", 1),
                np.array(t.data),
                raw_shape=list(reversed(t.shape.tolist())),
                raw_dtype=t.tensor_type,
            )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_mtp_head_is_skipped_with_a_warning(qwen35, tmp_path):
    hf, path = qwen35
    p = rewrite(
        path,
        tmp_path / "mtp.gguf",
        block_delta=1,
        copy_block=(3, 4),
        add=[("{arch}.nextn_predict_layers", 1, gguf.GGUFValueType.UINT32)],
    )
    with pytest.warns(UserWarning, match="multi-token-prediction"):
        m = load(p)
    assert m.config.n_layers == 4 and m.config.n_mtp == 1
    ids = ids_(20, 8)
    agree(m.logits(ids), hf_logits(hf, ids))


def test_unsupported_features_get_typed_errors(qwen35, tmp_path):
    _, path = qwen35
    with pytest.raises(UnsupportedArchitectureError, match="experts"):
        load(
            rewrite(
                path,
                tmp_path / "e.gguf",
                add=[("{arch}.expert_count", 4, gguf.GGUFValueType.UINT32)],
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
    with pytest.raises(ModelFormatError, match="mixture of experts"):  # a dense file claiming MoE
        load(rewrite(path, tmp_path / "moe.gguf", arch="qwen35moe"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load(path)  # the plain file loads without a warning


def test_converter_cache_layout():
    """The converter is found (or fetched) once and kept: its license comes with it."""
    d = hfconvert.converter_dir()
    assert (d / "convert_hf_to_gguf.py").is_file() and (d / "LICENSE").is_file()
    assert "MIT" in (d / "LICENSE").read_text()
    assert json.loads(json.dumps(sorted(hfconvert.FAMILIES))) == [
        "gemma4",
        "gpt-oss",
        "llama",
        "qwen3",
        "qwen35",
        "qwen35moe",
        "smollm3",
    ]


@pytest.mark.parametrize("family", ["smollm3", "qwen35moe"])
def test_threads_1_3_7(request, family, many_shares):
    """1, 3 and 7 threads (odd counts split every kernel's work unevenly): the same bits for a
    prefill across 512 and batched decode steps (Qwen3.5 MoE: ssm, moe and attention kernels)."""
    assert_threads_agree(request.getfixturevalue(family)[1])


# ============================================================================ graph replay (hybrid)


def _decode_run(m, prompts, steps, fork_at=None):
    """Batched greedy decode of len(prompts) hybrid sessions (block size 4: a state snapshot
    every 16 tokens); fork_at: fork session 0 at that step and alternate the two afterwards.
    -> logits of every step (steps, B, vocab)."""
    from goinfer.batch import decode_batch

    cache = KVCache(m, max_tokens=1024, block_size=4)
    ss = [m.session(cache) for _ in prompts]
    last = [s.prefill(p) for s, p in zip(ss, prompts)]
    out, other = [], None
    for step in range(steps):
        if step == fork_at:
            other = ss[0].fork()
        if other is not None and step % 2:  # the fork takes session 0's seat every other step
            ss[0], other = other, ss[0]
        toks = [int(np.argmax(lg)) for lg in last]
        last = decode_batch(ss, toks) if len(ss) > 1 else [ss[0].decode(toks[0])]
        out.append(np.stack(last))
    return np.stack(out)


@pytest.mark.parametrize("threads", [1, 2])
def test_hybrid_decode_graph_replay_is_exact(qwen35, many_shares, threads):
    """Qwen3.5 decode steps replayed as one graph (the linear layers read each sequence's
    state through the plan's slot tables) give the Python path's bits: 3 sequences of
    different lengths, steps across snapshot boundaries (those run the Python path), and one
    plan serving a session and its fork in turn."""
    from goinfer.gguf import GGUFFile
    from goinfer.model import Model

    _, path = qwen35
    prompts = [ids_(n, 40 + n) for n in (5, 13, 2)]
    ref = _decode_run(Model(GGUFFile(path), threads=1, progress=False, graph=False), prompts, 30)
    m = Model(GGUFFile(path), threads=threads, progress=False)
    assert m.graph is not None
    got = _decode_run(m, prompts, 30)
    assert np.array_equal(got, ref)
    assert 20 <= m.graph.replays < 30  # snapshot steps fell back to the Python path
    ref1 = _decode_run(
        Model(GGUFFile(path), threads=1, progress=False, graph=False), prompts[:1], 24, fork_at=6
    )
    m1 = Model(GGUFFile(path), threads=threads, progress=False)
    assert np.array_equal(_decode_run(m1, prompts[:1], 24, fork_at=6), ref1)
    assert m1.graph.captures == 1 and m1.graph.replays >= 18  # one plan, two sessions' states
