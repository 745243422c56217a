"""Graph replay of decode steps (goinfer/graph.py, goinfer/_kernels/graph.pyx).

The reference is the Python forward path (graph=False), itself checked against transformers
in test_models.py / test_gemma.py: replayed logits must be np.array_equal to it, for every
family the graph covers, batched decode of sequences of different lengths across block
boundaries, 1 and 2 threads (with the work thresholds at 0 so every op really runs on
several shares and the executor's ordering is exercised), every ISA variant, and after the
events that must rebuild a plan.  Counters prove that the graph ran (replays / captures)."""

from __future__ import annotations

import contextlib
import importlib
from functools import partial

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fixtures import compare, tinygemma, tinymodels
from fixtures.kernels import many_shares as all_shares
from goinfer import _kernels, _reference
from goinfer._kernels import _config
from goinfer.batch import decode_batch
from goinfer.gguf import GGUFFile
from goinfer.kv_cache import DEFAULT_KV_DTYPE, KVCache
from goinfer.model import Model
from goinfer.quant import pack_float, quantize_weight

MM = importlib.import_module("goinfer._kernels.matmul")
OPS = importlib.import_module("goinfer._kernels.ops")
ATT = importlib.import_module("goinfer._kernels.attention")
GRAPH = importlib.import_module("goinfer._kernels.graph")
SSM = importlib.import_module("goinfer._kernels.ssm")


@pytest.fixture(scope="module")
def gemma_path(tmp_path_factory):
    hf = tinygemma.hf_model(0)
    return tinygemma.write_gguf(hf, tmp_path_factory.mktemp("gemma") / "tiny-gemma3.gguf")


# the product's KV storage (f16: the graph's own conversions), the graph on unless graph=False
load = partial(compare.load, kv_dtype=DEFAULT_KV_DTYPE, graph=True)


def run_decode(m, prompts, steps, block_size=4, max_tokens=400):
    """Prefill each prompt in its own session, then `steps` batched greedy decode steps.
    Returns the logits of every step, (steps, B, vocab)."""
    cache = KVCache(m, max_tokens=max_tokens, block_size=block_size)
    sessions = [m.session(cache) for _ in prompts]
    last = [s.prefill(p) for s, p in zip(sessions, prompts)]
    out = []
    for _ in range(steps):
        toks = [int(np.argmax(lg)) for lg in last]
        last = decode_batch(sessions, toks) if len(sessions) > 1 else [sessions[0].decode(toks[0])]
        out.append(np.stack(last))
    return np.stack(out)


def prompts_for(B, seed=0, vocab=300):
    rng = np.random.default_rng(seed)
    lens = [3, 9, 6, 14, 1, 11][:B]  # different lengths: rows end in different blocks
    return [rng.integers(0, vocab, n).tolist() for n in lens]


def assert_replayed_same(path, threads, B=3, steps=8, ref_threads=1, **kw):
    """The reference runs on ref_threads: the Python path's bits do not depend on the thread
    count (test_kernels_*, test_threads_agree), and its 1-thread run is fast on a busy CI."""
    ref = run_decode(load(path, ref_threads, graph=False, **kw), prompts_for(B), steps)
    m = load(path, threads, graph=True, **kw)
    got = run_decode(m, prompts_for(B), steps)
    assert m.graph is not None and m.graph.replays == steps and m.graph.captures >= 1
    assert np.array_equal(got, ref)
    return m


# ============================================================================ bit identity


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
def test_llama_family_decode_bit_identical(tiny, arch, threads, many_shares):
    assert_replayed_same(tiny(arch)[1], threads)


def test_against_two_thread_python_path(tiny, many_shares):
    assert_replayed_same(tiny("qwen2")[1], 2, B=2, steps=5, ref_threads=2)


@pytest.mark.parametrize("threads", [1, 2])
def test_gemma3_decode_bit_identical(gemma_path, threads, many_shares):
    # 14 + 10 tokens: past the tiny model's sliding window of 8 on its local layers
    assert_replayed_same(gemma_path, threads, B=4)


