"""Native weight formats, activation quantization buffers, and (re)quantization.

Native weight kinds and their repacked layouts (what the matmul kernels read; see
docs/design/kernels.md).  Rows are grouped in row blocks of ROWS=16 output rows
(``n_rb = ceil(n_out / 16)``, padded rows are zero); K is split into groups of GROUP=32.

    q4_0  value = d * (nib - 8)        qs uint8 (n_rb, G, 4, 16, 4), d float16 (n_rb, G, 16)
    q4_1  value = d * nib + m          qs uint8 (n_rb, G, 4, 16, 4), d, m float16 (n_rb, G, 16)
    q8_0  value = d * q                qs int8  (n_rb, G, 8, 16, 4), d float16 (n_rb, G, 16)
    mxfp4 value = KV[code] * 2^(e-128) qs uint8 (n_rb, G, 4, 16, 4), d uint8 (n_rb, G, 16): e
    q6_k  value = d * sc * (q - 32)    qs uint8 (n_rb, G, 6, 16, 4), d float16 (n_rb, G/8, 16),
                                       m int8 (n_rb, G, 16, 2): sc
    q4_k  value = d*sc * q - dmin*mn   qs uint8 (n_rb, G, 4, 16, 4), d float16 (n_rb, G/8, 2, 16):
                                       d, dmin; m uint8 (n_rb, G/8, 12, 16): packed sc, mn
    q5_k  as q4_k, q 0..31             qs uint8 (n_rb, G, 5, 16, 4), d and m as q4_k
    q5_0  value = d * (q - 16)         qs uint8 (n_rb, G, 5, 16, 4), d float16 (n_rb, G, 16)
    q5_1  value = d * q + m            qs uint8 (n_rb, G, 5, 16, 4), d, m float16 (n_rb, G, 16)
    f32 / f16 / bf16                   qs (n_rb, K, 16) float32 / float16 / uint16 (bf16 bits)

mxfp4 is the OCP microscaling FP4 of GGUF type MXFP4 (gpt-oss): 4-bit e2m1 codes (sign bit 3)
with one e8m0 power-of-two scale per 32 values.  KV = MXFP4_VALUES is twice the e2m1 value, an
integer in -12..12, and the scale is halved to match (ggml's convention), so the int8 matmul
path multiplies the codes' integers exactly; ``d`` holds the e8m0 bytes, not float16.

q4 / mxfp4 byte [rb, g, c, r, j] holds row rb*16+r: low nibble k = g*32 + c*4 + j, high nibble
k = g*32 + 16 + c*4 + j.  q8 byte [rb, g, c, r, j] holds row rb*16+r, k = g*32 + c*4 + j.
So one 64-byte line (fixed rb, g, c) is 16 rows x 4 consecutive k: one int8 dot-product
lane per output row.

q6_k is GGUF's Q6_K as it is (no requantization): 6-bit codes q in 0..63, an int8 scale ``sc``
per 16 values along k and a float16 ``d`` per 256 (a super-block: 8 groups; n_in % 256 == 0).
Line c = 0..3 of a group, byte [r, j]: bits 0..5 the whole code of k = 4c + j, bits 6..7 the
top 2 bits of the code of k = 16 + 4c + j; line 4 + p (p = 0, 1), byte [r, j]: the low 4 bits
of the code of k = 16 + 4(2p) + j (low nibble) and of k = 16 + 4(2p+1) + j (high nibble).  So
the first 16 codes unpack with one AND and the other 16 with a few shifts and masks.  ``m``
holds the int8 scales: [rb, g, r, s] is the scale of row rb*16+r at k = g*32 + 16s .. +15.
6.5625 bits per weight, as in the GGUF.

q4_k and q5_k are GGUF's Q4_K and Q5_K as they are: 4-bit (5-bit) codes q, per super-block of
256 values a float16 ``d`` and ``dmin`` and, per sub-block of 32 (one group), a 6-bit scale
``sc`` and a 6-bit min ``mn``, packed in 12 bytes as GGUF packs them (``pack_scale_min``).
The value is (d*sc) * q - dmin*mn; both products are exact in float32.  qs lines 0..3 are q4's
(the low 4 bits of each code); q5_k's line 4, byte [r, j], holds bit 4 of the code of
k = 4c + j in bit c and of k = 16 + 4c + j in bit 4 + c (c = 0..3).  ``d`` [rb, b, 0, r] is the
d of row rb*16+r in super-block b, [rb, b, 1, r] its dmin; ``m`` [rb, b, i, r] is packed byte i
of that row and super-block.  4.5 (5.5) bits per weight, as in the GGUF.

q5_0 and q5_1 are GGUF's Q5_0 and Q5_1 as they are: 5-bit codes q (0..31) with q4_0's and
q4_1's scales, one float16 ``d`` (and ``m``) per group of 32.  qs is q5_k's: lines 0..3 hold the
low 4 bits as q4 does, line 4 the fifth bits (bit c of byte [r, j]: k = 4c + j; bit 4 + c:
k = 16 + 4c + j).  5.5 (6) bits per weight, as in the GGUF.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GROUP = 32
ROWS = 16
INT_KINDS = ("q4_0", "q4_1", "q8_0", "mxfp4", "q6_k", "q4_k", "q5_k", "q5_0", "q5_1")
Q5_KINDS = ("q5_k", "q5_0", "q5_1")  # 5-bit codes: q4's 4 lines + a line of fifth bits
K_KINDS = ("q6_k", "q4_k", "q5_k")  # n_in in whole super-blocks of QK_K
QK_K = 256  # k-quants: values per super-block (one d)
FLOAT_KINDS = ("f32", "f16", "bf16")
KINDS = INT_KINDS + FLOAT_KINDS


# twice the e2m1 value of each 4-bit code (ggml's kvalues_mxfp4)
MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)


def e8m0_half(e: np.ndarray) -> np.ndarray:
    """e8m0 exponent bytes -> 2^(e-128) as float32, exact for every byte (ggml's
    GGML_E8M0_TO_FP32_HALF: e < 2 gives a subnormal, 255 gives 2^127)."""
    e = np.asarray(e, np.uint8).astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - 1) << np.uint32(23)).astype(np.uint32)
    return bits.view(np.float32)


# ============================================================================ containers


@dataclass(eq=False)
class QWeight:
    """A weight matrix (n_out, n_in) in a native kind, repacked for the kernels."""

    kind: str
    n_out: int
    n_in: int
    qs: np.ndarray
    d: np.ndarray | None = None
    m: np.ndarray | None = None
    source_type: str = ""  # the GGUF type it came from, e.g. "Q4_K"

    @property
    def n_rb(self) -> int:
        return (self.n_out + ROWS - 1) // ROWS

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.qs, self.d, self.m) if a is not None)

    def __repr__(self) -> str:
        src = f", from {self.source_type}" if self.source_type else ""
        return f"QWeight({self.kind}, {self.n_out}x{self.n_in}{src})"


@dataclass(eq=False)
class QAct:
    """Activation rows quantized to int8 per group of 32 (shared by the matmuls that read them)."""

    qa: np.ndarray  # (M, K) int8
    da: np.ndarray  # (M, G) float32   scale per group
    asum: np.ndarray  # (M, G) int32   sum of the group's int8 values
    sa: np.ndarray  # (M, G) float32   da * asum

    @staticmethod
    def empty(M: int, K: int) -> QAct:
        G = K // GROUP
        return QAct(
            np.zeros((M, K), np.int8),
            np.zeros((M, G), np.float32),
            np.zeros((M, G), np.int32),
            np.zeros((M, G), np.float32),
        )

    def rows(self, m: int) -> QAct:
        """The first m rows (views), for scratch buffers sized for the largest batch."""
        return QAct(self.qa[:m], self.da[:m], self.asum[:m], self.sa[:m])


# ============================================================================ packing


def _pad_rows(a: np.ndarray, n_rb: int) -> np.ndarray:
    n = a.shape[0]
    if n == n_rb * ROWS:
        return a
    pad = np.zeros((n_rb * ROWS - n,) + a.shape[1:], dtype=a.dtype)
    return np.concatenate([a, pad], axis=0)


def _check_k(n_in: int) -> None:
    if n_in % GROUP:
        raise ValueError(f"quantized weights need n_in divisible by {GROUP}, got {n_in}")


def pack_q4(
    kind: str, q: np.ndarray, d: np.ndarray, m: np.ndarray | None = None, source_type: str = ""
) -> QWeight:
    """q (n_out, K) uint8 nibbles 0..15, d (n_out, G) float16 [, m (n_out, G) float16] -> QWeight."""
    assert kind in ("q4_0", "q4_1")
    n_out, K = q.shape
    _check_k(K)
    G = K // GROUP
    n_rb = (n_out + ROWS - 1) // ROWS
    q = _pad_rows(np.asarray(q, dtype=np.uint8), n_rb).reshape(n_rb, ROWS, G, 2, 4, 4)
    # axes: rb, r, g, half (lo/hi), c, j  ->  rb, g, c, r, j  (lo | hi << 4)
    lo = q[:, :, :, 0].transpose(0, 2, 3, 1, 4)
    hi = q[:, :, :, 1].transpose(0, 2, 3, 1, 4)
    qs = np.ascontiguousarray(lo | (hi << 4))
    dd = np.ascontiguousarray(
        _pad_rows(np.asarray(d, np.float16), n_rb).reshape(n_rb, ROWS, G).transpose(0, 2, 1)
    )
    mm = None
    if kind == "q4_1":
        mm = np.ascontiguousarray(
            _pad_rows(np.asarray(m, np.float16), n_rb).reshape(n_rb, ROWS, G).transpose(0, 2, 1)
        )
    return QWeight(kind, n_out, K, qs, dd, mm, source_type)


def _bit4_line(q: np.ndarray, n_rb: int) -> np.ndarray:
    """Codes q (n_out, K) 0..31 -> the line of their fifth bits (n_rb, G, 1, 16, 4): byte [r, j]
    bit c <- bit 4 of k = 4c + j, bit 4 + c <- of k = 16 + 4c + j (c = 0..3)."""
    G = q.shape[1] // GROUP
    t = (_pad_rows(q, n_rb) >> 4).reshape(n_rb, ROWS, G, 2, 4, 4).astype(np.uint8)
    t = t.transpose(0, 2, 4, 1, 5, 3)  # (rb, g, c, r, j, half)
    sh = np.arange(4, dtype=np.uint8)[:, None, None, None] + 4 * np.arange(2, dtype=np.uint8)
    bits = (t << sh).sum(axis=(2, 5), dtype=np.uint16).astype(np.uint8)  # (rb, g, r, j)
    return bits[:, :, None]


def _bit4_codes(qs: np.ndarray) -> np.ndarray:
    """The fifth bits of line 4 of a 5-line qs (n_rb, G, 5, 16, 4) -> (n_rb * 16, G * 32) 0 / 16."""
    n_rb, G = qs.shape[:2]
    h = qs[:, :, 4].transpose(0, 2, 1, 3)  # (rb, r, g, j)
    sh = np.arange(8, dtype=np.uint8).reshape(2, 4, 1)  # (half, c, j): bit 4*half + c
    hb = (h[:, :, :, None, None, :] >> sh) & 1  # (rb, r, g, half, c, j)
    return (hb.reshape(n_rb * ROWS, G * GROUP) << 4).astype(np.uint8)


def pack_q5(
    kind: str, q: np.ndarray, d: np.ndarray, m: np.ndarray | None = None, source_type: str = ""
) -> QWeight:
    """q (n_out, K) uint8 codes 0..31, d (n_out, G) float16 [, m (n_out, G) float16] -> q5_0 /
    q5_1 QWeight (q4_0's / q4_1's layout of the low 4 bits, plus the line of fifth bits)."""
    assert kind in ("q5_0", "q5_1")
    q = np.asarray(q, np.uint8)
    w = pack_q4("q4_1" if kind == "q5_1" else "q4_0", q & 15, d, m, source_type)
    qs = np.ascontiguousarray(np.concatenate([w.qs, _bit4_line(q, w.n_rb)], axis=2))
    return QWeight(kind, w.n_out, w.n_in, qs, w.d, w.m, source_type)


def pack_mxfp4(codes: np.ndarray, e: np.ndarray, source_type: str = "") -> QWeight:
    """codes (n_out, K) uint8 0..15 (e2m1, sign in bit 3), e (n_out, G) uint8 e8m0 -> QWeight mxfp4."""
    w = pack_q4("q4_0", codes, np.zeros(np.shape(e), np.float16), None, source_type)
    n_rb, G = w.n_rb, w.n_in // GROUP
    ee = np.ascontiguousarray(
        _pad_rows(np.asarray(e, np.uint8), n_rb).reshape(n_rb, ROWS, G).transpose(0, 2, 1)
    )
    return QWeight("mxfp4", w.n_out, w.n_in, w.qs, ee, None, source_type)


def pack_q6k(q: np.ndarray, sc: np.ndarray, d: np.ndarray, source_type: str = "") -> QWeight:
    """q (n_out, K) uint8 codes 0..63, sc (n_out, K/16) int8, d (n_out, K/256) float16 -> q6_k."""
    n_out, K = q.shape
    if K % QK_K:
        raise ValueError(f"q6_k weights need n_in divisible by {QK_K}, got {K}")
    G = K // GROUP
    n_rb = (n_out + ROWS - 1) // ROWS
    q = _pad_rows(np.asarray(q, dtype=np.uint8), n_rb).reshape(n_rb, ROWS, G, 2, 4, 4)
    q = q.transpose(0, 2, 3, 4, 1, 5)  # (rb, g, s, c, r, j)
    a, b = q[:, :, 0], q[:, :, 1]  # (rb, g, c, r, j): k = 4c + j, 16 + 4c + j
    x = a | ((b >> 4) << 6)  # lines 0..3
    y = (b[:, :, 0::2] & 15) | ((b[:, :, 1::2] & 15) << 4)  # lines 4, 5: c = 2p, 2p + 1
    qs = np.ascontiguousarray(np.concatenate([x, y], axis=2))
    ss = _pad_rows(np.asarray(sc, np.int8), n_rb).reshape(n_rb, ROWS, G, 2).transpose(0, 2, 1, 3)
    dd = (
        _pad_rows(np.asarray(d, np.float16), n_rb).reshape(n_rb, ROWS, K // QK_K).transpose(0, 2, 1)
    )
    return QWeight(
        "q6_k", n_out, K, qs, np.ascontiguousarray(dd), np.ascontiguousarray(ss), source_type
    )


def q6k_codes(w: QWeight):
    """A q6_k QWeight -> q (n_out, K) uint8 0..63, sc (n_out, K/16) int8, d (n_out, K/256) float16."""
    n_rb, G = w.qs.shape[:2]
    qs = w.qs.reshape(n_rb, G, 6, ROWS, 4)
    x, y = qs[:, :, :4], qs[:, :, 4:]  # (rb, g, 4, r, j), (rb, g, 2, r, j)
    low_b = np.stack([y & 15, y >> 4], axis=3).reshape(x.shape)  # c = 2p + (high nibble)
    q = np.stack([x & 63, low_b | ((x >> 6) << 4)], axis=2)  # (rb, g, s, c, r, j)
    q = q.transpose(0, 4, 1, 2, 3, 5).reshape(n_rb * ROWS, G * GROUP)
    sc = w.m.transpose(0, 2, 1, 3).reshape(n_rb * ROWS, G * 2)
    d = w.d.transpose(0, 2, 1).reshape(n_rb * ROWS, G // 8)
    return q[: w.n_out], sc[: w.n_out], d[: w.n_out]


def pack_scale_min(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """8 six-bit scales and 8 six-bit mins -> GGUF's 12 packed bytes: (..., 8) x 2 -> (..., 12).

    Bytes 0..3: sc[0..3] | top 2 bits of sc[4..7] << 6; 4..7: mn[0..3] | top 2 bits of mn[4..7]
    << 6; 8..11: low 4 bits of sc[4..7] | low 4 bits of mn[4..7] << 4."""
    sc = np.asarray(sc, np.uint8)
    mn = np.asarray(mn, np.uint8)
    a = (sc[..., :4] & 63) | ((sc[..., 4:] >> 4) << 6)
    b = (mn[..., :4] & 63) | ((mn[..., 4:] >> 4) << 6)
    c = (sc[..., 4:] & 15) | ((mn[..., 4:] & 15) << 4)
    return np.concatenate([a, b, c], axis=-1).astype(np.uint8)


def unpack_scale_min(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """GGUF's 12 packed bytes -> 8 six-bit scales and 8 six-bit mins: (..., 12) -> 2 x (..., 8)."""
    a, m, hi = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = np.concatenate([a & 63, (hi & 15) | ((a >> 6) << 4)], axis=-1)
    mn = np.concatenate([m & 63, (hi >> 4) | ((m >> 6) << 4)], axis=-1)
    return sc, mn


