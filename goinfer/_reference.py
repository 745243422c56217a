"""NumPy reference of every kernel: slow, obvious, used by the tests.

Each function here has the same signature and meaning as its compiled counterpart in
``goinfer._kernels`` (the ``nthreads`` and ``out`` arguments are accepted and ignored or
honoured so the two are interchangeable).  The compiled kernels are tested against these
over many shapes and thread counts; see docs/design/kernels.md for the exact contracts.

Numbers here are computed in float64 where the kernel's contract allows a tolerance, and
with the kernel's own float32 operation sequence where the contract is bit-exact
(activation quantization, RMSNorm).
"""

from __future__ import annotations

import math

import numpy as np

from goinfer.quant import (
    GROUP,
    INT_KINDS,
    MXFP4_VALUES,
    ROWS,
    QAct,
    QWeight,
    codes,
    e8m0_half,
    q6k_codes,
    qk_codes,
)

# ============================================================================ weights


def dequantize(w: QWeight) -> np.ndarray:
    """Repacked weight -> dense float32 (n_out, n_in), the values the matmul multiplies by."""
    n_rb = w.n_rb
    if w.kind in ("f32", "f16", "bf16"):
        # qs: (n_rb, K, 16) -> (n_rb*16, K)
        raw = w.qs
        if w.kind == "bf16":
            vals = (raw.astype(np.uint32) << 16).view(np.float32)
        else:
            vals = raw.astype(np.float32)
        dense = vals.transpose(0, 2, 1).reshape(n_rb * ROWS, w.n_in)
        return np.ascontiguousarray(dense[: w.n_out])
    if w.kind == "q6_k":  # d * sc * (q - 32): every product exact in float32 (<= 11+7+5 bits)
        q, sc, d = q6k_codes(w)  # (n_out, K), (n_out, K/16), (n_out, K/256)
        dsc = np.repeat(d.astype(np.float32), 16, axis=1) * sc.astype(np.float32)  # (n_out, K/16)
        vals = np.repeat(dsc, 16, axis=1) * (q.astype(np.float32) - 32.0)
        return np.ascontiguousarray(vals, dtype=np.float32)
    if w.kind in ("q4_k", "q5_k"):  # (d*sc) * q - dmin*mn: both products exact in float32
        q, sc, mn, d, dmin = qk_codes(w)  # (n_out, K), (n_out, G) x 2, (n_out, K/256) x 2
        ds = np.repeat(d.astype(np.float32), 8, axis=1) * sc.astype(np.float32)  # (n_out, G)
        dm = np.repeat(dmin.astype(np.float32), 8, axis=1) * mn.astype(np.float32)
        vals = np.repeat(ds, GROUP, axis=1) * q.astype(np.float32) - np.repeat(dm, GROUP, axis=1)
        return np.ascontiguousarray(vals, dtype=np.float32)
    G = w.n_in // GROUP
    if w.kind in ("q5_0", "q5_1"):  # d * (q - 16); d * q + m (two roundings, as q4_1)
        q = codes(w).astype(np.float32).reshape(w.n_out, G, GROUP)  # (n_out, G, 32)
        d = w.d.transpose(0, 2, 1).reshape(n_rb * ROWS, G)[: w.n_out, :, None].astype(np.float32)
        if w.kind == "q5_0":
            vals = (q - 16.0) * d
        else:
            m = w.m.transpose(0, 2, 1).reshape(n_rb * ROWS, G)[: w.n_out, :, None]
            vals = q * d + m.astype(np.float32)
        return np.ascontiguousarray(vals.reshape(w.n_out, w.n_in), dtype=np.float32)
    d = e8m0_half(w.d) if w.kind == "mxfp4" else w.d.astype(np.float32)  # (n_rb, G, 16)
    if w.kind in ("q4_0", "q4_1", "mxfp4"):
        qs = w.qs.reshape(n_rb, G, 4, ROWS, 4)
        lo = qs & 0x0F  # k = c*4 + j
        hi = qs >> 4  # k = 16 + c*4 + j
        # -> (n_rb, G, 16 rows, 32 k)
        lo = lo.transpose(0, 1, 3, 2, 4).reshape(n_rb, G, ROWS, 16)
        hi = hi.transpose(0, 1, 3, 2, 4).reshape(n_rb, G, ROWS, 16)
        q = np.concatenate([lo, hi], axis=3).astype(np.float32)
        if w.kind == "q4_0":
            vals = (q - 8.0) * d[..., None]
        elif w.kind == "mxfp4":
            vals = MXFP4_VALUES[q.astype(np.int64)].astype(np.float32) * d[..., None]
        else:
            vals = q * d[..., None] + w.m.astype(np.float32)[..., None]
    elif w.kind == "q8_0":
        qs = w.qs.view(np.int8).reshape(n_rb, G, 8, ROWS, 4)
        q = qs.transpose(0, 1, 3, 2, 4).reshape(n_rb, G, ROWS, 32).astype(np.float32)
        vals = q * d[..., None]
    else:
        raise ValueError(f"unknown weight kind {w.kind!r}")
    # (n_rb, G, 16, 32) -> (n_rb*16, G*32)
    dense = vals.transpose(0, 2, 1, 3).reshape(n_rb * ROWS, G * GROUP)
    return np.ascontiguousarray(dense[: w.n_out])