@pytest.mark.parametrize("qtype", [QT.Q4_0, QT.Q4_1, QT.Q8_0])
def test_quantized_weights_bit_identical(tiny_dir, qtype, many_shares):
    hf = tinymodels.hf_model("qwen2", 0)
    path = tinymodels.write_gguf(
        hf, "qwen2", tiny_dir / f"graph-qwen2-{qtype.name}.gguf", qtype=qtype
    )
    assert_replayed_same(path, 2)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_fast_attention_decode_above_512(tiny, gemma_path, family, threads, many_shares):
    """Decode steps at positions >= 512 run attention_fast inside the replayed graph (a plan
    per kernel assignment; one sequence crosses 512, one stays below, one above): the Python
    path's bits, and the counters see the fast rows (Gemma: local layers with a window)."""
    path = tiny("llama")[1] if family == "llama" else gemma_path
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, 250, n).tolist() for n in (509, 300, 530)]
    ref = run_decode(
        load(path, 1, graph=False, context_length=1024), prompts, 6, block_size=16, max_tokens=2048
    )
    m = load(path, threads, context_length=1024)
    ATT.reset_attention_counters()
    got = run_decode(m, prompts, 6, block_size=16, max_tokens=2048)
    assert np.array_equal(got, ref)
    assert m.graph.replays == 6 and m.graph.captures == 2  # before / after the first crosses
    L = m.config.n_layers
    c = ATT.attention_counters()
    assert c["fast_queries"] == L * (18 + 3 + 6)  # 530-token prefill's rows 512..529 + decode
    assert c["exact_queries"] == L * (509 + 300 + 512 + 3 + 6)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_verify_steps_replayed(tiny, gemma_path, family, threads, many_shares):
    """Verify steps of speculative decoding (a token and its draft: several rows, logits of
    every row) are replayed once their shape recurs: the Python path's bits, rows crossing
    512 included (the exact and the fast kernel in one sequence), and the counters (Gemma:
    sliding-window layers too)."""
    path = tiny("llama", max_position_embeddings=1024)[1] if family == "llama" else gemma_path

    def steps(m):
        s = m.session(KVCache(m, max_tokens=1024, block_size=16))
        s.prefill([t % 250 for t in range(480)])
        ATT.reset_attention_counters()
        out = [
            s.extend([(7 * i + j) % 250 for j in range(T)])
            for i, T in enumerate([3, 5, 3, 5, 3, 5, 3, 5, 3, 5])
        ]  # positions 480..519
        return out, ATT.attention_counters()

    ref, ref_counts = steps(load(path, 1, graph=False, context_length=1024))
    m = load(path, threads, context_length=1024)
    got, counts = steps(m)
    for a, b in zip(got, ref):
        assert np.array_equal(a, b)
    assert counts == ref_counts
    assert counts["fast_queries"] == m.config.n_layers * 8  # rows 512..519
    assert m.graph.replays >= 4 and m.graph.captures >= 2


@pytest.mark.parametrize("B", [1, 2, 3, 4])
def test_batch_sizes_match_decoding_alone(tiny, B, many_shares):
    """A batched replayed step gives each sequence the bits of its own Python decode."""
    path = tiny("llama")[1]
    m = load(path, 2)
    got = run_decode(m, prompts_for(B, seed=B), 7)
    ref = load(path, 1, graph=False)
    for i, p in enumerate(prompts_for(B, seed=B)):
        alone = run_decode(ref, [p], 7)
        assert np.array_equal(got[:, i], alone[:, 0])
    assert m.graph.captures == 1 and m.graph.replays == 7


def test_threads_agree(tiny, many_shares):
    path = tiny("qwen3")[1]
    one = run_decode(load(path, 1), prompts_for(3), 8)
    two = run_decode(load(path, 2), prompts_for(3), 8)
    assert np.array_equal(one, two)


