"""The argument checks every kernel entry point shares (goinfer/_kernels/checks.pxd).

Every function of goinfer._kernels that takes `nthreads` (the kernels, their bind_* forms,
attention_scratch and graph.Graph) accepts a Python or NumPy integer in [1, 1024] and refuses
anything else with one ValueError; an array argument of the wrong dtype or a read-only output
is refused with a message that starts with the argument's name.  Also: goinfer._kernels
exports every public kernel.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

import goinfer._kernels as K
from goinfer import _reference as R
from goinfer._kernels.graph import Graph, Op
from goinfer.kv_cache import kv_shapes
from goinfer.quant import QAct, quantize_weight

MODULES = {name: importlib.import_module(f"goinfer._kernels.{name}") for name in K.KERNELS}
MM, OPS, MOE, SSM, ATT = (MODULES[m] for m in ("matmul", "ops", "moe", "ssm", "attention"))


@dataclass
class Call:
    """One valid call: fn(**params); `writes`: the array params it writes (outputs, state)."""

    fn: Callable[..., Any]
    params: dict[str, Any]
    writes: tuple[str, ...] = field(default=())

    def __call__(self, **extra: Any) -> Any:
        return self.fn(**self.params, **extra)


# ============================================================================ one valid call per entry point
# Each builder makes fresh inputs from a seeded generator, so two builds are equal.


def _matmul_inputs(rng: np.random.Generator) -> tuple[QAct, Any]:
    w = quantize_weight(rng.standard_normal((20, 64)).astype(np.float32), "q4_0")
    return MM.quantize_act(rng.standard_normal((3, 64)).astype(np.float32)), w


def _rows(rng: np.random.Generator, shape: tuple[int, ...] = (3, 16)) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _rope(rng: np.random.Generator) -> dict[str, Any]:
    cos, sin = R.rope_tables(8, 10000.0, 4)
    return dict(
        x=_rows(rng, (2, 2, 8)), pos=np.array([0, 3], np.int32), cos=cos, sin=sin, neox=False
    )


def _route(rng: np.random.Generator) -> dict[str, Any]:
    return dict(logits=_rows(rng, (3, 4)), k=2)


def _group() -> dict[str, Any]:
    return dict(ids=np.array([[0, 1], [3, 1], [2, 0]], np.int32), n_expert=4)


def _fold(rng: np.random.Generator) -> dict[str, Any]:
    return dict(
        y=_rows(rng, (6, 8)), weights=_rows(rng, (3, 2)), pos=np.array([5, 0, 3, 1, 2, 4], np.int32)
    )


def _conv(rng: np.random.Generator) -> dict[str, Any]:
    return dict(x=_rows(rng, (4, 8)), wT=_rows(rng, (3, 8)), state=_rows(rng, (2, 8)))


def _delta(rng: np.random.Generator) -> dict[str, Any]:  # T 4, Hk 1, Hv 2, dk = dv = 8
    return dict(
        qkv=_rows(rng, (4, 32)),
        ab=_rows(rng, (4, 4)),
        A=-rng.uniform(0.1, 2.0, 2).astype(np.float32),
        dt_bias=_rows(rng, (2,)),
        state=_rows(rng, (2, 8, 8)),
        n_k_heads=1,
    )


def _caches() -> dict[str, Any]:
    kshape, vshape, dt = kv_shapes("f32", 2, 1, 8, 4)
    return dict(k_cache=np.zeros(kshape, dt), v_cache=np.zeros(vshape, dt))


def _kv(rng: np.random.Generator) -> dict[str, Any]:
    return dict(
        **_caches(),
        k=_rows(rng, (2, 1, 8)),
        v=_rows(rng, (2, 1, 8)),
        slots=np.array([0, 5], np.int64),
    )


def _att(rng: np.random.Generator) -> dict[str, Any]:
    return dict(
        q=_rows(rng, (2, 2, 8)),
        **_caches(),
        block_table=np.array([0, 1], np.int32),
        q_pos=np.array([2, 5], np.int32),
        scale=0.35,
    )


def _mm(rng: np.random.Generator) -> dict[str, Any]:
    q, w = _matmul_inputs(rng)
    return dict(x_or_qact=q, w=w)


def _experts(rng: np.random.Generator) -> dict[str, Any]:
    q, w = _matmul_inputs(rng)
    return dict(x_or_qact=q, ws=[w, w], offsets=np.array([0, 1, 3], np.int64))


def _bin(
    rng: np.random.Generator, a: str = "gate", b: str = "up", shape: tuple[int, ...] = (3, 16)
) -> dict[str, Any]:
    return {a: _rows(rng, shape), b: _rows(rng, shape)}


def _out(shape: tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
    return np.zeros(shape, dtype)


BUILDERS: dict[str, Callable[[np.random.Generator], Call]] = {
    # matmul.pyx
    "quantize_act": lambda g: Call(MM.quantize_act, dict(x=_rows(g, (3, 64)))),
    "bind_quantize_act": lambda g: Call(
        MM.bind_quantize_act, dict(x=_rows(g, (3, 64)), out=QAct.empty(3, 64))
    ),
    "quantize_gated": lambda g: Call(MM.quantize_gated, _bin(g, shape=(3, 64))),
    "bind_quantize_gated": lambda g: Call(
        MM.bind_quantize_gated, dict(**_bin(g, shape=(3, 64)), act="swiglu", out=QAct.empty(3, 64))
    ),
    "matmul": lambda g: Call(MM.matmul, dict(**_mm(g), out=_out((3, 20))), ("out",)),
    "bind_matmul": lambda g: Call(MM.bind_matmul, dict(**_mm(g), out=_out((3, 20))), ("out",)),
    "matmul_experts": lambda g: Call(
        MM.matmul_experts, dict(**_experts(g), out=_out((3, 20))), ("out",)
    ),
    "bind_matmul_experts": lambda g: Call(
        MM.bind_matmul_experts, dict(**_experts(g), bias=None, out=_out((3, 20))), ("out",)
    ),
    "get_rows": lambda g: Call(
        MM.get_rows,
        dict(w=_mm(g)["w"], ids=np.array([0, 5], np.int64), out=_out((2, 64))),
        ("out",),
    ),
    "bind_get_rows": lambda g: Call(
        MM.bind_get_rows,
        dict(w=_mm(g)["w"], ids=np.array([0, 5], np.int64), out=_out((2, 64))),
        ("out",),
    ),
    # ops.pyx
    "rmsnorm": lambda g: Call(
        OPS.rmsnorm, dict(x=_rows(g), w=_rows(g, (16,)), eps=1e-5, out=_out((3, 16))), ("out",)
    ),
    "bind_rmsnorm": lambda g: Call(
        OPS.bind_rmsnorm, dict(x=_rows(g), w=_rows(g, (16,)), eps=1e-5, out=_out((3, 16))), ("out",)
    ),
    "swiglu": lambda g: Call(OPS.swiglu, dict(**_bin(g), out=_out((3, 16))), ("out",)),
    "bind_swiglu": lambda g: Call(OPS.bind_swiglu, dict(**_bin(g), out=_out((3, 16))), ("out",)),
    "swiglu_oai": lambda g: Call(
        OPS.swiglu_oai, dict(**_bin(g), alpha=1.702, limit=7.0, out=_out((3, 16))), ("out",)
    ),
    "bind_swiglu_oai": lambda g: Call(
        OPS.bind_swiglu_oai, dict(**_bin(g), alpha=1.702, limit=7.0, out=_out((3, 16))), ("out",)
    ),
    "gelu_tanh_mul": lambda g: Call(
        OPS.gelu_tanh_mul, dict(**_bin(g), out=_out((3, 16))), ("out",)
    ),
    "bind_gelu_tanh_mul": lambda g: Call(
        OPS.bind_gelu_tanh_mul, dict(**_bin(g), out=_out((3, 16))), ("out",)
    ),
    "add": lambda g: Call(OPS.add, dict(**_bin(g, "x", "y"), out=_out((3, 16))), ("out",)),
    "bind_add": lambda g: Call(
        OPS.bind_add, dict(**_bin(g, "x", "y"), out=_out((3, 16))), ("out",)
    ),
    "add_bias": lambda g: Call(
        OPS.add_bias, dict(x=_rows(g), b=_rows(g, (16,)), out=_out((3, 16))), ("out",)
    ),
    "bind_add_bias": lambda g: Call(
        OPS.bind_add_bias, dict(x=_rows(g), b=_rows(g, (16,)), out=_out((3, 16))), ("out",)
    ),
    "copy2d": lambda g: Call(OPS.copy2d, dict(x=_rows(g), out=_out((3, 16))), ("out",)),
    "bind_copy2d": lambda g: Call(OPS.bind_copy2d, dict(x=_rows(g), out=_out((3, 16))), ("out",)),
    "scale": lambda g: Call(OPS.scale, dict(x=_rows(g), s=0.5, out=_out((3, 16))), ("out",)),
    "bind_scale": lambda g: Call(
        OPS.bind_scale, dict(x=_rows(g), s=0.5, out=_out((3, 16))), ("out",)
    ),
    "softcap": lambda g: Call(OPS.softcap, dict(x=_rows(g), cap=30.0, out=_out((3, 16))), ("out",)),
    "bind_softcap": lambda g: Call(
        OPS.bind_softcap, dict(x=_rows(g), cap=30.0, out=_out((3, 16))), ("out",)
    ),
    "gather_rows": lambda g: Call(
        OPS.gather_rows, dict(x=_rows(g), rows=np.array([2, 0]), out=_out((2, 16))), ("out",)
    ),
    "bind_gather_rows": lambda g: Call(
        OPS.bind_gather_rows, dict(x=_rows(g), rows=np.array([2, 0]), out=_out((2, 16))), ("out",)
    ),
    "rope": lambda g: Call(OPS.rope, dict(**_rope(g), out=_out((2, 2, 8))), ("out",)),
    "bind_rope": lambda g: Call(OPS.bind_rope, dict(**_rope(g), out=_out((2, 2, 8))), ("out",)),
    # moe.pyx
    "moe_route": lambda g: Call(
        MOE.moe_route,
        dict(**_route(g), ids=_out((3, 2), np.int32), weights=_out((3, 2))),
        ("ids", "weights"),
    ),
    "bind_moe_route": lambda g: Call(
        MOE.bind_moe_route,
        dict(**_route(g), ids=_out((3, 2), np.int32), weights=_out((3, 2))),
        ("ids", "weights"),
    ),
    "moe_group": lambda g: Call(
        MOE.moe_group,
        dict(
            **_group(),
            rows=_out((6,), np.int32),
            offsets=_out((5,), np.int64),
            pos=_out((6,), np.int32),
        ),
        ("rows", "offsets", "pos"),
    ),
    "bind_moe_group": lambda g: Call(
        MOE.bind_moe_group,
        dict(
            **_group(),
            rows=_out((6,), np.int32),
            offsets=_out((5,), np.int64),
            pos=_out((6,), np.int32),
        ),
        ("rows", "offsets", "pos"),
    ),
    "moe_fold": lambda g: Call(MOE.moe_fold, dict(**_fold(g), out=_out((3, 8))), ("out",)),
    "bind_moe_fold": lambda g: Call(
        MOE.bind_moe_fold, dict(**_fold(g), out=_out((3, 8))), ("out",)
    ),
    # ssm.pyx
    "ssm_conv": lambda g: Call(SSM.ssm_conv, dict(**_conv(g), out=_out((4, 8))), ("state", "out")),
    "bind_ssm_conv": lambda g: Call(
        SSM.bind_ssm_conv, dict(**_conv(g), out=_out((4, 8))), ("state", "out")
    ),
    "gated_delta": lambda g: Call(
        SSM.gated_delta, dict(**_delta(g), out=_out((4, 16))), ("state", "out")
    ),
    "bind_gated_delta": lambda g: Call(
        SSM.bind_gated_delta, dict(**_delta(g), out=_out((4, 16))), ("state", "out")
    ),
    "sigmoid_mul": lambda g: Call(
        SSM.sigmoid_mul, dict(**_bin(g, "gate", "x"), out=_out((3, 16))), ("out",)
    ),
    "bind_sigmoid_mul": lambda g: Call(
        SSM.bind_sigmoid_mul, dict(**_bin(g, "gate", "x"), out=_out((3, 16))), ("out",)
    ),
    # attention.pyx
    "kv_write": lambda g: Call(ATT.kv_write, _kv(g), ("k_cache", "v_cache")),
    "bind_kv_write": lambda g: Call(ATT.bind_kv_write, _kv(g), ("k_cache", "v_cache")),
    "attention": lambda g: Call(ATT.attention, dict(**_att(g), out=_out((2, 2, 8))), ("out",)),
    "attention_fast": lambda g: Call(
        ATT.attention_fast, dict(**_att(g), out=_out((2, 2, 8))), ("out",)
    ),
    "attention_scratch": lambda g: Call(ATT.attention_scratch, dict(**_att(g), max_pos=7)),
    "bind_attention": lambda g: Call(
        ATT.bind_attention,
        dict(**_att(g), out=_out((2, 2, 8)), max_pos=7, scratch=_out((8, 1 << 12), np.float64)),
        ("out", "scratch"),
    ),
    "bind_attention_fast": lambda g: Call(
        ATT.bind_attention_fast,
        dict(**_att(g), out=_out((2, 2, 8)), max_pos=7, scratch=_out((8, 1 << 12), np.float64)),
        ("out", "scratch"),
    ),
}

ENTRIES = sorted(BUILDERS)
BAD_THREADS = [
    0,
    -1,
    1025,
    2**40,
    True,
    False,
    2.0,
    np.float32(2),
    "2",
    None,
    np.bool_(True),
    np.array([2]),
]


def build(name: str, seed: int = 0) -> Call:
    return BUILDERS[name](np.random.default_rng(seed))


def _arrays(x: Any) -> list[np.ndarray]:
    """The arrays of a kernel's result (or of its parameters), in a fixed order."""
    if isinstance(x, np.ndarray):
        return [x]
    if isinstance(x, QAct):
        return [x.qa, x.da, x.asum, x.sa]
    if isinstance(x, (list, tuple)):
        return [a for item in x for a in _arrays(item)]
    if isinstance(x, dict):
        return [a for key in sorted(x) for a in _arrays(x[key])]
    return []