def pack_qk(
    kind: str,
    q: np.ndarray,
    scm: np.ndarray,
    d: np.ndarray,
    dmin: np.ndarray,
    source_type: str = "",
) -> QWeight:
    """q4_k / q5_k: q (n_out, K) uint8 codes (0..15 / 0..31), scm (n_out, K/256, 12) uint8 packed
    scales and mins (pack_scale_min), d, dmin (n_out, K/256) float16 -> QWeight."""
    assert kind in ("q4_k", "q5_k")
    n_out, K = q.shape
    if K % QK_K:
        raise ValueError(f"{kind} weights need n_in divisible by {QK_K}, got {K}")
    q = np.asarray(q, np.uint8)
    w = pack_q4("q4_0", q & 15, np.zeros((n_out, K // GROUP), np.float16))
    n_rb, nb = w.n_rb, K // QK_K
    qs = w.qs
    if kind == "q5_k":  # line 4: the fifth bits (_bit4_line)
        qs = np.ascontiguousarray(np.concatenate([qs, _bit4_line(q, n_rb)], axis=2))
    dd = np.stack(
        [_pad_rows(np.asarray(d, np.float16), n_rb), _pad_rows(np.asarray(dmin, np.float16), n_rb)],
        axis=1,
    )  # (n_rb*16, 2, nb)
    dd = np.ascontiguousarray(dd.reshape(n_rb, ROWS, 2, nb).transpose(0, 3, 2, 1))
    ss = _pad_rows(np.asarray(scm, np.uint8).reshape(n_out, nb, 12), n_rb)
    ss = np.ascontiguousarray(ss.reshape(n_rb, ROWS, nb, 12).transpose(0, 2, 3, 1))
    return QWeight(kind, n_out, K, qs, dd, ss, source_type)


def codes(w: QWeight) -> np.ndarray:
    """The codes of a q4_0 / q4_1 / mxfp4 / q4_k (0..15) or q5_k / q5_0 / q5_1 (0..31) QWeight
    in element order: (n_out, n_in) uint8."""
    n_rb, G = w.qs.shape[:2]
    b = w.qs.reshape(n_rb, G, -1, ROWS, 4)
    x = b[:, :, :4].transpose(0, 3, 1, 2, 4).reshape(n_rb * ROWS, G, 16)  # (row, g, c*4+j)
    q = np.concatenate([x & 15, x >> 4], axis=2).reshape(n_rb * ROWS, G * GROUP)  # (row, k)
    if w.kind in Q5_KINDS:
        q = q | _bit4_codes(w.qs)
    return np.ascontiguousarray(q[: w.n_out])


def qk_codes(w: QWeight):
    """A q4_k / q5_k QWeight -> q (n_out, K) uint8 codes, sc, mn (n_out, K/32) uint8,
    d, dmin (n_out, K/256) float16."""
    n_rb, G = w.qs.shape[:2]
    q = codes(w)
    scm = w.m.transpose(0, 3, 1, 2).reshape(n_rb * ROWS, G // 8, 12)
    sc, mn = unpack_scale_min(scm)
    d = w.d.transpose(0, 3, 2, 1).reshape(n_rb * ROWS, 2, G // 8)
    n = w.n_out
    return (q, sc.reshape(-1, G)[:n], mn.reshape(-1, G)[:n], d[:n, 0], d[:n, 1])


def pack_q8(q: np.ndarray, d: np.ndarray, source_type: str = "") -> QWeight:
    """q (n_out, K) int8, d (n_out, G) float16 -> QWeight q8_0."""
    n_out, K = q.shape
    _check_k(K)
    G = K // GROUP
    n_rb = (n_out + ROWS - 1) // ROWS
    q = _pad_rows(np.asarray(q, dtype=np.int8), n_rb).reshape(n_rb, ROWS, G, 8, 4)
    qs = np.ascontiguousarray(q.transpose(0, 2, 3, 1, 4))
    dd = np.ascontiguousarray(
        _pad_rows(np.asarray(d, np.float16), n_rb).reshape(n_rb, ROWS, G).transpose(0, 2, 1)
    )
    return QWeight("q8_0", n_out, K, qs, dd, None, source_type)


def pack_float(kind: str, w: np.ndarray, source_type: str = "") -> QWeight:
    """w (n_out, K) float32 / float16 / uint16 (bf16 bits) -> QWeight of that kind."""
    dtype = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}[kind]
    w = np.asarray(w)
    if w.dtype != dtype:
        raise TypeError(f"pack_float({kind!r}) needs {np.dtype(dtype)}, got {w.dtype}")
    n_out, K = w.shape
    n_rb = (n_out + ROWS - 1) // ROWS
    qs = np.ascontiguousarray(_pad_rows(w, n_rb).reshape(n_rb, ROWS, K).transpose(0, 2, 1))
    return QWeight(kind, n_out, K, qs, None, None, source_type)


# ============================================================================ quantization of float weights


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits (uint16), round to nearest even."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def quantize_weight(w: np.ndarray, kind: str, source_type: str = "F32") -> QWeight:
    """Float weights (n_out, K) -> QWeight of ``kind`` (ggml's rounding rules for q4_0/q4_1/q8_0)."""
    w = np.asarray(w, dtype=np.float32)
    if kind == "f32":
        return pack_float("f32", w, source_type)
    if kind == "f16":
        return pack_float("f16", w.astype(np.float16), source_type)
    if kind == "bf16":
        return pack_float("bf16", f32_to_bf16_bits(w), source_type)
    n_out, K = w.shape
    _check_k(K)
    G = K // GROUP
    wg = w.reshape(n_out, G, GROUP)
    if kind == "q4_0":
        idx = np.abs(wg).argmax(axis=2)
        mx = np.take_along_axis(wg, idx[..., None], axis=2)[..., 0]
        d = (mx / -8.0).astype(np.float32)
        with np.errstate(divide="ignore", invalid="ignore"):
            inv = np.where(d != 0, 1.0 / d, 0.0).astype(np.float32)
        q = np.clip(np.floor(wg * inv[..., None] + 8.5), 0, 15).astype(np.uint8)
        return pack_q4("q4_0", q.reshape(n_out, K), d.astype(np.float16), None, source_type)
    if kind == "q4_1":
        mn = wg.min(axis=2)
        mx = wg.max(axis=2)
        d = ((mx - mn) / 15.0).astype(np.float32)
        with np.errstate(divide="ignore", invalid="ignore"):
            inv = np.where(d != 0, 1.0 / d, 0.0).astype(np.float32)
        q = np.clip(np.floor((wg - mn[..., None]) * inv[..., None] + 0.5), 0, 15).astype(np.uint8)
        return pack_q4(
            "q4_1", q.reshape(n_out, K), d.astype(np.float16), mn.astype(np.float16), source_type
        )
    if kind == "q5_0":  # as q4_0 with 16 levels a side (gguf-py's quantize_blocks)
        idx = np.abs(wg).argmax(axis=2)
        mx = np.take_along_axis(wg, idx[..., None], axis=2)[..., 0]
        d = (mx / -16.0).astype(np.float32)
        with np.errstate(divide="ignore", invalid="ignore"):
            inv = np.where(d != 0, 1.0 / d, 0.0).astype(np.float32)
        q = np.clip(np.trunc(wg * inv[..., None] + np.float32(16.5)), 0, 31).astype(np.uint8)
        return pack_q5("q5_0", q.reshape(n_out, K), d.astype(np.float16), None, source_type)
    if kind == "q5_1":  # as q4_1 with 32 levels
        mn = wg.min(axis=2)
        mx = wg.max(axis=2)
        d = ((mx - mn) / 31.0).astype(np.float32)
        with np.errstate(divide="ignore", invalid="ignore"):
            inv = np.where(d != 0, 1.0 / d, 0.0).astype(np.float32)
        q = np.clip(np.trunc((wg - mn[..., None]) * inv[..., None] + np.float32(0.5)), 0, 31)
        return pack_q5(
            "q5_1",
            q.astype(np.uint8).reshape(n_out, K),
            d.astype(np.float16),
            mn.astype(np.float16),
            source_type,
        )
    if kind == "q8_0":
        amax = np.abs(wg).max(axis=2)
        d = (amax / 127.0).astype(np.float32)
        with np.errstate(divide="ignore", invalid="ignore"):
            inv = np.where(d != 0, 1.0 / d, 0.0).astype(np.float32)
        q = np.clip(np.rint(wg * inv[..., None]), -127, 127).astype(np.int8)
        return pack_q8(q.reshape(n_out, K), d.astype(np.float16), source_type)
    if kind == "mxfp4":  # gguf-py's rule: e = floor(log2 amax) - 2 + 127, nearest value
        amax = np.abs(wg).max(axis=2)
        with np.errstate(divide="ignore"):
            e = np.where(amax > 0, np.floor(np.log2(amax)) - 2 + 127, 0)
        e = np.clip(e, 0, 255).astype(np.uint8)
        vals = e8m0_half(e)[..., None, None] * MXFP4_VALUES.astype(np.float32)  # (n_out, G, 1, 16)
        codes = np.abs(vals - wg[..., None]).argmin(axis=3).astype(np.uint8)
        return pack_mxfp4(codes.reshape(n_out, K), e, source_type)
    if kind == "q6_k":  # a simple rule (not llama.cpp's search): per 16 s = amax/32, sc = rint(s/d)
        if K % QK_K:
            raise ValueError(f"q6_k weights need n_in divisible by {QK_K}, got {K}")
        w16 = w.reshape(n_out, K // 16, 16)
        s = np.abs(w16).max(axis=2) / 32.0  # (n_out, K/16)
        d = (s.reshape(n_out, K // QK_K, 16).max(axis=2) / 127.0).astype(
            np.float16
        )  # (n_out, K/256)
        df = np.repeat(d.astype(np.float32), 16, axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            sc = np.where(df > 0, np.rint(s / df), 0).clip(-128, 127).astype(np.int8)
            eff = (df * sc).astype(np.float32)  # the stored scale of each 16
            q = np.where(eff[..., None] > 0, np.rint(w16 / eff[..., None]) + 32, 32)
        q = np.clip(q, 0, 63).astype(np.uint8).reshape(n_out, K)
        return pack_q6k(q, sc, d, source_type)
    if kind in (
        "q4_k",
        "q5_k",
    ):  # a simple rule (not llama.cpp's search): per 32 min/max, 6-bit sc, mn
        if K % QK_K:
            raise ValueError(f"{kind} weights need n_in divisible by {QK_K}, got {K}")
        nq = 15 if kind == "q4_k" else 31
        lo = np.minimum(wg.min(axis=2), 0.0)  # (n_out, G)
        scale = (wg.max(axis=2) - lo) / nq
        sb = lambda a: a.reshape(n_out, K // QK_K, 8)  # noqa: E731  (super-block, sub-block)
        d = (sb(scale).max(axis=2) / 63).astype(np.float16)  # (n_out, K/256)
        dmin = (sb(-lo).max(axis=2) / 63).astype(np.float16)
        with np.errstate(divide="ignore", invalid="ignore"):
            sc = np.where(d[..., None] > 0, np.rint(sb(scale) / d.astype(np.float32)[..., None]), 0)
            mn = np.where(
                dmin[..., None] > 0, np.rint(sb(-lo) / dmin.astype(np.float32)[..., None]), 0
            )
            sc, mn = sc.clip(0, 63).astype(np.uint8), mn.clip(0, 63).astype(np.uint8)
            ds = (d.astype(np.float32)[..., None] * sc).reshape(n_out, G)
            dm = (dmin.astype(np.float32)[..., None] * mn).reshape(n_out, G)
            q = np.where(ds[..., None] > 0, np.rint((wg + dm[..., None]) / ds[..., None]), 0)
        q = np.clip(q, 0, nq).astype(np.uint8).reshape(n_out, K)
        return pack_qk(kind, q, pack_scale_min(sc, mn), d, dmin, source_type)
    raise ValueError(f"unknown weight kind {kind!r}; known: {', '.join(KINDS)}")


def concat_rows(ws: list[QWeight]) -> QWeight | None:
    """Stack weights that read the same input (q/k/v, gate/up) into one matmul.

    Rows are independent, so the fused matmul gives the same bits as the separate ones.
    Returns None when they cannot be fused (different kinds, or a row count that is not a
    multiple of 16 before the last one, which would put padding rows in the middle).
    """
    if len({w.kind for w in ws}) != 1 or len({w.n_in for w in ws}) != 1:
        return None
    if any(w.n_out % ROWS for w in ws[:-1]):
        return None
    cat = lambda arrs: None if arrs[0] is None else np.concatenate(arrs, axis=0)  # noqa: E731
    src = "+".join(sorted({w.source_type for w in ws if w.source_type}))
    return QWeight(
        ws[0].kind,
        sum(w.n_out for w in ws),
        ws[0].n_in,
        cat([w.qs for w in ws]),
        cat([w.d for w in ws]),
        cat([w.m for w in ws]),
        src,
    )