@pytest.mark.parametrize("arch", ["qwen2", "qwen35"])
def test_every_isa_variant(tiny, arch, many_shares):
    """Replayed decode == the Python path on every variant, every kernel module dispatching to
    it; on Qwen3.5 (fixtures.hfconvert) the Gated DeltaNet steps (ssm kernels) too."""
    if arch == "qwen35":
        from fixtures import hfconvert

        path = hfconvert.build("qwen35")[1]
    else:
        path = tiny(arch)[1]
    old = _config.variant()
    try:
        for v in _config.supported_variants():
            _config.set_variant(v)
            for mod in (MM, OPS, ATT, SSM):
                assert mod._variant_used() == v
            assert_replayed_same(path, 2, B=2, steps=5)
    finally:
        _config.set_variant(old)


def test_real_model_decode_bit_identical(smollm2_path):
    """SmolLM2-135M Q4_1 (the real model: int4 matmuls, 30 layers), 2 threads, 2 sequences."""
    prompts = [list(range(100, 140)), list(range(500, 517))]
    ref = run_decode(
        Model.load(smollm2_path, threads=1, progress=False, graph=False), prompts, 4, block_size=16
    )
    m = Model.load(smollm2_path, threads=2, progress=False, graph=True)
    got = run_decode(m, prompts, 4, block_size=16)
    assert m.graph.replays == 4
    assert np.array_equal(got, ref)


# ============================================================================ plans and invalidation


def test_plan_per_batch_size_and_cache(tiny):
    m = load(tiny("llama")[1], 2)
    run_decode(m, prompts_for(2), 3)
    assert m.graph.captures == 1
    run_decode(m, prompts_for(3), 3)  # new cache, other batch size
    assert m.graph.captures == 2
    cache = KVCache(m, max_tokens=200, block_size=4)
    a, b = m.session(cache), m.session(cache)
    a.prefill([1, 2, 3])
    b.prefill([4, 5])
    decode_batch([a, b], [6, 7])
    decode_batch([a, b], [8, 9])
    a.decode(10)  # B = 1 on the same cache: its own plan
    decode_batch([a, b], [11, 12])  # B = 2 plan reused
    assert m.graph.captures == 4 and m.graph.replays == 3 + 3 + 4


def test_variant_change_rebuilds(tiny):
    variants = _config.supported_variants()
    if len(variants) < 2:
        pytest.skip("one ISA variant on this CPU")
    path = tiny("llama")[1]
    old = _config.variant()
    m, ref_m = load(path, 1), load(path, 1, graph=False)
    s, r = m.session(KVCache(m, max_tokens=100)), ref_m.session(KVCache(ref_m, max_tokens=100))
    s.prefill([1, 2, 3])
    r.prefill([1, 2, 3])
    try:
        for v in variants:
            _config.set_variant(v)
            assert np.array_equal(s.decode(5), r.decode(5))
    finally:
        _config.set_variant(old)
    assert m.graph.captures == len(variants)


def test_avxvnni_change_rebuilds(tiny):
    """Turning the avx2 variant's AVX-VNNI matmuls on or off rebinds the plan to the other
    table (its function pointers); the bits stay the Python path's either way."""
    if not _config.avxvnni_supported():
        pytest.skip("no AVX-VNNI on this CPU")
    path = tiny("llama")[1]
    old, old_vnni = _config.variant(), _config.avxvnni_in_use()
    _config.set_variant("avx2")
    try:
        m, ref_m = load(path, 1), load(path, 1, graph=False)
        s = m.session(KVCache(m, max_tokens=100))
        r = ref_m.session(KVCache(ref_m, max_tokens=100))
        s.prefill([1, 2, 3])
        r.prefill([1, 2, 3])
        for on in (True, False, True):
            _config.set_avxvnni(on)
            assert MM._avxvnni_used() == on
            assert np.array_equal(s.decode(5), r.decode(5))
            plans = [p for plans in m.graph._plans.values() for p in plans.values()]
            assert {p.dispatch for p in plans} == {("avx2", False, on)}
        assert m.graph.captures == 3
    finally:
        _config.set_variant(old)
        _config.set_avxvnni(old_vnni)