# ============================================================================ activations


def quantize_act(x: np.ndarray, out: QAct | None = None, *, nthreads: int = 1) -> QAct:
    """x (M, K) float32 -> int8 per group of 32 with one float32 scale per group.

    Bit-exact contract: amax = max|x| over the group; d = amax / 127; if amax == 0 then
    q = 0, else q = rint(x * (127 / amax)) (round half to even); asum = sum(q);
    sa = d * float(asum).  All in float32.
    """
    x = np.asarray(x, dtype=np.float32)
    M, K = x.shape
    G = K // GROUP
    xg = x.reshape(M, G, GROUP)
    amax = np.abs(xg).max(axis=2)  # (M, G)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127.0) / amax, np.float32(0.0)).astype(np.float32)
    q = np.rint(xg * inv[..., None]).clip(-127, 127).astype(np.int8)
    d = (amax / np.float32(127.0)).astype(np.float32)
    asum = q.astype(np.int32).sum(axis=2, dtype=np.int32)
    sa = (d * asum.astype(np.float32)).astype(np.float32)
    res = QAct(q.reshape(M, K), d, asum, sa)
    if out is not None:
        out.qa[...] = res.qa
        out.da[...] = res.da
        out.asum[...] = res.asum
        out.sa[...] = res.sa
        return out
    return res


def dequantize_act(a: QAct) -> np.ndarray:
    M, K = a.qa.shape
    G = K // GROUP
    return (a.qa.reshape(M, G, GROUP).astype(np.float32) * a.da[..., None]).reshape(M, K)


# ============================================================================ matmul


def matmul(x, w: QWeight, out: np.ndarray | None = None, *, nthreads: int = 1) -> np.ndarray:
    """out (M, n_out) = x (M, K) @ W.T.

    Integer weight kinds (q4_0, q4_1, q8_0, mxfp4, q6_k, q4_k, q5_k, q5_0, q5_1) take a QAct (the activation quantized once
    by quantize_act); float kinds (f32, f16, bf16) take float32 x.  Computed here in float64.
    """
    wd = dequantize(w).astype(np.float64)
    if w.kind in INT_KINDS:
        if not isinstance(x, QAct):
            raise TypeError("integer weights multiply a QAct; call quantize_act first")
        xd = dequantize_act(x).astype(np.float64)
    else:
        xd = np.asarray(x, dtype=np.float64)
    res = (xd @ wd.T).astype(np.float32)
    if out is not None:
        out[...] = res
        return out
    return res


def matmul_experts(
    x, ws, offsets, bias=None, out: np.ndarray | None = None, *, nthreads: int = 1
) -> np.ndarray:
    """Every expert of a layer: out rows [offsets[e], offsets[e+1]) = those rows of x (a QAct or
    float32 rows) @ ws[e].T, + bias[e] (E, n_out) in float32 when given."""
    off = [int(o) for o in np.asarray(offsets)]
    M = x.qa.shape[0] if isinstance(x, QAct) else np.asarray(x).shape[0]
    if (
        len(off) != len(ws) + 1
        or off[0] != 0
        or off[-1] != M
        or any(a > b for a, b in zip(off, off[1:]))
    ):
        raise ValueError(f"offsets must rise from 0 to M = {M} over {len(ws)} experts, got {off}")
    res = np.empty((M, ws[0].n_out), np.float32)
    for e, w in enumerate(ws):
        m0, m1 = off[e], off[e + 1]
        if m1 > m0:
            xe = (
                QAct(x.qa[m0:m1], x.da[m0:m1], x.asum[m0:m1], x.sa[m0:m1])
                if isinstance(x, QAct)
                else x[m0:m1]
            )
            res[m0:m1] = matmul(xe, w)
            if bias is not None:
                res[m0:m1] += np.asarray(bias, np.float32)[e]
    if out is not None:
        out[...] = res
        return out
    return res