def _takes_nthreads(fn: Any) -> bool:
    try:
        return "nthreads" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


# ============================================================================ thread counts


def test_every_entry_point_with_nthreads_is_covered():
    """The table above is every public function of the kernel modules that takes nthreads."""
    found = {
        name
        for mod in MODULES.values()
        for name, fn in vars(mod).items()
        if not name.startswith("_") and callable(fn) and _takes_nthreads(fn)
    }
    assert "matmul" in found and "bind_attention" in found  # the introspection sees them
    assert found == set(BUILDERS)


@pytest.mark.parametrize("name", ENTRIES)
@pytest.mark.parametrize("nthreads", [np.int64(2), np.int32(2), np.uint16(2), 2])
def test_numpy_integer_thread_counts_are_accepted(name, nthreads):
    """nthreads=np.int64(2) (or any NumPy integer) gives what nthreads=2 gives."""
    want = build(name)
    res_want = want(nthreads=2)
    got = build(name)
    res_got = got(nthreads=nthreads)
    if isinstance(res_want, Op) or (isinstance(res_want, list) and isinstance(res_want[0], Op)):
        ops_want = res_want if isinstance(res_want, list) else [res_want]
        ops_got = res_got if isinstance(res_got, list) else [res_got]
        assert [o.nshares for o in ops_got] == [o.nshares for o in ops_want]
        Graph(ops_want, 2).run()
        Graph(ops_got, nthreads).run()
    if isinstance(res_want, (int, dict)):  # attention_scratch: doubles per thread
        assert res_got == res_want
    keep = [p for p in want.params if p != "scratch"]  # (a scratch's rows: whichever thread)
    a = _arrays(res_want) + _arrays([want.params[p] for p in keep])
    b = _arrays(res_got) + _arrays([got.params[p] for p in keep])
    assert len(a) == len(b) and len(a) > 0
    for x, y in zip(a, b):
        assert np.array_equal(x, y, equal_nan=True)