def test_rope_per_step_and_attention_threads_rebuild(tiny):
    """A plan computes each step's RoPE into its own (T, n_rot/2) buffers: decoding on across
    position 1024 needs no table of every position.  With 2 threads the attention crosses the
    size where its kernel starts using both threads (H * hd * (pos + 1) >= grain), which
    rebuilds the plan.  Bits stay the Python path's."""
    path = tiny("llama", max_position_embeddings=2048)[1]
    prompt = (list(range(300)) * 4)[:1018]
    ref = run_decode(load(path, 1, graph=False), [prompt], 10, block_size=16, max_tokens=1100)
    m = load(path, 2)
    got = run_decode(m, [prompt], 10, block_size=16, max_tokens=1100)
    assert np.array_equal(got, ref)
    assert m.graph.captures >= 2  # the plan was rebuilt
    for plan in (p for plans in m.graph._plans.values() for p in plans.values()):
        ((cos, sin, rows),) = plan.rope.values()  # one RoPE (llama), the step's rows only
        assert cos.shape == sin.shape == (plan.T, m.config.n_rot // 2)
        assert np.array_equal(rows, np.arange(plan.T))


def test_barriers_skipped_only_between_segments(tiny):
    m = load(tiny("llama")[1], 2)
    cache = KVCache(m, max_tokens=100, block_size=4)
    sessions = [m.session(cache) for _ in range(3)]
    for s, p in zip(sessions, prompts_for(3)):
        s.prefill(p)
    decode_batch(sessions, [1, 2, 3])
    (plan,) = m.graph._plans[cache].values()
    ops = plan._graph.op_list
    free = [i for i, op in enumerate(ops) if i > 0 and not op.barrier]
    n_layers = m.config.n_layers
    assert len(free) == 2 * n_layers  # segments 2 and 3 of each layer's attention
    assert all(ops[i].name == "attention" and ops[i - 1].name == "attention" for i in free)


# ============================================================================ when the graph is off


def test_disabled_by_argument_and_env(tiny, monkeypatch):
    path = tiny("llama")[1]
    assert load(path, graph=False).graph is None
    monkeypatch.setenv("GOINFER_GRAPH", "0")
    assert Model(GGUFFile(path), progress=False).graph is None
    monkeypatch.setenv("GOINFER_GRAPH", "1")
    assert Model(GGUFFile(path), progress=False).graph is not None


def test_unsupported_models_use_python_path(tiny):
    assert Model(GGUFFile(tiny("llama")[1]), progress=False, _reference_kernels=True).graph is None


# ============================================================================ MoE


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "arch,qtype",
    [("mixtral", None), ("qwen2moe", QT.Q4_0), ("olmoe", QT.Q8_0), ("qwen3moe", QT.Q4_0)],
)
def test_moe_decode_bit_identical(tiny_dir, arch, qtype, threads, many_shares):
    """MoE decode steps replayed: routing, grouping, every expert in one matmul_experts per
    projection, fold (and qwen2moe's shared expert) give the Python path's bits, while the
    chosen experts change from step to step and sequence to sequence (one plan serves them)."""
    from fixtures import tinymoe

    _, path = tinymoe.build_moe(arch, tiny_dir, qtype=qtype)
    m = assert_replayed_same(path, threads, B=3, steps=8)
    assert m.graph.captures == 1  # (a capture that met an unbindable call replays nothing)
    # the routing differed between steps: the test covers a plan reading new offsets
    ref = load(path, 1, graph=False)
    routes = []
    orig = ref.impl.ops.moe_route

    class Spy:
        def __getattr__(self, name):
            return getattr(ref.kernels, name)

        def moe_route(self, *a, **kw):
            ids, w = orig(*a, **kw)
            routes.append(ids.copy())
            return ids, w

    ref.impl.ops = Spy()
    run_decode(ref, prompts_for(3), 8)
    assert len({r.tobytes() for r in routes if r.shape[0] == 3}) > 1


def test_profiling_proxy_runs_python_path(tiny):
    from goinfer.profile import _TimedKernels

    path = tiny("llama")[1]
    m, ref = load(path), load(path, graph=False)
    proxy = _TimedKernels(m.kernels)
    m.impl.ops = proxy
    a = run_decode(m, prompts_for(2), 3)
    m.impl.ops = m.kernels
    assert m.graph.replays == 0 and proxy.calls["attention"] > 0
    assert np.array_equal(a, run_decode(ref, prompts_for(2), 3))


