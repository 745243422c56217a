"""Qwen3.5 (GGUF arch ``qwen35``, dense, and ``qwen35moe``): a hybrid of Gated DeltaNet
linear-attention layers and gated full-attention layers (3 linear per full one in every
published size).  qwen35moe replaces every layer's SwiGLU FFN by models/moe.py's: softmax over
all experts, the top k renormalized, plus a shared expert behind a sigmoid gate.

Per layer (llama.cpp's converter layout; docs/design/families.md):
  h = RMSNorm(x, attn_norm)
  linear layer:  [qkv | z] = h [attn_qkv; attn_gate]     [b | a] = h [ssm_beta; ssm_alpha]
                 c = silu(causal_conv(qkv; ssm_conv1d, K taps, conv state))
                 o = gated_delta(q, k, v of c; beta = sigmoid(b), decay = exp(ssm_a softplus(a
                     + ssm_dt.bias)); delta state)            # q, k L2-normalized, q / sqrt(dk)
                 y = (RMSNorm_per_head(o, ssm_norm) * silu(z)) ssm_out
  full layer:    [q, gate] per head = h attn_q (2 hd per head), k = h attn_k, v = h attn_v
                 q, k = RMSNorm_per_head(q, attn_q_norm), RMSNorm_per_head(k, attn_k_norm)
                 q, k = RoPE_neox(first rope.dimension_count dims)   # MRoPE on text positions
                 y = (attention(q, K, V) * sigmoid(gate)) attn_output
  x = x + y
  x = x + SwiGLU-FFN(RMSNorm(x, post_attention_norm))
logits = RMSNorm(x, output_norm) output (or token_embd when tied)

The converter stores Qwen3.5's zero-centred norms as 1 + w (every ``*norm.weight`` except the
linear layers' ssm_norm), so all of them are plain RMSNorms here.  It also reorders value heads
from grouped-by-key-head to tiled order when Hv > Hk; value head h then reads key head h % Hk
(the gated_delta kernel's convention).  Interleaved MRoPE with ``rope.dimension_sections``
rotates each frequency by one of 3 position components; text positions give the same position
in all of them, so it is NeoX RoPE over the first ``rope.dimension_count`` dims.

Only attention layers hold KV (the cache's layers are the attention layers, in order); the
linear layers' state travels with the sequence (goinfer/recurrent.py).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, fields

import numpy as np

from goinfer.errors import ModelFormatError, UnsupportedArchitectureError
from goinfer.models import llama, moe
from goinfer.models.base import Act, Batch, ModelConfig
from goinfer.quant import QWeight, concat_rows
from goinfer.recurrent import StateSpec

L2_EPS = 1e-6  # transformers' l2norm eps in the delta rule (fixed, not rms_norm_eps)

# ============================================================================ config


@dataclass
class Qwen35Config(ModelConfig):
    recurrent: tuple = ()  # per layer: True = Gated DeltaNet, False = full attention
    conv_kernel: int = 4
    n_k_heads_lin: int = 0  # Hk (ssm.group_count)
    n_v_heads_lin: int = 0  # Hv (ssm.time_step_rank)
    d_state: int = 0  # dk = dv (ssm.state_size)
    n_mtp: int = 0  # MTP layers present in the file (skipped)

    @property
    def n_kv_layers(self) -> int:
        """Layers that hold KV: the full-attention ones."""
        return self.n_layers - sum(self.recurrent)

    @property
    def state_spec(self) -> StateSpec:
        Hk, Hv, d = self.n_k_heads_lin, self.n_v_heads_lin, self.d_state
        return StateSpec(sum(self.recurrent), self.conv_kernel, 2 * Hk * d + Hv * d, Hv, d, d)

    def describe(self) -> str:
        n_lin = sum(self.recurrent)
        return (super().describe() + f", {n_lin} Gated DeltaNet layers ({self.n_k_heads_lin} k / "
                f"{self.n_v_heads_lin} v heads x {self.d_state}) + {self.n_layers - n_lin} attention")


@dataclass
class Qwen35MoEConfig(Qwen35Config, moe.MoEConfig):
    """qwen35moe: the hybrid config plus the MoE fields (describe() names both)."""


def read_config(g, experts: bool = False) -> Qwen35Config:
    """experts: the qwen35moe reading (a Qwen35MoEConfig)."""
    n_mtp = int(g.arch_get("nextn_predict_layers", 0) or 0)
    base = moe.read_config(g) if experts else llama.read_config(g)
    fields = dict(vars(base))
    n_layers = base.n_layers - n_mtp
    if n_layers < 1:
        raise ModelFormatError(f"{g.path}: {g.arch} file has no layers besides its MTP head")
    if n_mtp:
        warnings.warn(f"{g.path}: skipping the multi-token-prediction head ({n_mtp} layer(s)); "
                      "it only drafts tokens and does not change the text", stacklevel=3)
    fields["n_layers"] = n_layers
    fields["rope_neox"] = True
    fields["qk_norm"] = True
    if g.arch_get("expert_count") and not experts:
        raise UnsupportedArchitectureError(f"{g.path}: {g.arch} with experts (expert_count) is not "
                                           "a dense Qwen3.5; Qwen3.5 MoE files are arch qwen35moe")
    rec = g.arch_get("attention.recurrent_layers")
    if rec is not None:
        rec = tuple(bool(v) for v in np.asarray(rec).ravel())
        if len(rec) < n_layers:
            raise ModelFormatError(f"{g.path}: {g.arch}.attention.recurrent_layers has "
                                   f"{len(rec)} entries for {n_layers} layers")
        rec = rec[:n_layers]
    else:
        every = int(g.arch_get("full_attention_interval", 4) or 4)
        rec = tuple((i + 1) % every != 0 for i in range(n_layers))
    d_state = int(g.arch_get("ssm.state_size", 0) or 0)
    Hk = int(g.arch_get("ssm.group_count", 0) or 0)
    Hv = int(g.arch_get("ssm.time_step_rank", 0) or 0)
    inner = int(g.arch_get("ssm.inner_size", 0) or 0)
    K = int(g.arch_get("ssm.conv_kernel", 0) or 0)
    if any(rec) and (d_state < 1 or Hk < 1 or Hv < 1 or K < 1 or Hv % Hk or inner != Hv * d_state):
        raise ModelFormatError(f"{g.path}: {g.arch}.ssm.* keys do not describe the linear "
                               f"attention (state_size {d_state}, group_count {Hk}, "
                               f"time_step_rank {Hv}, inner_size {inner}, conv_kernel {K})")
    cls = Qwen35MoEConfig if experts else Qwen35Config
    return cls(**fields, recurrent=rec, conv_kernel=K, n_k_heads_lin=Hk,
               n_v_heads_lin=Hv, d_state=d_state, n_mtp=n_mtp)


# ============================================================================ weights


@dataclass
class LinearWeights:
    """A Gated DeltaNet layer's mixer."""

    w_in: QWeight | None  # fused [attn_qkv; attn_gate] (C + Hv*dv, D), or None
    w_qkv: QWeight | None  # (C, D)
    w_z: QWeight | None  # (Hv*dv, D)
    w_ba: QWeight | None  # fused [ssm_beta; ssm_alpha] (2 Hv, D), or None
    w_b: QWeight | None
    w_a: QWeight | None
    conv_wT: np.ndarray  # (K, C) f32: tap j of every channel
    A: np.ndarray  # (Hv,) f32 = -exp(A_log)
    dt_bias: np.ndarray  # (Hv,) f32
    norm: np.ndarray  # (dv,) f32
    w_out: QWeight  # (D, Hv*dv)

    def weights(self):
        return [w for w in (self.w_in, self.w_qkv, self.w_z, self.w_ba, self.w_b, self.w_a,
                            self.w_out) if w is not None]