@pytest.mark.parametrize("name", ENTRIES)
def test_bad_thread_counts_are_refused_alike(name):
    for bad in BAD_THREADS:
        with pytest.raises(ValueError) as err:
            build(name)(nthreads=bad)
        assert str(err.value) == f"nthreads must be an int in [1, 1024], got {bad!r}"


def test_graph_thread_count_follows_the_same_rule():
    op = build("bind_rmsnorm")(nthreads=2)
    Graph([op], np.int64(2)).run()
    assert Graph([op], 1024).n_barriers == 1
    for bad in BAD_THREADS:
        with pytest.raises(ValueError, match=re.escape(f"got {bad!r}")):
            Graph([op], bad)


# ============================================================================ array arguments


def _array_params(name: str) -> list[tuple[str, str]]:
    call = build(name)
    return [(name, p) for p, v in call.params.items() if isinstance(v, np.ndarray)]


ARRAY_PARAMS = [case for name in ENTRIES for case in _array_params(name)]
WRITTEN_PARAMS = [(name, p) for name in ENTRIES for p in build(name).writes]


@pytest.mark.parametrize("name, param", ARRAY_PARAMS)
def test_a_wrong_dtype_is_refused_naming_the_argument(name, param):
    call = build(name)
    a = call.params[param]
    call.params[param] = a.astype(np.float32 if a.dtype == np.float64 else np.float64)
    with pytest.raises(TypeError, match=rf"^{param} "):
        call(nthreads=1)