def test_attention_counters_count_replayed_calls(tiny):
    path = tiny("llama")[1]
    deltas = []
    for graph in (False, True):
        m = load(path, graph=graph)
        cache = KVCache(m, max_tokens=100)
        s = m.session(cache)
        s.prefill([1, 2, 3])
        _kernels.reset_attention_counters()
        for t in range(4):
            s.decode(t)
        deltas.append(_kernels.attention_counters())
    assert deltas[0] == deltas[1] and deltas[1]["exact_calls"] == 4 * m.config.n_layers


def test_bad_token_keeps_state(tiny):
    m = load(tiny("llama")[1])
    s = m.session(KVCache(m, max_tokens=100))
    s.prefill([1, 2, 3])
    s.decode(4)
    with pytest.raises(ValueError):
        s.decode(10**6)
    assert s.tokens == [1, 2, 3, 4]
    ref = load(tiny("llama")[1], graph=False)
    r = ref.session(KVCache(ref, max_tokens=100))
    r.prefill([1, 2, 3])
    r.decode(4)
    assert np.array_equal(s.decode(5), r.decode(5))


# ============================================================================ the small kernels


def test_add_bias_copy2d_scale_match_numpy_and_reference():
    rng = np.random.default_rng(0)
    buf = rng.standard_normal((5, 48)).astype(np.float32)
    x = buf[:, 8:40]  # (5, 32) rows strided
    b = rng.standard_normal(32).astype(np.float32)
    for K in (_kernels, _reference):
        got = K.add_bias(x, b, out=np.empty((5, 32), np.float32), nthreads=2)
        assert np.array_equal(got, x + b)
        out = np.empty((5, 2, 16), np.float32)
        K.copy2d(x, out=out.reshape(5, 32), nthreads=2)
        assert np.array_equal(out.reshape(5, 32), x)
        s = np.float32(7.3)
        assert np.array_equal(K.scale(x, s, out=np.empty((5, 32), np.float32), nthreads=2), x * s)
        for dt in (np.int64, np.int32):  # the logit rows of a batch; an MoE layer's routed rows
            rows = np.array([4, 0, 2], dt)
            assert np.array_equal(
                K.gather_rows(x, rows, out=np.empty((3, 32), np.float32)), x[rows]
            )
    y = buf.copy()
    _kernels.scale(y, 3.0, out=y)  # in place
    assert np.array_equal(y, buf * np.float32(3.0))


def test_softcap_matches_reference_threads_and_layouts(many_shares):
    """softcap (Gemma's final logit softcap, tanhf(x / cap) * cap): within 4 ulp + 2^-24 |x| of
    the float64 reference over values far inside and far past the cap; the same bits on 1 and 2
    threads, over strided rows, in place, bound in a graph; bad caps refused."""
    rng = np.random.default_rng(3)
    buf = (rng.standard_normal((37, 160)) * np.logspace(-3, 3, 160)).astype(np.float32)
    x = buf[:, 8:152]  # (37, 144) rows strided
    for cap in (30.0, 3.0, 0.5):
        ref = _reference.softcap(x, cap)
        got = _kernels.softcap(x, cap, out=np.empty(x.shape, np.float32), nthreads=1)
        err = np.abs(got.astype(np.float64) - ref)
        assert np.all(err <= 4 * np.spacing(np.abs(ref)) + 2.0**-24 * np.abs(x)), float(err.max())
        assert np.all(np.abs(got) <= np.float32(cap))
        assert np.array_equal(
            _kernels.softcap(x, cap, out=np.empty(x.shape, np.float32), nthreads=2), got
        )
        y = np.ascontiguousarray(x)
        _kernels.softcap(y, cap, out=y, nthreads=2)  # in place
        assert np.array_equal(y, got)
        out = np.empty(x.shape, np.float32)
        GRAPH.Graph([OPS.bind_softcap(x, cap, out, nthreads=2)], 2).run()
        assert np.array_equal(out, got)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        for K in (_kernels, _reference):
            with pytest.raises(ValueError, match="cap"):
                K.softcap(x, bad)