@dataclass
class Qwen35LayerWeights(llama.LayerWeights):
    """A llama layer whose attention fields are None in linear layers (``lin`` set)."""

    lin: LinearWeights | None = None
    lin_index: int = -1  # which linear layer (state index), or -1
    kv_index: int = -1  # which attention layer (KV cache layer), or -1

    def weights(self):
        return super().weights() + (self.lin.weights() if self.lin is not None else [])


@dataclass
class Qwen35MoELayerWeights(Qwen35LayerWeights):
    """A qwen35moe layer: the FFN fields are None, ``moe`` holds the experts."""

    moe: moe.MoEWeights | None = None

    def weights(self):
        return super().weights() + (self.moe.weights() if self.moe is not None else [])


def _load_linear(g, cfg: Qwen35Config, i: int) -> LinearWeights:
    p = f"blk.{i}."
    D, Hk, Hv, d, K = cfg.d_model, cfg.n_k_heads_lin, cfg.n_v_heads_lin, cfg.d_state, cfg.conv_kernel
    C, VD = 2 * Hk * d + Hv * d, Hv * d
    w_qkv, w_z = g.load_weight(p + "attn_qkv.weight"), g.load_weight(p + "attn_gate.weight")
    llama._check_shape(p + "attn_qkv.weight", w_qkv, C, D)
    llama._check_shape(p + "attn_gate.weight", w_z, VD, D)
    w_b, w_a = g.load_weight(p + "ssm_beta.weight"), g.load_weight(p + "ssm_alpha.weight")
    llama._check_shape(p + "ssm_beta.weight", w_b, Hv, D)
    llama._check_shape(p + "ssm_alpha.weight", w_a, Hv, D)
    w_in, w_ba = concat_rows([w_qkv, w_z]), concat_rows([w_b, w_a])
    conv = g.load_f32(p + "ssm_conv1d.weight")
    if conv.shape != (C, K):
        raise ModelFormatError(f"tensor {p}ssm_conv1d.weight has shape {conv.shape}, expected ({C}, {K})")
    w_out = g.load_weight(p + "ssm_out.weight")
    llama._check_shape(p + "ssm_out.weight", w_out, D, VD)
    return LinearWeights(
        w_in=w_in, w_qkv=None if w_in is not None else w_qkv, w_z=None if w_in is not None else w_z,
        w_ba=w_ba, w_b=None if w_ba is not None else w_b, w_a=None if w_ba is not None else w_a,
        conv_wT=np.ascontiguousarray(conv.T, dtype=np.float32),
        A=llama._check_vec(p + "ssm_a", g.load_f32(p + "ssm_a"), Hv),
        dt_bias=llama._check_vec(p + "ssm_dt.bias", g.load_f32(p + "ssm_dt.bias"), Hv),
        norm=llama._check_vec(p + "ssm_norm.weight", g.load_f32(p + "ssm_norm.weight"), d),
        w_out=w_out)