def get_rows(w: QWeight, ids, out: np.ndarray | None = None, *, nthreads: int = 1) -> np.ndarray:
    """Embedding lookup: out (T, n_in) = dequantized rows ids of w."""
    res = dequantize(w)[np.asarray(ids, dtype=np.int64)]
    if out is not None:
        out[...] = res
        return out
    return res


# ============================================================================ elementwise


def rmsnorm(x, w, eps: float, out=None, *, nthreads: int = 1):
    """Bit-exact contract: ss = sum of float64(x)^2 in index order; r = float32(1/sqrt(ss/D + eps))
    in float64; out = float32(x * r) * w (two float32 multiplies)."""
    x = np.asarray(x, dtype=np.float32)
    D = x.shape[-1]
    ss = np.zeros(x.shape[:-1], dtype=np.float64)
    x64 = x.astype(np.float64)
    for i in range(D):  # index order, as the kernel does
        ss = ss + x64[..., i] * x64[..., i]
    r = (1.0 / np.sqrt(ss / D + float(eps))).astype(np.float32)
    res = ((x * r[..., None]).astype(np.float32) * np.asarray(w, dtype=np.float32)).astype(
        np.float32
    )
    if out is not None:
        out[...] = res
        return out
    return res


def swiglu(gate, up, out=None, *, nthreads: int = 1):
    """out = silu(gate) * up, silu(g) = g / (1 + exp(-g)).  float64 here; kernel float32."""
    g = np.asarray(gate, dtype=np.float64)
    res = (g / (1.0 + np.exp(-g)) * np.asarray(up, dtype=np.float64)).astype(np.float32)
    if out is not None:
        out[...] = res
        return out
    return res


def swiglu_oai(gate, up, alpha: float, limit: float, out=None, *, nthreads: int = 1):
    """gpt-oss's clamped SwiGLU: x = min(gate, limit), y = clamp(up, -limit, limit),
    out = x * sigmoid(alpha x) * (y + 1).  float64 here (alpha, limit as float32); kernel float32."""
    a, lim = float(np.float32(alpha)), float(np.float32(limit))
    g = np.asarray(gate, dtype=np.float64)
    u = np.asarray(up, dtype=np.float64)
    x = np.where(g > lim, lim, g)
    y = np.where(u > lim, lim, np.where(u < -lim, -lim, u))
    with np.errstate(over="ignore"):
        res = (x / (1.0 + np.exp(-a * x)) * (y + 1.0)).astype(np.float32)
    if out is not None:
        out[...] = res
        return out
    return res


def gelu_tanh_mul(gate, up, out=None, *, nthreads: int = 1):
    """out = gelu_tanh(gate) * up (GeGLU, Gemma)."""
    g = np.asarray(gate, dtype=np.float64)
    c = np.sqrt(2.0 / np.pi)
    gel = 0.5 * g * (1.0 + np.tanh(c * (g + 0.044715 * g**3)))
    res = (gel * np.asarray(up, dtype=np.float64)).astype(np.float32)
    if out is not None:
        out[...] = res
        return out
    return res


GATED = {"swiglu": swiglu, "gelu_tanh_mul": gelu_tanh_mul}  # quantize_gated's act names


def quantize_gated(gate, up, act: str = "swiglu", out: QAct | None = None, *, nthreads: int = 1):
    """QAct of the gated activation act(gate) * up (act: "swiglu" or "gelu_tanh_mul"):
    quantize_act of that product (the kernel never stores the float32 product)."""
    if act not in GATED:
        raise ValueError(f"act must be one of {sorted(GATED)}, got {act!r}")
    return quantize_act(GATED[act](gate, up), out=out)