def test_small_kernels_reject_bad_input():
    x = np.zeros((4, 8), np.float32)
    with pytest.raises(ValueError):
        _kernels.add_bias(x, np.zeros(7, np.float32))
    with pytest.raises(TypeError):
        _kernels.add_bias(x, np.zeros(8, np.float64))
    with pytest.raises(ValueError):
        _kernels.copy2d(x, out=x)  # overlap
    with pytest.raises(ValueError):
        _kernels.copy2d(x, out=np.zeros((4, 9), np.float32))
    with pytest.raises(ValueError):
        _kernels.scale(x[:, :4], 2.0, out=x[:, 2:6])  # partial overlap
    with pytest.raises(IndexError):
        _kernels.gather_rows(x, np.array([4], np.int64))
    with pytest.raises(IndexError):
        _kernels.gather_rows(x, np.array([-1], np.int32))
    with pytest.raises(TypeError):
        _kernels.gather_rows(x, np.array([1], np.int16))


def test_bound_ops_equal_the_kernels(many_shares):
    """Each bind_* op, run through a Graph on 2 threads, gives the kernel's bits."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    w = rng.standard_normal(64).astype(np.float32)
    y = rng.standard_normal((3, 64)).astype(np.float32)
    outs = [np.empty((3, 64), np.float32) for _ in range(4)]
    ops = [
        OPS.bind_rmsnorm(x, w, 1e-5, outs[0], nthreads=2),
        OPS.bind_swiglu(x, y, outs[1], nthreads=2),
        OPS.bind_add(outs[0], outs[1], outs[2], nthreads=2),
        OPS.bind_add_bias(outs[2], w, outs[3], nthreads=2),
    ]
    assert all(op.nshares == 2 for op in ops)
    GRAPH.Graph(ops, 2).run()
    r0 = _kernels.rmsnorm(x, w, 1e-5)
    r1 = _kernels.swiglu(x, y)
    assert np.array_equal(outs[0], r0) and np.array_equal(outs[1], r1)
    assert np.array_equal(outs[3], (r0 + r1) + w)
    emb = pack_float("f32", rng.standard_normal((10, 32)).astype(np.float32))
    ids = np.array([3, 7, 0], np.int64)
    out = np.empty((3, 32), np.float32)
    GRAPH.Graph([MM.bind_get_rows(emb, ids, out, nthreads=2)], 2).run()
    assert np.array_equal(out, _kernels.get_rows(emb, ids))
    with pytest.raises(TypeError):  # bound ids are used in place: int64 only
        MM.bind_get_rows(emb, ids.astype(np.int32), out)
    with pytest.raises(IndexError):
        MM.bind_get_rows(emb, np.array([10], np.int64), out[:1])


def test_bind_without_out_is_refused():
    """A bound op points into its out buffer, so it must be given (a kernel called with
    out=None allocates one; a bound op would point into an array freed at once)."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    w = rng.standard_normal(64).astype(np.float32)
    pos = np.arange(3, dtype=np.int32)
    cos = sin = np.ones((8, 8), np.float32)
    for name, bind in [
        ("rmsnorm", lambda: OPS.bind_rmsnorm(x, w, 1e-5, None)),
        ("swiglu", lambda: OPS.bind_swiglu(x, x, None)),
        ("gelu_tanh_mul", lambda: OPS.bind_gelu_tanh_mul(x, x, None)),
        ("add", lambda: OPS.bind_add(x, x, None)),
        ("add_bias", lambda: OPS.bind_add_bias(x, w, None)),
        ("copy2d", lambda: OPS.bind_copy2d(x, None)),
        ("scale", lambda: OPS.bind_scale(x, 2.0, None)),
        ("softcap", lambda: OPS.bind_softcap(x, 2.0, None)),
        ("gather_rows", lambda: OPS.bind_gather_rows(x, np.zeros(1, np.int32), None)),
        ("rope", lambda: OPS.bind_rope(x, pos, cos, sin, False, None)),
    ]:
        with pytest.raises(ValueError, match=f"bound {name} needs out"):
            bind()


