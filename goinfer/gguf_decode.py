"""Decoding GGUF quantized blocks with NumPy, and requantizing float32 rows to q8_0.

    vals = F32_DECODERS["Q4_K"](b)      # raw blocks uint8 (R, nb, 144) -> float32 (R, nb * 256)
    q, sc, d = q6k_parts(b)             # the exact codes and scales, for the repack paths
    q, scm, d, dmin = qk_parts(b, 5)    # Q5_K (Q4_K: 4): codes, packed scales/mins, d, dmin
    q, d = requant_q8(x)                # float32 (R, K) -> int8 codes (R, K), float16 scales (R, K/32)

The formulas of every type are in docs/design/gguf.md ("Conversions"); goinfer/gguf.py uses these
to load a tensor in its native kind.
"""

from __future__ import annotations

import numpy as np

from goinfer.quant import GROUP, MXFP4_VALUES, e8m0_half, unpack_scale_min

__all__ = [
    "QK_K",
    "F32_DECODERS",
    "PLAIN_DTYPES",
    "f16_at",
    "nibbles32",
    "q5_codes",
    "q4k_parts",
    "qk_parts",
    "q6k_parts",
    "requant_q8",
]

QK_K = 256  # super-block size of the k-quants


# ============================================================================ block decoders
# Each takes raw blocks b: uint8 (R, nb, type_size), R rows of nb blocks, and returns values
# in natural element order along the row.  "_codes" decoders return integer codes + per-32
# scales for the exact paths; "_f32" decoders return float32 (R, nb * block_size).


def f16_at(b: np.ndarray, lo: int) -> np.ndarray:
    """float16 at byte lo of every block: (R, nb, ts) uint8 -> (R, nb) float16."""
    return np.ascontiguousarray(b[..., lo : lo + 2]).view(np.float16)[..., 0]