def rope_tables(n_rot: int, base: float, max_pos: int, freq_factors=None):
    """cos, sin tables (max_pos, n_rot/2) float64: angle = pos * base**(-2i/n_rot) / factor_i."""
    i = np.arange(n_rot // 2, dtype=np.float64)
    inv_freq = base ** (-2.0 * i / n_rot)
    if freq_factors is not None:
        inv_freq = inv_freq / np.asarray(freq_factors, dtype=np.float64)
    ang = np.arange(max_pos, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.cos(ang), np.sin(ang)


def rope(x, pos, cos, sin, neox: bool, out=None, *, nthreads: int = 1):
    """Rotary embedding of x (T, H, hd) float32 at positions pos (T,).

    The first n_rot = 2*cos.shape[1] dims of each head rotate; the rest pass through.
    neox=False (llama, GPT-J style): pairs (x[2i], x[2i+1]).
    neox=True (qwen, gemma): pairs (x[i], x[i + n_rot/2]).
    Bit-exact contract: x0' = float32(x0*c - x1*s), x1' = float32(x0*s + x1*c) in float64.
    """
    x = np.asarray(x, dtype=np.float32)
    pos = np.asarray(pos, dtype=np.int64)
    half = cos.shape[1]
    c = cos[pos][:, None, :]  # (T, 1, half)
    s = sin[pos][:, None, :]
    res = x.copy()
    if neox:
        x0 = x[..., :half].astype(np.float64)
        x1 = x[..., half : 2 * half].astype(np.float64)
        res[..., :half] = x0 * c - x1 * s
        res[..., half : 2 * half] = x0 * s + x1 * c
    else:
        x0 = x[..., 0 : 2 * half : 2].astype(np.float64)
        x1 = x[..., 1 : 2 * half : 2].astype(np.float64)
        res[..., 0 : 2 * half : 2] = x0 * c - x1 * s
        res[..., 1 : 2 * half : 2] = x0 * s + x1 * c
    if out is not None:
        out[...] = res
        return out
    return res


# ============================================================================ KV cache and attention
# Per layer, the cache holds
#   k_cache: (n_blocks, n_kv_heads, head_dim, block_size)   (keys transposed per block)
#   v_cache: (n_blocks, n_kv_heads, block_size, head_dim)
# in float32 or float16, or q8_0 as int8 with the scales in extra rows (goinfer.kv_cache
# kv_shapes, src/kv_types.h): k (nb, n_kv, hd + hd/16, bs), v (nb, n_kv, bs, hd + hd/16).
# A token's slot is block_id * block_size + offset.

QB = 32  # q8_0 block: values of one token along head_dim per scale


def kv_dtype_of(cache) -> str:
    """The storage type of a cache array: "f32", "f16" or "q8_0"."""
    kinds = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16", np.dtype(np.int8): "q8_0"}
    try:
        return kinds[np.dtype(cache.dtype)]
    except KeyError:
        raise TypeError(
            f"a KV cache is float32, float16 or int8 (q8_0), got {cache.dtype}"
        ) from None


def quantize_q8_0(x):
    """x (..., hd) float32 -> q (..., hd) int8, s (..., hd/32) float16, per 32 values:
    amax = max|x| (NaN if any is NaN), s = float16(amax / 127) (to nearest even),
    q = clip(rint(x / float32(s)), -127, 127), q = 0 where s is 0, inf or NaN."""
    x = np.asarray(x, dtype=np.float32)
    xg = x.reshape(*x.shape[:-1], x.shape[-1] // QB, QB)
    amax = np.abs(xg).max(axis=-1)  # (..., G), NaN propagates
    with np.errstate(over="ignore", invalid="ignore"):
        s = (amax / np.float32(127.0)).astype(np.float16)
    sf = s.astype(np.float32)
    ok = np.isfinite(sf) & (sf > 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.rint(xg / np.where(ok, sf, np.float32(1.0))[..., None])
    q = np.where(ok[..., None], np.clip(r, -127, 127), 0).astype(np.int8)
    return q.reshape(x.shape), s


def _q8_views(k_cache, v_cache):
    """(k q (nb, n_kv, hd, bs), k scales (nb, n_kv, G, bs), v q (nb, n_kv, bs, hd),
    v scales (nb, n_kv, bs, G)): views into the int8 arrays of a q8_0 cache."""
    nb, n_kv, rows, bs = k_cache.shape
    hd = rows * 16 // 17
    G = hd // QB
    kq = k_cache[:, :, :hd, :]
    ks = np.ndarray(
        (nb, n_kv, G, bs),
        np.float16,
        buffer=k_cache,
        offset=hd * bs,
        strides=(k_cache.strides[0], k_cache.strides[1], 2 * bs, 2),
    )
    vq = v_cache[..., :hd]
    vs = np.ndarray(
        (nb, n_kv, bs, G), np.float16, buffer=v_cache, offset=hd, strides=(*v_cache.strides[:3], 2)
    )
    return kq, ks, vq, vs


def dequantize_kv(k_cache, v_cache):
    """The stored values of a cache of any type as float32 caches (exact):
    k (nb, n_kv, hd, bs), v (nb, n_kv, bs, hd)."""
    dt = kv_dtype_of(k_cache)
    if dt != "q8_0":
        return k_cache.astype(np.float32), v_cache.astype(np.float32)
    kq, ks, vq, vs = _q8_views(k_cache, v_cache)
    with np.errstate(invalid="ignore"):  # 0 * inf: a block whose scale overflowed is NaN
        k = kq.astype(np.float32) * np.repeat(ks.astype(np.float32), QB, axis=2)  # exact
        v = vq.astype(np.float32) * np.repeat(vs.astype(np.float32), QB, axis=3)
    return k, v


def kv_write(k_cache, v_cache, k, v, slots, *, nthreads: int = 1) -> None:
    """Store k, v (T, n_kv, hd) at the given slots (T,), rounded to the cache's type."""
    dt = kv_dtype_of(k_cache)
    bs = k_cache.shape[3]
    k = np.asarray(k, dtype=np.float32)
    v = np.asarray(v, dtype=np.float32)
    if dt == "q8_0":
        kq, ks, vq, vs = _q8_views(k_cache, v_cache)
        qk, sk = quantize_q8_0(k)
        qv, sv = quantize_q8_0(v)
    for t, slot in enumerate(np.asarray(slots, dtype=np.int64)):
        b, o = divmod(int(slot), bs)
        if dt == "q8_0":
            kq[b, :, :, o] = qk[t]
            ks[b, :, :, o] = sk[t]
            vq[b, :, o, :] = qv[t]
            vs[b, :, o, :] = sv[t]
        else:
            k_cache[b, :, :, o] = k[t]  # f16: numpy rounds to nearest even
            v_cache[b, :, o, :] = v[t]


def gather_kv(k_cache, v_cache, block_table, n: int):
    """The first n cached tokens of a sequence -> k, v (n, n_kv, hd) float32 (stored values)."""
    bs = k_cache.shape[3]
    nb = (n + bs - 1) // bs
    bt = np.asarray(block_table[:nb], dtype=np.int64)
    kc, vc = dequantize_kv(k_cache[bt], v_cache[bt])
    k = kc.transpose(0, 3, 1, 2).reshape(nb * bs, kc.shape[1], kc.shape[2])
    v = vc.transpose(0, 2, 1, 3).reshape(nb * bs, vc.shape[1], vc.shape[3])
    return k[:n], v[:n]


def attention(
    q,
    k_cache,
    v_cache,
    block_table,
    q_pos,
    scale: float,
    window: int = 0,
    softcap: float = 0.0,
    out=None,
    *,
    nthreads: int = 1,
    sinks=None,
):
    """Causal attention of queries q (T, H, hd) at absolute positions q_pos (T,) over the
    sequence's cached keys (block_table (n_blocks_seq,) int32), grouped-query: query head h
    reads kv head h // (H / n_kv).  Query t sees keys at positions p with
    lo <= p <= q_pos[t], lo = max(0, q_pos[t] - window + 1) if window > 0 else 0.
    sinks (H,): a logit per query head in the softmax's denominator only (gpt-oss's attention
    sinks; -inf: none): weights exp(s_j - mx) / (sum_j exp(s_j - mx) + exp(sink - mx)),
    mx = max(max_j s_j, sink).
    float64 here (the exact kernel accumulates in float64 in key order).  This is also the
    reference of the compiled ``attention_fast`` (float32, tiled), which tests compare with it
    by cosine similarity rather than bits."""
    q = np.asarray(q, dtype=np.float32)
    T, H, hd = q.shape
    n_kv = k_cache.shape[1]
    grp = H // n_kv
    q_pos = np.asarray(q_pos, dtype=np.int64)
    k, v = gather_kv(k_cache, v_cache, block_table, int(q_pos.max()) + 1)
    k = k.astype(np.float64)
    v = v.astype(np.float64)
    res = np.empty((T, H, hd), dtype=np.float32)
    for t in range(T):
        p = int(q_pos[t])
        lo = max(0, p - window + 1) if window > 0 else 0
        for h in range(H):
            kh = k[lo : p + 1, h // grp]  # (n, hd)
            vh = v[lo : p + 1, h // grp]
            s = (kh @ q[t, h].astype(np.float64)) * scale
            if softcap > 0:
                s = softcap * np.tanh(s / softcap)
            sink = -np.inf if sinks is None else float(sinks[h])
            mx = max(float(s.max()), sink)
            e = np.exp(s - mx)
            res[t, h] = (e @ vh) / (e.sum() + np.exp(sink - mx))
    if out is not None:
        out[...] = res
        return out
    return res


def add(x, y, out=None, *, nthreads: int = 1):
    """out = x + y (float32, elementwise): residual connections."""
    res = (np.asarray(x, dtype=np.float32) + np.asarray(y, dtype=np.float32)).astype(np.float32)
    if out is not None:
        out[...] = res
        return out
    return res


def add_bias(x, b, out=None, *, nthreads: int = 1):
    """out = x + b (float32) with b (N,) added to every row of x (M, N): QKV bias."""
    res = (np.asarray(x, dtype=np.float32) + np.asarray(b, dtype=np.float32)[None, :]).astype(
        np.float32
    )
    if out is not None:
        out[...] = res
        return out
    return res


def copy2d(x, out, *, nthreads: int = 1):
    """out[...] = x (M, N) float32 (e.g. the q / k / v columns of a fused QKV output)."""
    if np.shape(out) != np.shape(x):
        raise ValueError(f"out has shape {np.shape(out)}, expected {np.shape(x)}")
    out[...] = x
    return out


def scale(x, s, out=None, *, nthreads: int = 1):
    """out = x * float32(s) (float32): Gemma's embedding scale."""
    res = (np.asarray(x, dtype=np.float32) * np.float32(s)).astype(np.float32)
    if out is not None:
        out[...] = res
        return out
    return res


def softcap(x, cap, out=None, *, nthreads: int = 1):
    """out = cap * tanh(x / cap) (Gemma's final logit softcap), in float64, rounded once."""
    if not float(cap) > 0 or not np.isfinite(cap):
        raise ValueError(f"softcap cap must be a finite number > 0, got {cap!r}")
    c = float(np.float32(cap))
    res = (np.tanh(np.asarray(x, dtype=np.float64) / c) * c).astype(np.float32)
    if out is not None:
        out[...] = res
        return out
    return res


def gather_rows(x, rows, out=None, *, nthreads: int = 1):
    """out[j] = x[rows[j]] (float32 (R, N)): the rows of a batch that need logits."""
    rows = np.asarray(rows, dtype=np.int64)
    if rows.size and (rows.min() < 0 or rows.max() >= len(x)):
        raise IndexError(f"rows out of range for {len(x)} rows")
    res = np.asarray(x, dtype=np.float32)[rows]
    if out is not None:
        out[...] = res
        return out
    return res


# ============================================================================ Mixture of Experts
# Routing, grouping and fold of an MoE feed-forward (see goinfer/_kernels/moe.pyx).  Bit-exact
# contracts: the kernels do these same float64 / float32 operations in this order, and exp is
# libm's (Python's math.exp), so the two agree bit for bit.

_MOE_MODES = ("softmax_topk", "topk_softmax")


def _rank_key(v: float) -> float:
    return -math.inf if v != v else v  # NaN ranks below every number


def _top_k(v: list[float], k: int) -> list[int]:
    """Indices of the k largest values, largest first, ties to the lower index."""
    chosen: list[int] = []
    for _ in range(k):
        best, bv = -1, 0.0
        for j, x in enumerate(v):
            if j in chosen:
                continue
            kx = _rank_key(x)
            if best < 0 or kx > bv:
                best, bv = j, kx
        chosen.append(best)
    return chosen


def moe_route(
    logits,
    k: int,
    mode: str = "softmax_topk",
    norm: bool = False,
    scale: float = 1.0,
    ids=None,
    weights=None,
    *,
    nthreads: int = 1,
):
    """Router logits (T, E) float32 -> ids (T, k) int32 (experts by rank), weights (T, k) float32.

    softmax_topk: e_j = exp(l_j - max_j l_j), S = sum_j e_j (float64, index order), p = e / S;
      the k largest p; norm: w_r = p_r / sum_r p_r (rank order), else w_r = p_r.
    topk_softmax: the k largest logits l_r; e_r = exp(l_r - l_0), w_r = e_r / sum_r e_r.
    Then w_r = float32(w_r * scale).  Ties go to the lower expert index; NaN ranks lowest."""
    if mode not in _MOE_MODES:
        raise ValueError(f"mode must be one of {', '.join(_MOE_MODES)}, got {mode!r}")
    logits = np.asarray(logits, dtype=np.float32)
    T, E = logits.shape
    if not 1 <= k <= E:
        raise ValueError(f"k must be an int in [1, {E}] (the number of experts), got {k!r}")
    res_i = np.empty((T, k), np.int32)
    res_w = np.empty((T, k), np.float32)
    for t in range(T):
        row = [float(x) for x in logits[t]]
        if mode == "softmax_topk":
            mx = -math.inf
            for x in row:
                if x > mx:
                    mx = x
            e = [math.exp(x - mx) for x in row]
            S = 0.0
            for x in e:
                S = S + x
            p = [x / S for x in e]
            sel = _top_k(p, k)
            s = 0.0
            for j in sel:
                s = s + p[j]
            w = [(p[j] / s if norm else p[j]) * scale for j in sel]
        else:
            sel = _top_k(row, k)
            e = [math.exp(row[j] - row[sel[0]]) for j in sel]
            s = 0.0
            for x in e:
                s = s + x
            w = [(x / s) * scale for x in e]
        res_i[t] = sel
        res_w[t] = np.array(w, dtype=np.float64).astype(np.float32)
    if ids is not None:
        ids[...] = res_i
        res_i = ids
    if weights is not None:
        weights[...] = res_w
        res_w = weights
    return res_i, res_w


def moe_group(ids, n_expert: int, rows=None, offsets=None, pos=None, *, nthreads: int = 1):
    """Entries (t, r) of ids (T, k) sorted by expert, stably -> rows (T*k,) int32 (t of each
    sorted entry), offsets (n_expert+1,) int64, pos (T*k,) int32 (sorted index of entry t*k+r)."""
    ids = np.asarray(ids)
    T, k = ids.shape
    flat = ids.reshape(-1).astype(np.int64)
    if flat.size and (flat.min() < 0 or flat.max() >= n_expert):
        raise ValueError(f"ids must lie in [0, {n_expert}), got [{flat.min()}, {flat.max()}]")
    order = np.argsort(flat, kind="stable")  # sorted index -> entry t*k + r
    res_rows = (order // k).astype(np.int32)
    res_off = np.concatenate([[0], np.cumsum(np.bincount(flat, minlength=n_expert))]).astype(
        np.int64
    )
    res_pos = np.empty(T * k, np.int32)
    res_pos[order] = np.arange(T * k, dtype=np.int32)
    out = []
    for buf, res in ((rows, res_rows), (offsets, res_off), (pos, res_pos)):
        if buf is not None:
            buf[...] = res
            res = buf
        out.append(res)
    return tuple(out)


def _sigmoid64(x: float) -> float:
    try:
        e = math.exp(-x)
    except OverflowError:  # libm returns inf here
        e = math.inf
    return 1.0 / (1.0 + e)


def moe_fold(
    y,
    weights,
    pos,
    shared=None,
    shared_logit=None,
    renorm: bool = False,
    out=None,
    *,
    nthreads: int = 1,
):
    """out (T, D): per row, in float64 (products of floats exact), rounded to float32 once:
    acc = sum over ranks r (in order) of weights[t, r] * y[pos[t*k + r]]; renorm: acc / (sum of
    the row's weights in rank order); shared: acc + float32(sigmoid(shared_logit[t])) * shared[t]
    (sigmoid in float64)."""
    y = np.asarray(y, dtype=np.float32).astype(np.float64)
    w = np.asarray(weights, dtype=np.float32).astype(np.float64)
    T, k = w.shape
    pos = np.asarray(pos, dtype=np.int64).reshape(T, k)
    acc = w[:, 0:1] * y[pos[:, 0]]
    S = w[:, 0].copy()
    for r in range(1, k):
        acc = acc + w[:, r : r + 1] * y[pos[:, r]]
        S = S + w[:, r]
    if renorm:
        acc = acc / S[:, None]
    if shared is not None:
        g = (
            np.array([_sigmoid64(float(x)) for x in np.asarray(shared_logit)], dtype=np.float64)
            .astype(np.float32)
            .astype(np.float64)
        )
        acc = acc + g[:, None] * np.asarray(shared, dtype=np.float32).astype(np.float64)
    res = acc.astype(np.float32)
    if out is not None:
        out[...] = res
        return out
    return res


# ============================================================================ linear attention
# Qwen3.5's Gated DeltaNet layers (goinfer/_kernels/ssm.pyx, src/ssm.h).  The recurrence is
# written here with the kernel's own float32 operation sequence (NumPy float32 arithmetic is
# IEEE and unfused), and its scalar pre-pass with the same libm calls (math.*), so gated_delta
# is bit-exact with the kernel; the SiLU / sigmoid use float64 here (the kernel: gi_vf_exp).


def _snapshot_args(snap_rows, snaps):
    if snap_rows is None and snaps is None:
        return [], None
    return [int(r) for r in np.asarray(snap_rows).ravel()], snaps


def ssm_conv(x, wT, state, out=None, *, snap_rows=None, snaps=None, nthreads: int = 1):
    """out[t] = silu(sum_j wT[j] * xx[t + j]) with xx = state (K-1, C) ++ x (T, C); the sum in
    j order in float32, silu in float64.  state becomes the last K-1 rows of xx; snaps[s] gets
    the K-1 rows of xx ending at row snap_rows[s] of x."""
    x = np.asarray(x, dtype=np.float32)
    wT = np.asarray(wT, dtype=np.float32)
    K = wT.shape[0]
    T = x.shape[0]
    xx = np.concatenate([state, x], axis=0)  # (K-1+T, C)
    acc = np.zeros_like(x)
    for j in range(K):
        acc = acc + wT[j] * xx[j : j + T]
    a64 = acc.astype(np.float64)
    res = (a64 / (1.0 + np.exp(-a64))).astype(np.float32)
    rows, dst = _snapshot_args(snap_rows, snaps)
    for s, r in enumerate(rows):
        dst[s][...] = xx[r + 1 : r + K]
    state[...] = xx[T : T + K - 1]
    if out is not None:
        out[...] = res
        return out
    return res


def _softplus64(x: float) -> float:
    return x if x > 20.0 else math.log1p(math.exp(x))


def gated_delta(
    qkv,
    ab,
    A,
    dt_bias,
    state,
    n_k_heads: int,
    out=None,
    *,
    snap_rows=None,
    snaps=None,
    eps: float = 1e-6,
    nthreads: int = 1,
):
    """The gated delta rule token by token over state (Hv, dk, dv) (see ssm.pyx).  Per value
    head h (key head h % Hk) and token:
      kv = decay * sum_i S[i] k_i ; d = (v - kv) * beta ; S[i] = S[i]*decay + k_i d ;
      o = sum_i S[i] q_i   (sums in i order, float32)
    with q, k L2-normalized in float64 (q also / sqrt(dk)), decay = exp(A softplus(alpha +
    dt_bias)), beta = sigmoid(b), in float64 with libm."""
    qkv = np.asarray(qkv, dtype=np.float32)
    ab = np.asarray(ab, dtype=np.float32)
    Hv, dk, dv = state.shape
    Hk = int(n_k_heads)
    T = qkv.shape[0]
    qk = qkv[:, : 2 * Hk * dk].astype(np.float64).reshape(T, 2, Hk, dk)
    ss = np.zeros((T, 2, Hk))
    for i in range(dk):  # index order, as the kernel
        ss = ss + qk[..., i] * qk[..., i]
    r = 1.0 / np.sqrt(ss + float(eps))
    r[:, 0] = r[:, 0] * (1.0 / math.sqrt(dk))
    qn = (qk * r[..., None]).astype(np.float32)  # (T, 2, Hk, dk)
    heads = np.arange(Hv) % Hk
    q, k = qn[:, 0][:, heads], qn[:, 1][:, heads]  # (T, Hv, dk)
    v = qkv[:, 2 * Hk * dk : 2 * Hk * dk + Hv * dv].reshape(T, Hv, dv)
    beta = (
        np.array(
            [[1.0 / (1.0 + math.exp(-float(ab[t, h]))) for h in range(Hv)] for t in range(T)],
            dtype=np.float64,
        )
        .astype(np.float32)
        .reshape(T, Hv)
    )
    decay = (
        np.array(
            [
                [
                    math.exp(float(A[h]) * _softplus64(float(ab[t, Hv + h]) + float(dt_bias[h])))
                    for h in range(Hv)
                ]
                for t in range(T)
            ]
        )
        .astype(np.float32)
        .reshape(T, Hv)
    )
    rows, dst = _snapshot_args(snap_rows, snaps)
    res = np.empty((T, Hv, dv), np.float32)
    S = state
    for t in range(T):
        g, b = decay[t][:, None], beta[t][:, None]  # (Hv, 1)
        kv = np.zeros((Hv, dv), np.float32)
        for i in range(dk):
            kv = kv + S[:, i, :] * k[t, :, i][:, None]
        kv = kv * g
        d = (v[t] - kv) * b
        o = np.zeros((Hv, dv), np.float32)
        for i in range(dk):
            si = S[:, i, :] * g + k[t, :, i][:, None] * d
            S[:, i, :] = si
            o = o + si * q[t, :, i][:, None]
        res[t] = o
        for s, rr in enumerate(rows):
            if rr == t:
                dst[s][...] = S
    res = res.reshape(T, Hv * dv)
    if out is not None:
        out.reshape(T, Hv * dv)[...] = res
        return out
    return res


def sigmoid_mul(gate, x, out=None, *, nthreads: int = 1):
    """out = x * sigmoid(gate) (float64 here)."""
    g = np.asarray(gate, dtype=np.float64)
    res = (np.asarray(x, dtype=np.float64) / (1.0 + np.exp(-g))).astype(np.float32)
    if out is not None:
        out[...] = res
        return out
    return res
