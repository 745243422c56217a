"""GGUF reading and conversion: small files built here (gguf.GGUFWriter or by hand)."""

from __future__ import annotations

import hashlib
import random
import re
import shutil
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize as ref_dequantize

from goinfer._reference import dequantize
from goinfer.errors import GoinferError, ModelFormatError, UnsupportedTensorTypeError
from goinfer.gguf import NATIVE_TARGET, GGUFFile, native_target

# ============================================================================ helpers

# byte offsets of the float16 scales inside one block, per type (all others: random bytes)
F16_FIELDS = {
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q5_0: [0],
    T.Q5_1: [0, 2],
    T.Q8_0: [0],
    T.Q2_K: [80, 82],
    T.Q3_K: [108],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
}
QUANT_TYPES = [
    T.Q4_0,
    T.Q4_1,
    T.Q5_0,
    T.Q5_1,
    T.Q8_0,
    T.MXFP4,
    T.Q2_K,
    T.Q3_K,
    T.Q4_K,
    T.Q5_K,
    T.Q6_K,
    T.Q8_K,
]


def random_blocks(
    qtype: T,
    n_out: int,
    n_in: int,
    rng: np.random.Generator,
    scale_lo: float = 1e-3,
    scale_hi: float = 1e-1,
) -> np.ndarray:
    """Random raw blocks (n_out, row_bytes) uint8 with sane float16 scales (random sign)."""
    bs, ts = GGML_QUANT_SIZES[qtype]
    nb = n_in // bs
    b = rng.integers(0, 256, size=(n_out, nb, ts), dtype=np.uint8)
    if qtype == T.Q8_K:
        d = rng.uniform(scale_lo, scale_hi, size=(n_out, nb)) * rng.choice([-1, 1], (n_out, nb))
        b[..., 0:4] = d.astype("<f4")[..., None].view(np.uint8)
    if qtype == T.MXFP4:  # e8m0 exponents: 2^-28 .. 2^12 (0..3 and 255 in test_mxfp4_extremes)
        b[..., 0] = rng.integers(100, 140, size=(n_out, nb))
    for off in F16_FIELDS.get(qtype, []):
        d = rng.uniform(scale_lo, scale_hi, size=(n_out, nb)) * rng.choice([-1, 1], (n_out, nb))
        b[..., off : off + 2] = d.astype("<f2")[..., None].view(np.uint8)
    return b.reshape(n_out, nb * ts)