# ============================================================================ warming


@contextlib.contextmanager
def warming(kb):
    """set_gemv_warm(kb) inside (the default back after it)."""
    old = _config.gemv_warm()
    assert _config.set_gemv_warm(kb) is None
    try:
        yield
    finally:
        assert _config.set_gemv_warm(None) == kb
    assert _config.gemv_warm() == old


def _bound_matmul(kind, n_rb, M, threads, rng):
    """A bound matmul of a (16 n_rb - 3 or 16, 256) weight of kind and M activation rows."""
    n_out = 16 * n_rb - (3 if n_rb > 1 else 0)
    w = rng.standard_normal((n_out, 256)).astype(np.float32)
    x = rng.standard_normal((M, 256)).astype(np.float32)
    qw = quantize_weight(w, kind)
    a = x if kind in ("f32", "f16") else _kernels.quantize_act(x)
    out = np.empty((M, n_out), np.float32)
    return MM.bind_matmul(a, qw, out, nthreads=threads), qw, a, out


@settings(max_examples=80, deadline=None)
@given(
    kind=st.sampled_from(["q4_0", "q4_1", "q8_0", "q6_k", "q4_k", "q5_k", "f16"]),
    n_rb=st.integers(1, 80),
    kb=st.sampled_from([0, 4, 12, 64, 512, 16384]),
    M=st.sampled_from([1, 3]),
    threads=st.integers(1, 4),
)
@example(kind="q4_k", n_rb=64, kb=512, M=1, threads=2)  # the GEMV's tail shares left out
@example(kind="q4_k", n_rb=64, kb=16384, M=1, threads=1)  # one share: the whole weight
@example(kind="q6_k", n_rb=1, kb=4, M=1, threads=4)  # fewer row blocks than threads
@example(kind="q4_1", n_rb=80, kb=16384, M=3, threads=3)  # a GEMM's shares: every byte
def test_warm_ranges_are_share_heads(kind, n_rb, kb, M, threads):
    """A bound matmul's warm prefetches the head of each row share: its chunks' byte ranges
    of qs, merged, are runs that start at row-block boundaries, the first at 0, at most one per
    share, kb in all at most, all within the array; each scale
    array's range of a chunk spans the same row blocks as its qs range.  With a limit past
    the weight's size the runs cover qs from 0 without a gap: to its end when every share is
    a head (no GEMV tail shares, which are claimed last); kb 0 warms nothing."""
    with all_shares():
        op, qw, _, _ = _bound_matmul(kind, n_rb, M, threads, np.random.default_rng(n_rb))
    arrays = [a for a in (qw.qs, qw.d, qw.m) if a is not None and a.nbytes]
    sz = [a.nbytes // qw.n_rb for a in arrays]
    with warming(kb):
        got = MM._warm_ranges(op)
    if kb == 0:
        assert got == []
        return
    by_chunk = {}
    for c, i, lo, hi in got:
        by_chunk.setdefault(c, {})[i] = (lo, hi)
    assert sorted(by_chunk) == list(range(len(by_chunk)))  # chunks 0, 1, .. in order
    assert all(len(r) == len(arrays) for r in by_chunk.values())
    # a chunk of a share shorter than the others warms nothing (every range empty)
    full = [r for r in by_chunk.values() if r[0][0] < r[0][1]]
    assert all(lo == hi for r in by_chunk.values() if r not in full for lo, hi in r.values())
    assert full
    qs = sorted(r[0] for r in full)
    for r in full:
        for i, (lo, hi) in r.items():
            assert 0 <= lo < hi <= arrays[i].nbytes
    for rng_ in full:
        (lo0, hi0) = rng_[0]
        for i, (lo, hi) in rng_.items():
            assert lo // sz[i] == lo0 // sz[0] and -(-hi // sz[i]) == -(-hi0 // sz[0])
    runs = []
    for lo, hi in qs:  # merge touching ranges
        assert not runs or lo >= runs[-1][1], "chunks overlap"
        if runs and lo == runs[-1][1]:
            runs[-1][1] = hi
        else:
            runs.append([lo, hi])
    assert runs[0][0] == 0 and all(lo % sz[0] == 0 for lo, _ in runs)
    assert len(runs) <= op.nshares
    assert sum(hi - lo for lo, hi in runs) <= kb * 1024
    if kb * 1024 // op.nshares >= qw.qs.nbytes:
        assert all(a[1] == b[0] for a, b in zip(runs, runs[1:])), "a gap between shares"
        tail = M == 1 and threads > 1 and n_rb >= 16 * threads
        assert (runs[-1][1] == qw.qs.nbytes) != tail


@pytest.mark.parametrize("kb", [0, 4, 512])
def test_warm_keeps_bits(tiny, kb, many_shares):
    """Decode with the graph warming 0, 4 or 512 KB per matmul: the Python path's bits."""
    with warming(kb):
        assert_replayed_same(tiny("llama")[1], 2)


def test_warm_runs_while_threads_wait(tiny, many_shares):
    """On 2 threads the replayed steps' waiting threads claim warm chunks (every barrier after
    a one-share op makes the other thread wait); on 1 thread nothing waits or warms."""
    for threads in (1, 2):
        m = load(tiny("llama")[1], threads)
        cache = KVCache(m, max_tokens=200, block_size=4)
        s = m.session(cache)
        lg = s.prefill(prompts_for(1)[0])
        chunks = []
        for _ in range(12):
            lg = s.decode(int(np.argmax(lg)))
            (plan,) = [p for d in m.graph._plans.values() for p in d.values()]
            chunks.append(plan._graph.warm_chunks)
        if threads == 1:
            assert chunks == [0] * 12
        else:
            assert max(chunks) > 0, chunks


# ============================================================================ profiling


def test_profile_times_every_op(many_shares):
    """Graph.profile: per op the time its shares ran and threads waited, summed over the runs
    since start_profile; the outputs are the same bits timed or not; stop_profile ends it."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    w = rng.standard_normal(64).astype(np.float32)
    outs = [np.empty((4, 64), np.float32) for _ in range(3)]
    ops = [
        OPS.bind_rmsnorm(x, w, 1e-5, outs[0], nthreads=2),
        OPS.bind_add(outs[0], x, outs[1], nthreads=2),
        OPS.bind_add(outs[1], x, outs[2], nthreads=2),
    ]
    for threads in (1, 2):
        g = GRAPH.Graph(ops, threads)
        assert g.threads == threads and g.profile() is None
        g.run()
        ref = [o.copy() for o in outs]
        g.start_profile()
        for _ in range(3):
            g.run()
        p = g.profile()
        assert p["runs"] == 3 and all(np.array_equal(o, r) for o, r in zip(outs, ref))
        assert p["run_ns"].shape == p["wait_ns"].shape == (3,)
        assert (p["run_ns"] > 0).all() and (p["wait_ns"] >= 0).all()
        if threads == 1:  # the calling thread runs every share in order: nobody waits
            assert (p["wait_ns"] == 0).all()
        g.start_profile()  # from zero again
        assert g.profile()["runs"] == 0 and not g.profile()["run_ns"].any()
        g.stop_profile()
        assert g.profile() is None


def test_plan_op_table_names_the_matmul_weights(tiny):
    """DecodePlan.op_table: an entry per bound op; a matmul's weight kind, shape and bytes."""
    m = load(tiny("llama")[1], 2)
    cache = KVCache(m, max_tokens=100, block_size=4)
    s = m.session(cache)
    s.decode(int(np.argmax(s.prefill(prompts_for(1)[0]))))
    (plan,) = m.graph.plans(cache)
    table = plan.op_table()
    assert len(table) == plan.n_ops
    mms = [(op, t) for op, t in zip(plan.graph.op_list, table) if op.name == "matmul"]
    assert mms and all(t["name"] == "matmul" for _, t in mms)
    for op, t in mms:
        w = op.refs[1]
        assert t["weight"] == f"{w.kind} {w.n_out}x{w.n_in}" and t["weight_bytes"] == w.nbytes
    assert all(
        t["weight"] is None and t["weight_bytes"] == 0 for t in table if t["name"] != "matmul"
    )