def nibbles32(qs: np.ndarray) -> np.ndarray:
    """16 bytes -> 32 codes, byte j holding code j (low nibble) and j+16 (high): (..., 16) -> (..., 32)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def q5_codes(b: np.ndarray, qh_at: int, qs_at: int) -> np.ndarray:
    """5-bit codes 0..31 of Q5_0/Q5_1: (R, nb, ts) -> (R, nb, 32) uint8."""
    qh = np.ascontiguousarray(b[..., qh_at : qh_at + 4]).view("<u4")  # (R, nb, 1)
    hi = ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(
        np.uint8
    )  # (R, nb, 32), bit j -> code j
    return nibbles32(b[..., qs_at : qs_at + 16]) | (hi << 4)


def qk_parts(b: np.ndarray, bits: int):
    """Q4_K (bits 4) / Q5_K (bits 5) -> codes (R, nb, 256) uint8 in element order, packed scales
    and mins (R, nb, 12) uint8 (as stored), d, dmin (R, nb) float16."""
    # Q4_K: d (0:2), dmin (2:4), scales (4:16), qs (16:144); Q5_K: qh (16:48) before qs (48:176)
    at = 16 if bits == 4 else 48
    qs = b[..., at : at + 128].reshape(b.shape[:-1] + (4, 32))  # 4 chunks of 32 bytes
    q = np.stack([qs & 0x0F, qs >> 4], axis=-2).reshape(
        b.shape[:-1] + (8, 32)
    )  # sub-block 2c + half
    if bits == 5:  # bit s of qh[l] is the 5th bit of sub-block s, element l
        qh = b[..., 16:48]
        q = q | (((qh[..., None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & 1) << 4)
    return (
        q.reshape(b.shape[:-1] + (256,)),
        np.ascontiguousarray(b[..., 4:16]),
        f16_at(b, 0),
        f16_at(b, 2),
    )


def q4k_parts(b: np.ndarray):
    """Q4_K -> codes (R, nb, 8, 32) uint8, d*sc (R, nb, 8) f32, dmin*mn (R, nb, 8) f32."""
    q, scm, d, dmin = qk_parts(b, 4)
    sc, mn = unpack_scale_min(scm)
    return (
        q.reshape(b.shape[:-1] + (8, 32)),
        d.astype(np.float32)[..., None] * sc.astype(np.float32),
        dmin.astype(np.float32)[..., None] * mn.astype(np.float32),
    )


def _f32_q4_0(b):
    d = f16_at(b, 0).astype(np.float32)[..., None]
    q = nibbles32(b[..., 2:18]).astype(np.float32) - 8.0
    return q * d


def _f32_q4_1(b):
    d = f16_at(b, 0).astype(np.float32)[..., None]
    m = f16_at(b, 2).astype(np.float32)[..., None]
    return nibbles32(b[..., 4:20]).astype(np.float32) * d + m


def _f32_q5_0(b):
    d = f16_at(b, 0).astype(np.float32)[..., None]
    return (q5_codes(b, 2, 6).astype(np.float32) - 16.0) * d


def _f32_q5_1(b):
    d = f16_at(b, 0).astype(np.float32)[..., None]
    m = f16_at(b, 2).astype(np.float32)[..., None]
    return q5_codes(b, 4, 8).astype(np.float32) * d + m


def _f32_q8_0(b):
    d = f16_at(b, 0).astype(np.float32)[..., None]
    return b[..., 2:34].view(np.int8).astype(np.float32) * d


def _f32_mxfp4(b):  # e8m0 byte, then 16 bytes of 4-bit codes (low nibble j, high j+16)
    d = e8m0_half(b[..., 0])[..., None]
    return MXFP4_VALUES[nibbles32(b[..., 1:17]).astype(np.int64)].astype(np.float32) * d


def _f32_q2_k(b):
    # scales (0:16), qs (16:80), d (80:82), dmin (82:84); element e uses scale byte e // 16
    s = b[..., 0:16]
    dl = f16_at(b, 80).astype(np.float32)[..., None] * (s & 15).astype(np.float32)  # (R, nb, 16)
    ml = f16_at(b, 82).astype(np.float32)[..., None] * (s >> 4).astype(np.float32)
    qs = b[..., 16:80].reshape(b.shape[:-1] + (2, 1, 32))  # 2 halves of 32 bytes
    q = (
        qs >> np.array([0, 2, 4, 6], np.uint8)[:, None]
    ) & 3  # (R, nb, 2, 4, 32): e = 128h + 32j + l
    q = q.reshape(b.shape[:-1] + (16, 16)).astype(np.float32)
    return (dl[..., None] * q - ml[..., None]).reshape(b.shape[:-1] + (QK_K,))


def _f32_q3_k(b):
    # hmask (0:32), qs (32:96), scales (96:108), d (108:110); element e uses scale e // 16
    hm = b[..., 0:32]
    s = b[..., 96:108]
    lo, hi = s[..., 0:8], s[..., 8:12]
    low4 = np.concatenate([lo & 15, lo >> 4], axis=-1)  # (R, nb, 16): scales 0..7, 8..15
    high2 = (hi[..., None, :] >> np.array([0, 2, 4, 6], np.uint8)[:, None]) & 3  # (R, nb, 4, 4)
    sc = (low4 | (high2.reshape(b.shape[:-1] + (16,)) << 4)).astype(np.float32) - 32.0
    dl = f16_at(b, 108).astype(np.float32)[..., None] * sc  # (R, nb, 16)
    qs = b[..., 32:96].reshape(b.shape[:-1] + (2, 1, 32))
    q = ((qs >> np.array([0, 2, 4, 6], np.uint8)[:, None]) & 3).astype(np.int8)  # (R, nb, 2, 4, 32)
    bit = (
        hm[..., None, :] >> np.arange(8, dtype=np.uint8)[:, None]
    ) & 1  # (R, nb, 8, 32): bit 4h+j
    q = q - ((1 - bit.reshape(q.shape)).astype(np.int8) << 2)  # subtract 4 where the bit is clear
    q = q.reshape(b.shape[:-1] + (16, 16)).astype(np.float32)
    return (dl[..., None] * q).reshape(b.shape[:-1] + (QK_K,))


def _f32_q4_k(b):
    q, dsc, dmn = q4k_parts(b)
    return (dsc[..., None] * q.astype(np.float32) - dmn[..., None]).reshape(b.shape[:-1] + (QK_K,))


def _f32_q5_k(b):
    q, scm, d, dmin = qk_parts(b, 5)
    sc, mn = unpack_scale_min(scm)
    dsc = (d.astype(np.float32)[..., None] * sc.astype(np.float32))[..., None]
    dmn = (dmin.astype(np.float32)[..., None] * mn.astype(np.float32))[..., None]
    q = q.reshape(b.shape[:-1] + (8, 32))
    return (dsc * q.astype(np.float32) - dmn).reshape(b.shape[:-1] + (QK_K,))


def q6k_parts(b: np.ndarray):
    """Q6_K -> codes (R, nb, 256) uint8 0..63 in element order, int8 scales (R, nb, 16) (element
    e uses scale e // 16), d (R, nb) float16."""
    # ql (0:128), qh (128:192), scales int8 (192:208), d (208:210)
    ql = b[..., 0:128].reshape(b.shape[:-1] + (2, 2, 32))  # (h, a, l): bytes 64h + 32a + l
    qh = b[..., 128:192].reshape(b.shape[:-1] + (2, 1, 32))  # (h, ., l)
    nib = np.concatenate([ql & 0x0F, ql >> 4], axis=-2)  # (R, nb, 2, 4, 32): i = 2*(hi nibble) + a
    top = (qh >> np.array([0, 2, 4, 6], np.uint8)[:, None]) & 3  # (R, nb, 2, 4, 32): bits 2i
    q = (nib | (top << 4)).reshape(b.shape[:-1] + (QK_K,))  # e = 128h + 32i + l
    return q, np.ascontiguousarray(b[..., 192:208]).view(np.int8), f16_at(b, 208)


def _f32_q6_k(b):
    q, sc, d = q6k_parts(b)
    dl = d.astype(np.float32)[..., None] * sc.astype(np.float32)  # (R, nb, 16)
    q = q.astype(np.float32).reshape(b.shape[:-1] + (16, 16)) - 32.0
    return (dl[..., None] * q).reshape(b.shape[:-1] + (QK_K,))


def _f32_q8_k(b):
    d = np.ascontiguousarray(b[..., 0:4]).view("<f4")  # (R, nb, 1)
    return b[..., 4:260].view(np.int8).astype(np.float32) * d


F32_DECODERS = {
    "Q4_0": _f32_q4_0,
    "Q4_1": _f32_q4_1,
    "Q5_0": _f32_q5_0,
    "Q5_1": _f32_q5_1,
    "Q8_0": _f32_q8_0,
    "MXFP4": _f32_mxfp4,
    "Q2_K": _f32_q2_k,
    "Q3_K": _f32_q3_k,
    "Q4_K": _f32_q4_k,
    "Q5_K": _f32_q5_k,
    "Q6_K": _f32_q6_k,
    "Q8_K": _f32_q8_k,
}
PLAIN_DTYPES = {
    "F32": "<f4",
    "F16": "<f2",
    "F64": "<f8",
    "I8": "i1",
    "I16": "<i2",
    "I32": "<i4",
    "I64": "<i8",
}


# ============================================================================ requantization


_F16_MAX = float(np.finfo(np.float16).max)


def requant_q8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 (R, K) -> int8 codes (R, K), float16 scales (R, K/32).

    Per group of 32: d = float16(amax / 127) (clamped to the largest finite float16),
    q = clip(rint(x / d), -127, 127), with d the float16 value actually stored, so
    |x - d*q| <= d/2 (a clipped code is off by at most amax * 2^-11 < d/2).
    """
    R, K = x.shape
    xg = x.reshape(R, K // GROUP, GROUP)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        amax = np.abs(xg).max(axis=2)  # (R, G)
        d16 = np.minimum(amax / np.float32(127.0), np.float32(_F16_MAX)).astype(np.float16)
        d = d16.astype(np.float32)
        q = np.rint(xg / d[..., None])
    q = np.where(np.isfinite(q), q, 0.0)  # d == 0 or non-finite data: code 0
    q = np.clip(q, -127, 127).astype(np.int8)
    return q.reshape(R, K), d16