@pytest.mark.parametrize("name, param", WRITTEN_PARAMS)
def test_a_read_only_output_is_refused_naming_the_argument(name, param):
    call = build(name)
    call.params[param].flags.writeable = False
    with pytest.raises(ValueError, match=rf"^{param} (is read-only|must be a writeable)"):
        call(nthreads=1)


def test_shape_and_layout_messages_name_the_argument():
    """One checker for every module: the same shape / contiguity wording."""
    call = build("matmul")
    call.params["out"] = _out((3, 21))
    with pytest.raises(ValueError, match=re.escape("out must have shape (3, 20), got (3, 21)")):
        call()
    call = build("moe_fold")
    call.params["pos"] = call.params["pos"][:4]
    with pytest.raises(ValueError, match=re.escape("pos must have shape (6,), got (4,)")):
        call()
    call = build("moe_route")
    call.params["logits"] = call.params["logits"][0]
    with pytest.raises(
        ValueError, match=re.escape("logits must have 2 dimensions, got shape (4,)")
    ):
        call()
    call = build("attention")
    call.params["q"] = np.asfortranarray(call.params["q"])
    with pytest.raises(ValueError, match="^q must be C-contiguous and aligned"):
        call()
    call = build("ssm_conv")
    call.params["state"] = np.zeros((8, 2), np.float32).T
    with pytest.raises(ValueError, match="^state must be C-contiguous and aligned"):
        call()
    call = build("rmsnorm")
    call.params["x"] = np.zeros((3, 32), np.float32)[:, ::2]
    with pytest.raises(ValueError, match="^x must be C-contiguous, or 2-D with a contiguous last"):
        call()