def q8k_reference(raw: np.ndarray, n_out: int, n_in: int) -> np.ndarray:
    """Q8_K by hand (gguf.quants has no Q8_K): value = d (f32) * q (int8)."""
    b = raw.reshape(n_out, n_in // 256, 292)
    d = np.ascontiguousarray(b[..., 0:4]).view("<f4")
    return (b[..., 4:260].view(np.int8).astype(np.float32) * d).reshape(n_out, n_in)


def reference(qtype: T, raw: np.ndarray, n_out: int, n_in: int) -> np.ndarray:
    if qtype == T.Q8_K:
        return q8k_reference(raw, n_out, n_in)
    return ref_dequantize(raw, qtype).reshape(n_out, n_in).astype(np.float32)


def write_gguf(path, tensors: dict, kv: dict | None = None, arch: str = "llama") -> str:
    """tensors: name -> (array, raw_dtype or None).  kv: key -> value (GGUFWriter.add_key_value)."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(2)
    for k, (v, vtype) in (kv or {}).items():
        w.add_key_value(k, v, vtype)
    for name, (arr, raw_dtype) in tensors.items():
        w.add_tensor(name, arr, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


# ---------------------------------------------------------------- hand-built files (hostile tests)


def _s(b: bytes) -> bytes:
    return struct.pack("<Q", len(b)) + b


def kv_str(key: str, val: bytes | str) -> bytes:
    val = val.encode() if isinstance(val, str) else val
    return _s(key.encode()) + struct.pack("<I", 8) + _s(val)


def kv_u32(key: str, val: int) -> bytes:
    return _s(key.encode()) + struct.pack("<II", 4, val)


def tinfo(name: str, dims, tid: int, off: int) -> bytes:
    return (
        _s(name.encode())
        + struct.pack("<I", len(dims))
        + struct.pack(f"<{len(dims)}Q", *dims)
        + struct.pack("<IQ", tid, off)
    )


def build(
    kvs: list[bytes],
    infos: list[bytes],
    data: bytes,
    *,
    magic=b"GGUF",
    version=3,
    n_tensors=None,
    n_kv=None,
    align=32,
) -> bytes:
    kvs = [kv_str("general.architecture", "llama")] + kvs
    head = magic + struct.pack(
        "<IQQ",
        version,
        len(infos) if n_tensors is None else n_tensors,
        len(kvs) if n_kv is None else n_kv,
    )
    head += b"".join(kvs) + b"".join(infos)
    head += b"\0" * (-len(head) % align)
    return head + data


def one_f32_tensor_file(**kw) -> bytes:
    data = np.arange(64, dtype="<f4").tobytes()
    return build([], [tinfo("w", [32, 2], 0, 0)], data, **kw)


@pytest.fixture
def tmpfile(tmp_path):
    def make(content: bytes, name="m.gguf"):
        p = tmp_path / name
        p.write_bytes(content)
        return str(p)

    return make


# ============================================================================ conversions


SHAPES = [(37, 256), (16, 512), (5, 768)]  # n_out not a multiple of 16 included


@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_load_weight_matches_reference(tmp_path, qtype, shape):
    n_out, n_in = shape
    rng = np.random.default_rng(hash((qtype.name, shape)) & 0xFFFF)
    raw = random_blocks(qtype, n_out, n_in, rng)
    path = write_gguf(tmp_path / "t.gguf", {"w": (raw, qtype)})
    g = GGUFFile(path)
    assert g.tensor_info("w") == (qtype.name, (n_out, n_in))
    w = g.load_weight("w")
    kind, how = native_target(qtype.name)
    assert (w.kind, w.source_type, w.n_out, w.n_in) == (kind, qtype.name, n_out, n_in)
    ref = reference(qtype, raw, n_out, n_in)
    got = dequantize(w)
    assert got.shape == ref.shape
    if how in ("repack", "exact"):
        # same values, bit for bit
        np.testing.assert_array_equal(got, ref)
    else:
        # requantized to q8_0 per 32: d = f16(amax/127) (within 2^-11 of amax/127), codes
        # rint(x/d) clipped to +-127: |err| <= d/2 <= amax/254 * (1 + 2^-11), plus float32
        # rounding of d*q (< 2^-23 amax).
        amax = np.abs(ref.reshape(n_out, -1, 32)).max(axis=2).astype(np.float64)
        tol = np.repeat(amax, 32, axis=1) * (1 / 254 * (1 + 2**-10) + 2**-22)
        err = np.abs(got.astype(np.float64) - ref)
        assert np.all(err <= tol), float((err - tol).max())


@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda t: t.name)
def test_load_f32_matches_reference(tmp_path, qtype):
    n_out, n_in = 19, 512
    rng = np.random.default_rng(7)
    raw = random_blocks(qtype, n_out, n_in, rng)
    g = GGUFFile(write_gguf(tmp_path / "t.gguf", {"w": (raw, qtype)}))
    got = g.load_f32("w")
    ref = reference(qtype, raw, n_out, n_in)
    assert got.dtype == np.float32 and got.shape == (n_out, n_in)
    # same formulas as the reference; allow a couple of float32 roundings of order
    np.testing.assert_allclose(
        got, ref, rtol=0, atol=4 * np.finfo(np.float32).eps * np.abs(ref).max()
    )


@pytest.mark.parametrize("dtype,kind", [(np.float32, "f32"), (np.float16, "f16")])
def test_float_tensors_exact(tmp_path, dtype, kind):
    rng = np.random.default_rng(3)
    a = rng.standard_normal((21, 40)).astype(dtype)  # n_in need not be a multiple of 32
    v = rng.standard_normal(40).astype(dtype)
    g = GGUFFile(write_gguf(tmp_path / "t.gguf", {"w": (a, None), "v": (v, None)}))
    w = g.load_weight("w")
    assert w.kind == kind and w.source_type == kind.upper()
    np.testing.assert_array_equal(dequantize(w), a.astype(np.float32))
    np.testing.assert_array_equal(g.load_f32("w"), a.astype(np.float32))
    np.testing.assert_array_equal(g.load_f32("v"), v.astype(np.float32))
    assert g.tensor_info("v") == (kind.upper(), (40,))
    with pytest.raises(ModelFormatError, match="2-D"):
        g.load_weight("v")


def test_bf16_exact(tmp_path):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((18, 64)).astype(np.float32)
    bits = (x.view(np.uint32) >> 16).astype(np.uint16)
    g = GGUFFile(write_gguf(tmp_path / "t.gguf", {"w": (bits, T.BF16)}))
    w = g.load_weight("w")
    assert w.kind == "bf16"
    expect = (bits.astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(dequantize(w), expect)
    np.testing.assert_array_equal(g.load_f32("w"), expect)
    np.testing.assert_array_equal(
        g.load_f32("w"), ref_dequantize(bits.view(np.uint8), T.BF16).reshape(18, 64)
    )


def q5_by_hand(raw: np.ndarray, qtype: T, n_out: int, n_in: int):
    """Q5_0 / Q5_1 blocks read by hand from the block layout (ggml's block_q5_0: d, qh u32, qs[16];
    block_q5_1: d, m, qh, qs): codes (n_out, n_in) 0..31, d [, m] (n_out, n_in/32) float16."""
    ts = 22 if qtype == T.Q5_0 else 24
    b = raw.reshape(n_out, n_in // 32, ts)
    at = 2 if qtype == T.Q5_0 else 4
    qh = np.ascontiguousarray(b[..., at : at + 4]).view("<u4")[..., 0]  # (n_out, nb)
    qs = b[..., at + 4 : at + 20]
    q = np.empty((n_out, n_in // 32, 32), np.uint8)
    for j in range(16):  # byte j: code j (low nibble), code j + 16 (high); qh bit e: code e's bit 4
        q[..., j] = (qs[..., j] & 15) | (((qh >> j) & 1) << 4).astype(np.uint8)
        q[..., j + 16] = (qs[..., j] >> 4) | (((qh >> (j + 16)) & 1) << 4).astype(np.uint8)
    d = np.ascontiguousarray(b[..., 0:2]).view("<f2")[..., 0]
    m = np.ascontiguousarray(b[..., 2:4]).view("<f2")[..., 0] if qtype == T.Q5_1 else None
    return q.reshape(n_out, n_in), d, m


@pytest.mark.parametrize("qtype", [T.Q5_0, T.Q5_1], ids=lambda t: t.name)
def test_q5_loads_as_stored(tmp_path, qtype):
    """Q5_0 / Q5_1 load as q5_0 / q5_1: the file's codes, d (and m) unchanged, the file's bytes
    per row block (no conversion to q8_0), dequantized bit for bit as gguf-py, whether the
    blocks come from gguf-py's quantizer or are random bytes; goinfer's own quantizer picks
    gguf-py's codes; the loaded weight multiplies with the contract's bits on every variant."""
    from gguf.quants import quantize as gguf_quantize
    from test_kernels_matmul import check_matmul

    from goinfer.quant import codes, quantize_weight

    kind = qtype.name.lower()
    rng = np.random.default_rng(21)
    n_out, n_in = 37, 320  # a ragged row block, 10 groups
    x = rng.standard_normal((n_out, n_in)).astype(np.float32)
    x[0, :32] = 0.0  # an all-zero group: d = 0
    x[1, :32] = np.linspace(-3, 1, 32)  # the extreme codes 0 and 31
    quantized = gguf_quantize(x, qtype)  # (n_out, row bytes)
    for raw in (quantized, random_blocks(qtype, n_out, n_in, rng)):
        g = GGUFFile(write_gguf(tmp_path / f"{kind}.gguf", {"w": (raw, qtype)}))
        w = g.load_weight("w")
        assert (w.kind, w.source_type, w.qs.shape) == (kind, qtype.name, (3, 10, 5, 16, 4))
        q, d, m = q5_by_hand(raw, qtype, n_out, n_in)
        np.testing.assert_array_equal(codes(w), q)
        np.testing.assert_array_equal(w.d.transpose(0, 2, 1).reshape(48, 10)[:n_out], d)
        if m is not None:
            np.testing.assert_array_equal(w.m.transpose(0, 2, 1).reshape(48, 10)[:n_out], m)
        assert w.nbytes == 48 * raw.shape[1]  # the file's bytes, rows padded to 16
        np.testing.assert_array_equal(dequantize(w), reference(qtype, raw, n_out, n_in))
        assert g.native_bytes() == w.nbytes
        check_matmul(rng.standard_normal((5, n_in)).astype(np.float32), w)
    mine = quantize_weight(x, kind)
    np.testing.assert_array_equal(codes(mine), q5_by_hand(quantized, qtype, n_out, n_in)[0])
    np.testing.assert_array_equal(dequantize(mine), reference(qtype, quantized, n_out, n_in))


def test_mxfp4_extremes_and_quantizer(tmp_path):
    """Every e8m0 byte (0, 1: subnormal scales; 255: 2^127, ggml's reading, not NaN) and every
    code decode exactly as gguf-py does; gguf-py's own quantizer output loads unchanged, and
    goinfer's quantize_weight("mxfp4") picks the same codes and exponents."""
    from gguf.quants import quantize as gguf_quantize

    from goinfer.quant import quantize_weight

    rng = np.random.default_rng(11)
    raw = rng.integers(0, 256, size=(16, 16, 17), dtype=np.uint8)  # 16 rows x 16 blocks
    raw[:, :, 0] = np.arange(256, dtype=np.uint8).reshape(16, 16)  # every exponent once
    raw = raw.reshape(16, 16 * 17)
    g = GGUFFile(write_gguf(tmp_path / "x.gguf", {"w": (raw, T.MXFP4)}))
    with np.errstate(over="ignore"):  # 12 * 2^127 is inf in float32, for gguf-py too
        want = reference(T.MXFP4, raw, 16, 512)
        np.testing.assert_array_equal(dequantize(g.load_weight("w")), want)
        np.testing.assert_array_equal(g.load_f32("w"), want)
    x = (rng.standard_normal((37, 256)) * np.exp(rng.uniform(-8, 8, (37, 1)))).astype(np.float32)
    x[0, :32] = 0.0
    q = gguf_quantize(x, T.MXFP4)
    g2 = GGUFFile(write_gguf(tmp_path / "q.gguf", {"w": (q, T.MXFP4)}))
    w2 = g2.load_weight("w")
    np.testing.assert_array_equal(dequantize(w2), ref_dequantize(q, T.MXFP4).reshape(37, 256))
    mine = quantize_weight(x, "mxfp4")
    np.testing.assert_array_equal(mine.qs, w2.qs)
    np.testing.assert_array_equal(mine.d, w2.d)


def test_mxfp4_matmul_against_gguf_dequantization(tmp_path):
    """matmul on an MXFP4 tensor loaded from a GGUF == float64 product with gguf-py's
    dequantized weights, within the int8 activation rounding (1 and 2 threads, GEMV and GEMM)."""
    import goinfer._kernels as K
    from goinfer import _reference as ref

    rng = np.random.default_rng(12)
    n_out, n_in = 45, 256
    raw = random_blocks(T.MXFP4, n_out, n_in, rng)
    w = GGUFFile(write_gguf(tmp_path / "m.gguf", {"w": (raw, T.MXFP4)})).load_weight("w")
    wd = reference(T.MXFP4, raw, n_out, n_in).astype(np.float64)
    for M in (1, 5, 30):
        x = rng.standard_normal((M, n_in)).astype(np.float32)
        xq = K.quantize_act(x)
        xd = ref.dequantize_act(xq).astype(np.float64)
        want = xd @ wd.T  # the exact product of the quantized activation and gguf's weights
        outs = [K.matmul(xq, w, nthreads=nt) for nt in (1, 2)]
        assert np.array_equal(outs[0], outs[1])
        bound = (n_in // 32 + 8) * 2.0**-24 * (np.abs(xd) @ np.abs(wd).T)
        assert np.all(np.abs(outs[0] - want) <= bound)
        if M > 1:
            assert np.array_equal(K.matmul(K.quantize_act(x[2:3]), w)[0], outs[0][2])


def test_non_finite_scales_are_data(tmp_path):
    rng = np.random.default_rng(6)
    tensors = {}
    for qt in (T.Q4_0, T.Q8_0, T.Q4_K, T.Q6_K):
        raw = random_blocks(qt, 16, 256, rng).reshape(16, -1, GGML_QUANT_SIZES[qt][1])
        off = F16_FIELDS[qt][0]
        raw[0, 0, off : off + 2] = np.array([np.inf], "<f2").view(np.uint8)
        raw[1, 0, off : off + 2] = np.array([np.nan], "<f2").view(np.uint8)
        tensors[qt.name] = (raw.reshape(16, -1), qt)
    g = GGUFFile(write_gguf(tmp_path / "t.gguf", tensors))
    with np.errstate(all="ignore"):
        for name in tensors:
            w = g.load_weight(name)
            vals = dequantize(w)
            assert not np.isfinite(vals[:2]).all()  # the bad blocks stay non-finite
            assert np.isfinite(vals[2:]).all()
            g.load_f32(name)


def test_k_quants_with_large_scales_load_exactly(tmp_path):
    """d*sc above the float16 range (65504) is no problem: the kernels form d*sc in float32,
    so Q4_K / Q5_K load as they are (no float16 scale to overflow) and match gguf-py."""
    rng = np.random.default_rng(8)
    for qt, kind in ((T.Q4_K, "q4_k"), (T.Q5_K, "q5_k")):
        raw = random_blocks(qt, 16, 256, rng, scale_lo=3000, scale_hi=4000)
        g = GGUFFile(write_gguf(tmp_path / f"{kind}.gguf", {"w": (raw, qt)}))
        w = g.load_weight("w")
        assert (w.kind, w.source_type) == (kind, qt.name)
        ref = reference(qt, raw, 16, 256)
        assert np.isfinite(ref).all() and np.abs(ref).max() > 65504
        np.testing.assert_array_equal(dequantize(w), ref)


def test_unsupported_type_is_typed(tmp_path):
    # IQ4_NL: a known GGML type goinfer does not decode
    raw = np.random.default_rng(1).integers(0, 256, size=(16, 2 * 18), dtype=np.uint8)
    g = GGUFFile(write_gguf(tmp_path / "t.gguf", {"odd": (raw, T.IQ4_NL)}))
    assert g.tensor_info("odd") == ("IQ4_NL", (16, 64))
    with pytest.raises(UnsupportedTensorTypeError, match="'odd'.*IQ4_NL"):
        g.load_weight("odd")
    with pytest.raises(UnsupportedTensorTypeError, match="IQ4_NL"):
        g.load_f32("odd")


def test_conversion_summary(tmp_path):
    rng = np.random.default_rng(2)
    tensors = {
        "a": (random_blocks(T.Q4_K, 16, 256, rng), T.Q4_K),
        "b": (random_blocks(T.Q4_K, 32, 256, rng), T.Q4_K),
        "c": (random_blocks(T.Q6_K, 16, 256, rng), T.Q6_K),
        "n": (np.ones(256, np.float32), None),
    }
    g = GGUFFile(write_gguf(tmp_path / "t.gguf", tensors))
    assert str(g.conversion_summary()) == "no tensors loaded"
    for n in "abc":
        g.load_weight(n)
    g.load_f32("n")
    rows = {(r["source_type"], r["kind"]): r for r in g.conversion_summary().as_dicts()}
    assert rows[("Q4_K", "q4_k")]["count"] == 2
    assert rows[("Q4_K", "q4_k")]["bytes_in"] == 48 * 144 == rows[("Q4_K", "q4_k")]["bytes_out"]
    assert rows[("Q6_K", "q6_k")]["how"] == "repack"
    assert rows[("F32", "f32 (dense)")]["bytes_out"] == 1024
    text = str(g.conversion_summary())
    assert "Q4_K" in text and "q4_k" in text and "total" in text
    assert not g.conversion_summary().converted  # every k-quant as it is


def test_native_target_per_variant():
    """The k-quants a Q4_K_M / Q5_K_M file holds, and its Q5_0 / Q5_1, load as they are on every
    variant (each has q4_k, q5_k, q6_k, q5_0 and q5_1 microkernels), so the weights a decode step
    reads are the file's bytes."""
    for t, kind in (
        ("Q4_K", "q4_k"),
        ("Q5_K", "q5_k"),
        ("Q6_K", "q6_k"),
        ("Q5_0", "q5_0"),
        ("Q5_1", "q5_1"),
    ):
        for v in ("portable", "avx2", "avx512-vnni"):
            assert native_target(t, v) == (kind, "repack"), (t, v)
    for t in NATIVE_TARGET:
        assert native_target(t, "avx512-vnni") == native_target(t, "avx2") == NATIVE_TARGET[t]


# ============================================================================ metadata


def test_metadata_decoding(tmp_path):
    V = gguf.GGUFValueType
    kv = {
        "x.u8": (200, V.UINT8),
        "x.i8": (-5, V.INT8),
        "x.u16": (60000, V.UINT16),
        "x.i16": (-300, V.INT16),
        "x.u32": (4_000_000_000, V.UINT32),
        "x.i32": (-7, V.INT32),
        "x.f32": (0.25, V.FLOAT32),
        "x.u64": (2**63 + 1, V.UINT64),
        "x.i64": (-(2**40), V.INT64),
        "x.f64": (1e-300, V.FLOAT64),
        "x.bool": (True, V.BOOL),
        "x.str": ("héllo ✓", V.STRING),
        "x.strs": (["a", "", "ü", "<0x0A>"], V.ARRAY),
        "x.ints": ([1, -2, 3], V.ARRAY),
        "x.floats": ([0.5, 1.5], V.ARRAY),
        "x.bools": ([True, False], V.ARRAY),
        "llama.context_length": (4096, V.UINT32),
    }
    g = GGUFFile(write_gguf(tmp_path / "t.gguf", {"w": (np.zeros((2, 32), np.float32), None)}, kv))
    m = g.metadata
    assert g.arch == "llama" and m["general.architecture"] == "llama"
    for k in ("x.u8", "x.i8", "x.u16", "x.i16", "x.u32", "x.i32", "x.u64", "x.i64"):
        assert type(m[k]) is int and m[k] == kv[k][0], k
    assert type(m["x.f32"]) is float and m["x.f32"] == 0.25
    assert type(m["x.f64"]) is float and m["x.f64"] == 1e-300
    assert m["x.bool"] is True
    assert m["x.str"] == "héllo ✓"
    assert m["x.strs"] == ["a", "", "ü", "<0x0A>"] and all(type(s) is str for s in m["x.strs"])
    assert isinstance(m["x.ints"], np.ndarray) and m["x.ints"].tolist() == [1, -2, 3]
    assert m["x.ints"].dtype.kind == "i"
    assert isinstance(m["x.floats"], np.ndarray) and m["x.floats"].dtype == np.float32
    assert m["x.bools"].dtype == np.bool_ and m["x.bools"].tolist() == [True, False]
    assert m["x.ints"].flags.writeable  # a copy, not a view of the read-only map
    assert g.get("x.nope") is None and g.get("x.nope", 3) == 3
    assert g.arch_get("context_length") == 4096 and g.arch_get("block_count") == 2
    assert g.arch_get("nope", "d") == "d"
    assert not any(k.startswith("GGUF.") for k in m)
    assert (
        g.version == 3 and g.tensor_names == ["w"] and g.has_tensor("w") and not g.has_tensor("v")
    )
    with pytest.raises(ModelFormatError, match="no tensor named 'v'"):
        g.tensor_info("v")


def test_empty_arrays_and_hand_built_metadata(tmpfile):
    kvs = [
        _s(b"a.empty") + struct.pack("<IIQ", 9, 5, 0),  # empty int32 array
        _s(b"a.noStrings") + struct.pack("<IIQ", 9, 8, 0),  # empty string array
        kv_u32("a.u", 7),
    ]
    g = GGUFFile(tmpfile(build(kvs, [], b"")))
    assert g.get("a.empty").shape == (0,) and g.get("a.noStrings") == [] and g.get("a.u") == 7
    assert g.tensor_names == []


def test_string_arrays_compiled_and_python_agree(tmp_path, monkeypatch):
    """The compiled string-array reader (goinfer/_kernels/gguf_text.pyx) and the Python loop it
    replaces read the same strings and reject the same files (truncated at every offset of the
    array, invalid UTF-8) with the same error types."""
    import goinfer.gguf as gg

    assert gg._string_array is not None  # the compiled reader is in use
    strs = ["a", "", "ü", "<0x0A>", "Ġthe", "\u2581x", "☃" * 7]
    arr = (
        _s(b"k.strs")
        + struct.pack("<IIQ", 9, 8, len(strs))
        + b"".join(_s(x.encode()) for x in strs)
    )
    bad = _s(b"k.bad") + struct.pack("<IIQ", 9, 8, 2) + _s(b"ok") + _s(b"\xc3\x28")
    ti = [tinfo("w", [32, 2], 0, 0)]
    data = np.zeros(64, "<f4").tobytes()
    full = build([arr], ti, data)
    start = full.index(b"k.strs")
    p = tmp_path / "s.gguf"

    def outcome(content, compiled):
        p.write_bytes(content)
        monkeypatch.setattr(gg, "_string_array", real if compiled else None)
        try:
            return GGUFFile(p).get("k.strs", "absent")
        except Exception as e:  # noqa: BLE001 - the error type is the outcome
            return type(e)

    real = gg._string_array
    assert outcome(full, True) == outcome(full, False) == strs
    for cut in range(start, start + len(arr)):
        a, b = outcome(full[:cut], True), outcome(full[:cut], False)
        assert a == b and a is ModelFormatError, cut
    bad_file = build([bad], ti, data)
    assert outcome(bad_file, True) is outcome(bad_file, False) is ModelFormatError


# ============================================================================ fingerprint


def fingerprint_by_definition(path) -> str:
    """GGUFFile.fingerprint as documented: sha256 of a tag, the file size, the header (bytes
    before the tensor data, located by gguf-py's reader) and 256 slices of 4 KiB spread
    evenly over the tensor data."""
    raw = Path(path).read_bytes()
    off = gguf.GGUFReader(path).data_offset
    h = hashlib.sha256(
        b"goinfer-gguf-fingerprint-v2\0" + len(raw).to_bytes(8, "little") + raw[:off]
    )
    step = max(1, (len(raw) - off) // 256)
    for o in range(off, len(raw), step):
        h.update(raw[o : o + 4096])
    return h.hexdigest()


def test_fingerprint(tmp_path):
    rng = np.random.default_rng(9)
    raw = random_blocks(T.Q4_0, 16, 64, rng)
    p1 = write_gguf(
        tmp_path / "a.gguf", {"w": (raw, T.Q4_0)}, {"k.v": (1, gguf.GGUFValueType.UINT32)}
    )
    fp = GGUFFile(p1).fingerprint
    assert re.fullmatch("[0-9a-f]{64}", fp) and fp == fingerprint_by_definition(p1)
    big = write_gguf(
        tmp_path / "big.gguf", {"w": (random_blocks(T.Q8_0, 4096, 256, rng), T.Q8_0)}, {}
    )
    assert GGUFFile(big).fingerprint == fingerprint_by_definition(big)  # 1.1 MB: data sampled
    assert GGUFFile(p1).fingerprint == fp  # stable across opens
    p2 = str(tmp_path / "copy.gguf")
    shutil.copy(p1, p2)
    assert GGUFFile(p2).fingerprint == fp  # path does not matter
    # other metadata value -> other fingerprint
    p3 = write_gguf(
        tmp_path / "b.gguf", {"w": (raw, T.Q4_0)}, {"k.v": (2, gguf.GGUFValueType.UINT32)}
    )
    assert GGUFFile(p3).fingerprint != fp
    # other tensor shape/type -> other fingerprint
    p4 = write_gguf(
        tmp_path / "c.gguf",
        {"w": (random_blocks(T.Q8_0, 16, 64, rng), T.Q8_0)},
        {"k.v": (1, gguf.GGUFValueType.UINT32)},
    )
    assert GGUFFile(p4).fingerprint != fp
    # a different file size -> other fingerprint
    with open(p2, "ab") as fh:
        fh.write(b"\0" * 32)
    assert GGUFFile(p2).fingerprint != fp
    # same shapes, other weights (a fine-tune) -> other fingerprint: tensor data is sampled
    p5 = write_gguf(
        tmp_path / "d.gguf",
        {"w": (random_blocks(T.Q4_0, 16, 64, rng), T.Q4_0)},
        {"k.v": (1, gguf.GGUFValueType.UINT32)},
    )
    assert GGUFFile(p5).fingerprint != fp


# ============================================================================ hostile / broken files


def test_bad_magic(tmpfile):
    good = one_f32_tensor_file()
    assert GGUFFile(tmpfile(good)).load_f32("w").shape == (2, 32)
    with pytest.raises(ModelFormatError, match="not a GGUF"):
        GGUFFile(tmpfile(b"GGML" + good[4:]))
    with pytest.raises(ModelFormatError, match="not a GGUF"):
        GGUFFile(tmpfile(b""))
    with pytest.raises(ModelFormatError, match="not a GGUF"):
        GGUFFile(tmpfile(b"PK\x03\x04" + b"\0" * 100))


@pytest.mark.parametrize("version", [0, 1, 4, 99, 0x03000000])
def test_bad_version(tmpfile, version):
    with pytest.raises(ModelFormatError, match="version|big-endian"):
        GGUFFile(tmpfile(one_f32_tensor_file(version=version)))


def test_version_2_reads(tmpfile):
    assert GGUFFile(tmpfile(one_f32_tensor_file(version=2))).version == 2


@pytest.mark.parametrize("which", ["tensors", "kv"])
@pytest.mark.parametrize("count", [2**62, 2**64 - 1, 10**6])
def test_absurd_counts(tmpfile, which, count):
    kw = {"n_tensors": count} if which == "tensors" else {"n_kv": count}
    with pytest.raises(ModelFormatError, match="absurd|truncated"):
        GGUFFile(tmpfile(one_f32_tensor_file(**kw)))


def test_small_wrong_counts_are_truncation(tmpfile):
    with pytest.raises(ModelFormatError):
        GGUFFile(tmpfile(one_f32_tensor_file(n_kv=5)))
    with pytest.raises(ModelFormatError):
        GGUFFile(tmpfile(one_f32_tensor_file(n_tensors=3)))


def test_absurd_lengths(tmpfile):
    data = np.zeros(64, "<f4").tobytes()
    ti = [tinfo("w", [32, 2], 0, 0)]
    cases = {
        "huge string": [_s(b"k") + struct.pack("<IQ", 8, 2**62)],
        "huge key": [struct.pack("<Q", 2**63) + b"k"],
        "huge u8 array": [_s(b"k") + struct.pack("<IIQ", 9, 0, 2**60)],
        "huge string array": [_s(b"k") + struct.pack("<IIQ", 9, 8, 2**40)],
        "huge f64 array": [_s(b"k") + struct.pack("<IIQ", 9, 12, 10**6)],
        "nested array": [_s(b"k") + struct.pack("<IIQ", 9, 9, 1) + struct.pack("<IQ", 0, 0)],
        "bad value type": [_s(b"k") + struct.pack("<I", 77) + b"\0" * 8],
        "bad elem type": [_s(b"k") + struct.pack("<IIQ", 9, 77, 1) + b"\0" * 8],
        "bad utf8 value": [kv_str("k", b"\xff\xfe")],
        "bad utf8 in array": [_s(b"k") + struct.pack("<IIQ", 9, 8, 1) + _s(b"\xc3")],
        "duplicate key": [kv_u32("k", 1), kv_u32("k", 2)],
        "bad alignment": [kv_u32("general.alignment", 3)],
        "alignment type": [kv_str("general.alignment", "32")],
        "no arch": [],
    }
    for what, kvs in cases.items():
        content = build(kvs, ti, data)
        if what == "no arch":
            content = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + kv_u32("general.foo", 1)
        with pytest.raises(ModelFormatError):
            GGUFFile(tmpfile(content))


def test_hostile_tensor_infos(tmpfile):
    data = np.zeros(64, "<f4").tobytes()
    cases = {
        "offset past EOF": (tinfo("w", [32, 2], 0, 10**6), ModelFormatError, "past the end"),
        "offset wraps": (tinfo("w", [32, 2], 0, 2**64 - 32), ModelFormatError, "past the end"),
        "data past EOF": (tinfo("w", [32, 4], 0, 0), ModelFormatError, "past the end"),
        "huge dims": (tinfo("w", [2**32, 2**32], 0, 0), ModelFormatError, "absurd|past the end"),
        "dims overflow u64": (
            tinfo("w", [2**40, 2**40, 2**40, 2**40], 0, 0),
            ModelFormatError,
            "past the end",
        ),
        "zero dim": (tinfo("w", [32, 0], 0, 0), ModelFormatError, "absurd"),
        "too many dims": (tinfo("w", [2] * 9, 0, 0), ModelFormatError, "dimensions"),
        "no dims": (tinfo("w", [], 0, 0), ModelFormatError, "dimensions"),
        "n_dims huge": (_s(b"w") + struct.pack("<I", 2**31) + b"\0" * 24, ModelFormatError, None),
        "unknown type id": (tinfo("w", [32, 2], 99, 0), UnsupportedTensorTypeError, "'w'.*99"),
        "row not whole blocks": (tinfo("w", [48, 1], 2, 0), ModelFormatError, "block size"),
    }
    for _what, (info, exc, msg) in cases.items():
        with pytest.raises(exc, match=msg):
            GGUFFile(tmpfile(build([], [info], data)))
    # duplicate tensor names
    with pytest.raises(ModelFormatError):
        GGUFFile(tmpfile(build([], [tinfo("w", [32], 0, 0), tinfo("w", [32], 0, 128)], data)))


def _full_file(tmp_path) -> tuple[bytes, int]:
    rng = np.random.default_rng(11)
    V = gguf.GGUFValueType
    kv = {
        "tokenizer.ggml.tokens": (["<s>", "a", "bc", "déf"], V.ARRAY),
        "tokenizer.ggml.scores": ([0.0, -1.0, -2.0, -3.0], V.ARRAY),
        "x.name": ("hello", V.STRING),
        "x.n": (12, V.UINT32),
    }
    tensors = {
        "q4": (random_blocks(T.Q4_0, 16, 64, rng), T.Q4_0),
        "q4k": (random_blocks(T.Q4_K, 2, 256, rng), T.Q4_K),
        "norm": (np.ones(32, np.float32), None),
    }
    path = write_gguf(tmp_path / "full.gguf", tensors, kv)
    g = GGUFFile(path)
    data_end = max(int(t.data_offset) + int(t.n_bytes) for t in g._parts[0].reader.tensors)
    return open(path, "rb").read(), data_end


def _open_and_load_all(path):
    g = GGUFFile(path)
    for n in g.tensor_names:
        if len(g.tensor_info(n)[1]) == 2:
            g.load_weight(n)
        g.load_f32(n)
    return g


def test_truncation_at_every_offset(tmp_path):
    content, data_end = _full_file(tmp_path)
    p = tmp_path / "cut.gguf"
    cuts = list(range(0, min(len(content), 4096))) + list(range(4096, len(content), 7))
    for cut in cuts:
        p.write_bytes(content[:cut])
        if cut >= data_end:  # only trailing padding removed: still a whole file
            _open_and_load_all(p)
            continue
        with pytest.raises(ModelFormatError):
            _open_and_load_all(p)


def test_random_corruption_only_typed_errors(tmp_path):
    """Flip bytes of the header: opening and loading either works or raises a GoinferError."""
    content, _ = _full_file(tmp_path)
    g = GGUFFile(tmp_path / "full.gguf")
    header_len = g.data_offset
    rnd = random.Random(1234)
    p = tmp_path / "fuzz.gguf"
    outcomes = {"ok": 0, "error": 0}
    for _ in range(400):
        data = bytearray(content)
        for _ in range(rnd.choice([1, 1, 2, 4])):
            i = rnd.randrange(header_len)
            data[i] = rnd.choice([0, 0xFF, rnd.randrange(256), data[i] ^ (1 << rnd.randrange(8))])
        p.write_bytes(bytes(data))
        try:
            with np.errstate(all="ignore"):
                _open_and_load_all(p)
            outcomes["ok"] += 1
        except GoinferError:
            outcomes["error"] += 1
    assert outcomes["error"] > 50  # the fuzzing does hit the checks


def test_missing_file_is_os_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        GGUFFile(tmp_path / "nope.gguf")


def test_context_manager_and_repr(tmpfile):
    with GGUFFile(tmpfile(one_f32_tensor_file())) as g:
        assert "llama" in repr(g)
        arr = g.load_f32("w")
    assert arr.sum() == sum(range(64))  # loaded arrays outlive the file object
    assert g.metadata["general.architecture"] == "llama" and len(g.fingerprint) == 64
    assert g.tensor_names == ["w"] and g.has_tensor("w")
    with pytest.raises(ValueError, match="closed"):
        g.load_f32("w")


# ============================================================================ real model


@pytest.mark.slow
def test_real_file_loads(smollm2_path):
    """SmolLM2 (Q4_1 + Q8_0 + F32): every tensor loads, natively (nothing converted)."""
    g = _open_and_load_all(smollm2_path)
    assert g.conversion_summary().rows
    assert not g.conversion_summary().converted


def test_q6_k_requantized_where_the_variant_says(tmp_path, monkeypatch):
    """A variant whose table says q8_0 (avx512-vnni's choice) loads Q6_K requantized, and
    native_bytes follows the same choice."""
    from goinfer import gguf as gguf_mod
    from goinfer._kernels import _config

    rng = np.random.default_rng(12)
    raw = random_blocks(T.Q6_K, 37, 512, rng)
    path = write_gguf(tmp_path / "t.gguf", {"w": (raw, T.Q6_K)})
    monkeypatch.setitem(gguf_mod.VARIANT_TARGET, str(_config.variant()), {})  # NATIVE_TARGET's q6_k
    native = GGUFFile(path)
    w6 = native.load_weight("w")
    assert w6.kind == "q6_k" and native.native_bytes() == 48 * 512 * 210 // 256
    monkeypatch.setitem(
        gguf_mod.VARIANT_TARGET, str(_config.variant()), {"Q6_K": ("q8_0", "requantize")}
    )
    g = GGUFFile(path)
    w8 = g.load_weight("w")
    assert (w8.kind, w8.source_type) == ("q8_0", "Q6_K")
    assert g.native_bytes() == 48 * 512 * 34 // 32
    ref = reference(T.Q6_K, raw, 37, 512)
    amax = np.abs(ref.reshape(37, -1, 32)).max(axis=2).astype(np.float64)
    tol = np.repeat(amax, 32, axis=1) * (1 / 254 * (1 + 2**-10) + 2**-22)
    assert np.all(np.abs(dequantize(w8).astype(np.float64) - ref) <= tol)
    np.testing.assert_array_equal(dequantize(w6), ref)