# ============================================================================ the family


class Qwen35Family(llama.LlamaFamily):
    """Weights and forward step of Qwen3.5 dense models."""

    read_config = staticmethod(read_config)

    def __init__(self, g, cfg: Qwen35Config, kernels, threads: int, progress=None,
                 weights: dict | None = None):
        super().__init__(g, cfg, kernels, threads, progress, weights)
        self.state_spec = cfg.state_spec

    def load_layer(self, g, i: int) -> Qwen35LayerWeights:
        """Layer i; reads self.cfg only (the layout cache loads before __init__ runs)."""
        cfg, p, D = self.cfg, f"blk.{i}.", self.cfg.d_model
        n_lin = sum(cfg.recurrent[:i])  # linear layers before this one
        if not cfg.recurrent[i]:
            attn = self._load_gated_attention(g, i)
            lin, lin_index, kv_index = None, -1, i - n_lin
        else:
            attn = dict(attn_norm=llama._check_vec(p + "attn_norm.weight", g.load_f32(p + "attn_norm.weight"), D),
                        wqkv=None, wq=None, wk=None, wv=None, bqkv=None, q_norm=None, k_norm=None, wo=None)
            lin, lin_index, kv_index = _load_linear(g, cfg, i), n_lin, -1
        norm = llama._check_vec(p + "post_attention_norm.weight", g.load_f32(p + "post_attention_norm.weight"), D)
        return Qwen35LayerWeights(**attn, ffn_norm=norm, **self._load_ffn(g, i), lin=lin,
                                  lin_index=lin_index, kv_index=kv_index)

    def _load_ffn(self, g, i: int) -> dict:
        """The FFN fields of layer i: a SwiGLU feed-forward."""
        cfg, p, D, F = self.cfg, f"blk.{i}.", self.cfg.d_model, self.cfg.d_ff
        w_gate, w_up = g.load_weight(p + "ffn_gate.weight"), g.load_weight(p + "ffn_up.weight")
        llama._check_shape(p + "ffn_gate.weight", w_gate, F, D)
        llama._check_shape(p + "ffn_up.weight", w_up, F, D)
        w_gate_up = concat_rows([w_gate, w_up])
        w_down = g.load_weight(p + "ffn_down.weight")
        llama._check_shape(p + "ffn_down.weight", w_down, D, F)
        return dict(w_gate_up=w_gate_up, w_gate=None if w_gate_up is not None else w_gate,
                    w_up=None if w_gate_up is not None else w_up, w_down=w_down)

    def _load_gated_attention(self, g, i: int) -> dict:
        """The attention fields; attn_q has 2 * head_dim rows per head: query, then gate."""
        cfg, p = self.cfg, f"blk.{i}."
        D, hd, H, KV = cfg.d_model, cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
        wq, wk, wv = (g.load_weight(p + f"attn_{n}.weight") for n in "qkv")
        llama._check_shape(p + "attn_q.weight", wq, 2 * H * hd, D)
        llama._check_shape(p + "attn_k.weight", wk, KV * hd, D)
        llama._check_shape(p + "attn_v.weight", wv, KV * hd, D)
        if g.has_tensor(p + "attn_q.bias"):
            raise UnsupportedArchitectureError(f"{g.path}: {g.arch} with attention biases is not supported")
        wqkv = concat_rows([wq, wk, wv])
        wo = g.load_weight(p + "attn_output.weight")
        llama._check_shape(p + "attn_output.weight", wo, D, H * hd)
        return dict(
            attn_norm=llama._check_vec(p + "attn_norm.weight", g.load_f32(p + "attn_norm.weight"), D),
            wqkv=wqkv, wq=None if wqkv is not None else wq, wk=None if wqkv is not None else wk,
            wv=None if wqkv is not None else wv, bqkv=None,
            q_norm=llama._check_vec(p + "attn_q_norm.weight", g.load_f32(p + "attn_q_norm.weight"), hd),
            k_norm=llama._check_vec(p + "attn_k_norm.weight", g.load_f32(p + "attn_k_norm.weight"), hd),
            wo=wo)

    # ------------------------------------------------------------------ forward

    def forward(self, batch: Batch, k_cache: np.ndarray, v_cache: np.ndarray,
                logits: np.ndarray | None = None) -> np.ndarray:
        """Like LlamaFamily.forward; k_cache/v_cache hold the attention layers only, and every
        segment carries its sequence's recurrent state (segment.rec, a SeqRecurrent)."""
        K, cfg, nt, S = self.K, self.cfg, self.threads, self.scratch
        for seg in batch.segments:
            if getattr(seg, "rec", None) is None:
                raise ValueError("a Qwen3.5 forward step needs every sequence's recurrent state")
        T, D = len(batch.tokens), cfg.d_model
        x = self.embed(batch.tokens, S.get("x", T, D))  # (T, D) residual stream
        h = S.get("h", T, D)
        o = S.get("o", T, D)
        for li, L in enumerate(self.layers):
            K.rmsnorm(x, L.attn_norm, cfg.norm_eps, out=h, nthreads=nt)
            if L.lin is not None:
                self.linear_block(L, h, batch, o)
            else:
                self.attention_block(li, L, h, batch, k_cache[L.kv_index], v_cache[L.kv_index], o)
            K.add(x, o, out=x, nthreads=nt)
            K.rmsnorm(x, L.ffn_norm, cfg.norm_eps, out=h, nthreads=nt)
            self.ffn_block(li, L, h, o)
            K.add(x, o, out=x, nthreads=nt)
        return self.head(x, batch.logit_rows, logits)

    def attention_block(self, li: int, L: Qwen35LayerWeights, h, batch: Batch, kc, vc, out) -> None:
        """Gated attention: normed h (T, D) -> out (T, D); writes K/V."""
        K, cfg, S, nt = self.K, self.cfg, self.scratch, self.threads
        T = h.shape[0]
        H, KV, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        nqg, nkv = 2 * H * hd, KV * hd
        a = Act(K, h, S.qact(T, h.shape[1]), nt)
        if L.wqkv is not None:
            qkv = self._mm(a, L.wqkv, S.get("att_qkv", T, nqg + 2 * nkv))  # (T, 2H hd + 2 KV hd)
            qg_src, k_src, v_src = qkv[:, :nqg], qkv[:, nqg:nqg + nkv], qkv[:, nqg + nkv:]
        else:
            qg_src = self._mm(a, L.wq, S.get("att_qg_mm", T, nqg))
            k_src = self._mm(a, L.wk, S.get("att_k_mm", T, nkv))
            v_src = self._mm(a, L.wv, S.get("att_v_mm", T, nkv))
        qg = S.get("att_qg", T, H, 2 * hd)  # per head: query (hd) | gate (hd)
        K.copy2d(qg_src, out=qg.reshape(T, nqg), nthreads=nt)
        q, gate = S.get("att_q", T, H, hd), S.get("att_gate", T, H, hd)
        K.copy2d(qg.reshape(T * H, 2 * hd)[:, :hd], out=q.reshape(T * H, hd), nthreads=nt)
        K.copy2d(qg.reshape(T * H, 2 * hd)[:, hd:], out=gate.reshape(T * H, hd), nthreads=nt)
        k, v = S.get("att_k", T, KV, hd), S.get("att_v", T, KV, hd)
        K.copy2d(k_src, out=k.reshape(T, nkv), nthreads=nt)
        K.copy2d(v_src, out=v.reshape(T, nkv), nthreads=nt)
        K.rmsnorm(q, L.q_norm, cfg.norm_eps, out=q, nthreads=nt)
        K.rmsnorm(k, L.k_norm, cfg.norm_eps, out=k, nthreads=nt)
        cos, sin = self.rope.tables(int(batch.positions.max()) + 1)
        K.rope(q, batch.positions, cos, sin, True, out=q, nthreads=nt)
        K.rope(k, batch.positions, cos, sin, True, out=k, nthreads=nt)
        K.kv_write(kc, vc, k, v, batch.slots, nthreads=nt)
        att = self.attend(li, q, kc, vc, batch, S.get("att_out", T, H, hd), 0, 0.0, None)
        flat = att.reshape(T, H * hd)
        K.sigmoid_mul(gate.reshape(T, H * hd), flat, out=flat, nthreads=nt)
        self._mm(Act(K, flat, S.qact(T, H * hd), nt), L.wo, out)

    def linear_block(self, L: Qwen35LayerWeights, h, batch: Batch, out) -> None:
        """Gated DeltaNet: normed h (T, D) -> out (T, D); updates each segment's state."""
        K, cfg, S, nt = self.K, self.cfg, self.scratch, self.threads
        W, T = L.lin, h.shape[0]
        Hk, Hv, d = cfg.n_k_heads_lin, cfg.n_v_heads_lin, cfg.d_state
        C, VD = 2 * Hk * d + Hv * d, Hv * d
        a = Act(K, h, S.qact(T, h.shape[1]), nt)
        if W.w_in is not None:
            pz = self._mm(a, W.w_in, S.get("lin_in", T, C + VD))  # (T, C + VD): qkv | z
            mixed, z = pz[:, :C], pz[:, C:]
        else:
            mixed = self._mm(a, W.w_qkv, S.get("lin_qkv", T, C))
            z = self._mm(a, W.w_z, S.get("lin_z", T, VD))
        if W.w_ba is not None:
            ab = self._mm(a, W.w_ba, S.get("lin_ab", T, 2 * Hv))  # (T, 2 Hv): beta | alpha
        else:
            ab = S.get("lin_ab", T, 2 * Hv)
            K.copy2d(self._mm(a, W.w_b, S.get("lin_b", T, Hv)), out=ab[:, :Hv], nthreads=nt)
            K.copy2d(self._mm(a, W.w_a, S.get("lin_a", T, Hv)), out=ab[:, Hv:], nthreads=nt)
        conv = S.get("lin_conv", T, C)
        core = S.get("lin_core", T, VD)
        i = L.lin_index
        for seg in batch.segments:
            r, rec = slice(seg.start, seg.stop), seg.rec
            rows, snap_conv, snap_ssm = rec.layer_snaps(i)
            K.ssm_conv(mixed[r], W.conv_wT, rec.state.conv[i], out=conv[r], snap_rows=rows,
                       snaps=snap_conv, nthreads=nt)
            K.gated_delta(conv[r], ab[r], W.A, W.dt_bias, rec.state.ssm[i], Hk, out=core[r],
                          snap_rows=rows, snaps=snap_ssm, eps=L2_EPS, nthreads=nt)
        normed = S.get("lin_normed", T, VD)
        K.rmsnorm(core.reshape(T * Hv, d), W.norm, cfg.norm_eps, out=normed.reshape(T * Hv, d),
                  nthreads=nt)
        y = K.swiglu(z, normed, out=S.get("lin_y", T, VD), nthreads=nt)  # silu(z) * normed
        self._mm(Act(K, y, S.qact(T, VD), nt), W.w_out, out)


class Qwen35MoEFamily(Qwen35Family, moe.MoEFamily):
    """Qwen3.5 MoE: Qwen35Family's mixers, MoEFamily's feed-forward (router, expert-major
    GEMMs, shared expert, fold) in every layer."""

    read_config = staticmethod(lambda g: read_config(g, experts=True))

    def load_layer(self, g, i: int) -> Qwen35MoELayerWeights:
        L = super().load_layer(g, i)
        return Qwen35MoELayerWeights(**{f.name: getattr(L, f.name) for f in fields(L)},
                                     moe=moe.load_moe(g, self.cfg, i))

    def _load_ffn(self, g, i: int) -> dict:
        if not g.has_tensor(f"blk.{i}.ffn_gate_inp.weight"):
            raise ModelFormatError(f"{g.path}: qwen35moe layer {i} has no expert router "
                                   f"(blk.{i}.ffn_gate_inp.weight)")
        return dict(w_gate_up=None, w_gate=None, w_up=None, w_down=None)