def test_strided_rows_are_one_rule():
    """ops and ssm take the same row-strided views: column slices yes, overlapping rows no."""
    h = np.arange(3 * 32, dtype=np.float32).reshape(3, 32)
    gate, up = h[:, :16], h[:, 16:]
    assert np.array_equal(K.add(gate, up), gate + up)
    assert np.array_equal(SSM.sigmoid_mul(np.zeros_like(gate), gate), gate / np.float32(2))
    overlapping = np.lib.stride_tricks.as_strided(h, (3, 16), (16, 4))  # rows 4 floats apart
    for fn in (lambda: K.add(overlapping, gate), lambda: SSM.sigmoid_mul(overlapping, gate)):
        with pytest.raises(ValueError, match="rows that do not overlap"):
            fn()


# ============================================================================ exports

GRAPH_HELPERS = {"attention_scratch", "count_exact", "count_fast"}  # goinfer/graph.py's


def test_every_public_kernel_is_exported():
    exported = set(K.__all__)
    assert len(K.__all__) == len(exported)
    for module, names in K.KERNELS.items():
        public = {
            n
            for n, fn in vars(MODULES[module]).items()
            if not n.startswith(("_", "bind_"))
            and callable(fn)
            and type(fn).__name__ == "cython_function_or_method"
        }
        assert public - GRAPH_HELPERS == set(names), module
        for n in names:
            assert getattr(K, n) is getattr(MODULES[module], n)
    twins = {n for n, fn in vars(R).items() if inspect.isfunction(fn) and not n.startswith("_")}
    defined = {n for mod in MODULES.values() for n in vars(mod)}
    assert twins & defined <= exported
    assert "swiglu_oai" in exported
    ns: dict[str, Any] = {}
    exec("from goinfer._kernels import *", ns)
    assert exported <= set(ns)


def test_byte_swapped_arrays_are_refused():
    """A float32 array in the other byte order has the right type number but the wrong bytes."""
    call = build("rmsnorm")
    call.params["x"] = call.params["x"].astype(call.params["x"].dtype.newbyteorder())
    with pytest.raises(TypeError, match="^x must have dtype float32, got >f4"):
        call()
    call = build("gated_delta")
    call.params["state"] = call.params["state"].astype(">f4")
    with pytest.raises(TypeError, match="^state must have dtype float32"):
        call()
