"""Qwen3.5 (GGUF arch ``qwen35``, dense, and ``qwen35moe``): a hybrid of Gated DeltaNet
linear-attention layers and gated full-attention layers (3 linear per full one in every
published size).  qwen35moe replaces every layer's SwiGLU FFN by the routed experts of
models/experts.py: softmax over all experts, the top k renormalized, plus a shared expert
behind a sigmoid gate.

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
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from goinfer.errors import ModelFormatError, UnsupportedArchitectureError
from goinfer.models.base import Act, Batch, ModelConfig
from goinfer.models.experts import (
    ExpertFields,
    FFNWeights,
    MoEFFN,
    MoEWeights,
    load_moe,
    read_experts,
)
from goinfer.models.family import NO_FFN, Family, LayerWeights, load_gated_ffn
from goinfer.models.loading import Loader, config_fields
from goinfer.quant import QWeight
from goinfer.recurrent import StateSpec

if TYPE_CHECKING:
    from goinfer.gguf import GGUFFile
    from goinfer.models.arch import Arch

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

    def kv_windows(self) -> tuple[int, ...]:
        """Its attention layers attend over every earlier position."""
        return (0,) * self.n_kv_layers

    @property
    def state_spec(self) -> StateSpec:
        Hk, Hv, d = self.n_k_heads_lin, self.n_v_heads_lin, self.d_state
        return StateSpec(sum(self.recurrent), self.conv_kernel, 2 * Hk * d + Hv * d, Hv, d, d)

    def describe(self) -> str:
        n_lin = sum(self.recurrent)
        return (
            super().describe() + f", {n_lin} Gated DeltaNet layers ({self.n_k_heads_lin} k / "
            f"{self.n_v_heads_lin} v heads x {self.d_state}) + {self.n_layers - n_lin} attention"
        )


@dataclass
class Qwen35MoEConfig(Qwen35Config, ExpertFields):
    """qwen35moe: the hybrid config plus the experts'."""

    def describe(self) -> str:
        return super().describe() + self.describe_experts()


def read_config(g: GGUFFile, arch: Arch, experts: bool = False) -> Qwen35Config:
    """experts: the qwen35moe reading (a Qwen35MoEConfig)."""
    n_mtp = int(g.arch_get("nextn_predict_layers", 0) or 0)
    fields = config_fields(g, arch)
    moe = read_experts(g, arch, fields["n_layers"], fields["d_model"]) if experts else {}
    n_layers = fields["n_layers"] - n_mtp
    if n_layers < 1:
        raise ModelFormatError(f"{g.path}: {g.arch} file has no layers besides its MTP head")
    if n_mtp:
        warnings.warn(
            f"{g.path}: skipping the multi-token-prediction head ({n_mtp} layer(s)); "
            "it only drafts tokens and does not change the text",
            stacklevel=4,
        )
    fields.update(n_layers=n_layers, qk_norm=True)
    if g.arch_get("expert_count") and not experts:
        raise UnsupportedArchitectureError(
            f"{g.path}: {g.arch} with experts (expert_count) is not "
            "a dense Qwen3.5; Qwen3.5 MoE files are arch qwen35moe"
        )
    rec = g.arch_get("attention.recurrent_layers")
    if rec is not None:
        rec = tuple(bool(v) for v in np.asarray(rec).ravel())
        if len(rec) < n_layers:
            raise ModelFormatError(
                f"{g.path}: {g.arch}.attention.recurrent_layers has "
                f"{len(rec)} entries for {n_layers} layers"
            )
        rec = rec[:n_layers]
    else:
        every = int(g.arch_get("full_attention_interval", 4) or 4)
        rec = tuple((i + 1) % every != 0 for i in range(n_layers))
    d_state = int(g.arch_get("ssm.state_size", 0) or 0)
    Hk = int(g.arch_get("ssm.group_count", 0) or 0)
    Hv = int(g.arch_get("ssm.time_step_rank", 0) or 0)
    inner = int(g.arch_get("ssm.inner_size", 0) or 0)
    taps = int(g.arch_get("ssm.conv_kernel", 0) or 0)
    if any(rec) and (
        d_state < 1 or Hk < 1 or Hv < 1 or taps < 1 or Hv % Hk or inner != Hv * d_state
    ):
        raise ModelFormatError(
            f"{g.path}: {g.arch}.ssm.* keys do not describe the linear "
            f"attention (state_size {d_state}, group_count {Hk}, "
            f"time_step_rank {Hv}, inner_size {inner}, conv_kernel {taps})"
        )
    cls = Qwen35MoEConfig if experts else Qwen35Config
    return cls(
        **fields,
        **moe,
        recurrent=rec,
        conv_kernel=taps,
        n_k_heads_lin=Hk,
        n_v_heads_lin=Hv,
        d_state=d_state,
        n_mtp=n_mtp,
    )


def read_moe_config(g: GGUFFile, arch: Arch) -> Qwen35MoEConfig:
    return read_config(g, arch, experts=True)


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
    conv_wT: np.ndarray  # (taps, C) f32: tap j of every channel
    A: np.ndarray  # (Hv,) f32 = -exp(A_log)
    dt_bias: np.ndarray  # (Hv,) f32
    norm: np.ndarray  # (dv,) f32
    w_out: QWeight  # (D, Hv*dv)

    def weights(self) -> list[QWeight]:
        return [
            w
            for w in (self.w_in, self.w_qkv, self.w_z, self.w_ba, self.w_b, self.w_a, self.w_out)
            if w is not None
        ]


@dataclass
class Qwen35LayerWeights(LayerWeights):
    """A llama layer whose attention fields are None in linear layers (``lin`` set)."""

    lin: LinearWeights | None = None
    lin_index: int = -1  # which linear layer (state index), or -1
    kv_index: int = -1  # which attention layer (KV cache layer), or -1

    def weights(self) -> list[QWeight]:
        return super().weights() + (self.lin.weights() if self.lin is not None else [])


@dataclass
class Qwen35MoELayerWeights(Qwen35LayerWeights):
    """A qwen35moe layer: the FFN fields are None, ``moe`` holds the experts."""

    moe: MoEWeights | None = None

    def weights(self) -> list[QWeight]:
        return super().weights() + (self.moe.weights() if self.moe is not None else [])


NO_ATTENTION = dict(
    wqkv=None, wq=None, wk=None, wv=None, bqkv=None, q_norm=None, k_norm=None, wo=None
)


def _load_gated_attention(ld: Loader, cfg: Qwen35Config) -> dict:
    """The attention fields; attn_q has 2 * head_dim rows per head: query, then gate."""
    D, hd, H, KV = cfg.d_model, cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
    wqkv, (wq, wk, wv) = ld.fused(
        ("attn_q.weight", 2 * H * hd, D),
        ("attn_k.weight", KV * hd, D),
        ("attn_v.weight", KV * hd, D),
    )
    if ld.has("attn_q.bias"):
        raise UnsupportedArchitectureError(
            f"{ld.g.path}: {ld.g.arch} with attention biases is not supported"
        )
    return dict(
        wqkv=wqkv,
        wq=wq,
        wk=wk,
        wv=wv,
        bqkv=None,
        q_norm=ld.vec("attn_q_norm.weight", hd),
        k_norm=ld.vec("attn_k_norm.weight", hd),
        wo=ld.mat("attn_output.weight", D, H * hd),
    )


def _load_linear(ld: Loader, cfg: Qwen35Config) -> LinearWeights:
    D, Hk, Hv, d = cfg.d_model, cfg.n_k_heads_lin, cfg.n_v_heads_lin, cfg.d_state
    C, VD = 2 * Hk * d + Hv * d, Hv * d
    w_in, (w_qkv, w_z) = ld.fused(("attn_qkv.weight", C, D), ("attn_gate.weight", VD, D))
    w_ba, (w_b, w_a) = ld.fused(("ssm_beta.weight", Hv, D), ("ssm_alpha.weight", Hv, D))
    conv = ld.array("ssm_conv1d.weight", C, cfg.conv_kernel)
    return LinearWeights(
        w_in=w_in,
        w_qkv=w_qkv,
        w_z=w_z,
        w_ba=w_ba,
        w_b=w_b,
        w_a=w_a,
        conv_wT=np.ascontiguousarray(conv.T, dtype=np.float32),
        A=ld.vec("ssm_a", Hv),
        dt_bias=ld.vec("ssm_dt.bias", Hv),
        norm=ld.vec("ssm_norm.weight", d),
        w_out=ld.mat("ssm_out.weight", D, VD),
    )


def load_layer(g: GGUFFile, cfg: Qwen35Config, i: int) -> Qwen35LayerWeights:
    """Layer i: a linear (Gated DeltaNet) or attention mixer, then a dense or MoE FFN."""
    ld, D = Loader.layer(g, i), cfg.d_model
    n_lin = sum(cfg.recurrent[:i])  # linear layers before this one
    if not cfg.recurrent[i]:
        mixer = dict(**_load_gated_attention(ld, cfg), lin=None, lin_index=-1, kv_index=i - n_lin)
    else:
        mixer = dict(**NO_ATTENTION, lin=_load_linear(ld, cfg), lin_index=n_lin, kv_index=-1)
    attn_norm, ffn_norm = ld.vec("attn_norm.weight", D), ld.vec("post_attention_norm.weight", D)
    if not isinstance(cfg, Qwen35MoEConfig):
        return Qwen35LayerWeights(
            attn_norm=attn_norm, ffn_norm=ffn_norm, **mixer, **load_gated_ffn(ld, cfg.d_ff, D)
        )
    if not ld.has("ffn_gate_inp.weight"):
        raise ld.error(f"qwen35moe layer {i} has no expert router (blk.{i}.ffn_gate_inp.weight)")
    return Qwen35MoELayerWeights(
        attn_norm=attn_norm, ffn_norm=ffn_norm, **mixer, **NO_FFN, moe=load_moe(ld, cfg, D)
    )


# ============================================================================ the family


class Qwen35Family(Family):
    """Weights and forward step of Qwen3.5 dense models."""

    capturable = True
    weight_types = (Qwen35LayerWeights, LinearWeights)
    read_config = staticmethod(read_config)
    load_layer = staticmethod(load_layer)

    def forward(
        self,
        batch: Batch,
        k_cache: np.ndarray,
        v_cache: np.ndarray,
        logits: np.ndarray | None = None,
    ) -> np.ndarray:
        """k_cache/v_cache hold the attention layers only, and every segment carries its
        sequence's recurrent state (segment.rec, a SeqRecurrent)."""
        ops, cfg, nt, S = self.ops, self.cfg, self.threads, self.scratch
        for seg in batch.segments:
            if seg.rec is None:
                raise ValueError("a Qwen3.5 forward step needs every sequence's recurrent state")
        T, D = len(batch.tokens), cfg.d_model
        x = self.embed(batch.tokens, S.get("x", T, D))  # (T, D) residual stream
        h = S.get("h", T, D)
        o = S.get("o", T, D)
        for li, L in enumerate(self.layers):
            ops.rmsnorm(x, L.attn_norm, cfg.norm_eps, out=h, nthreads=nt)
            if L.lin is not None:
                self.linear_block(L, h, batch, o)
            else:
                self.attention_block(li, L, h, batch, k_cache[L.kv_index], v_cache[L.kv_index], o)
            ops.add(x, o, out=x, nthreads=nt)
            ops.rmsnorm(x, L.ffn_norm, cfg.norm_eps, out=h, nthreads=nt)
            self.ffn_block(L, h, o)
            ops.add(x, o, out=x, nthreads=nt)
        return self.head(x, batch.logit_rows, logits, batch.hidden)

    def attention_block(self, li: int, L: Qwen35LayerWeights, h, batch: Batch, kc, vc, out) -> None:
        """Gated attention: normed h (T, D) -> out (T, D); writes K/V."""
        ops, cfg, S, nt = self.ops, self.cfg, self.scratch, self.threads
        T = h.shape[0]
        H, KV, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        nqg, nkv = 2 * H * hd, KV * hd
        a = Act(ops, h, S.qact(T, h.shape[1]), nt)
        if L.wqkv is not None:
            qkv = self.mm(a, L.wqkv, S.get("att_qkv", T, nqg + 2 * nkv))  # (T, 2H hd + 2 KV hd)
            qg_src, k_src, v_src = qkv[:, :nqg], qkv[:, nqg : nqg + nkv], qkv[:, nqg + nkv :]
        else:
            qg_src = self.mm(a, L.wq, S.get("att_qg_mm", T, nqg))
            k_src = self.mm(a, L.wk, S.get("att_k_mm", T, nkv))
            v_src = self.mm(a, L.wv, S.get("att_v_mm", T, nkv))
        qg = S.get("att_qg", T, H, 2 * hd)  # per head: query (hd) | gate (hd)
        ops.copy2d(qg_src, out=qg.reshape(T, nqg), nthreads=nt)
        q, gate = S.get("att_q", T, H, hd), S.get("att_gate", T, H, hd)
        ops.copy2d(qg.reshape(T * H, 2 * hd)[:, :hd], out=q.reshape(T * H, hd), nthreads=nt)
        ops.copy2d(qg.reshape(T * H, 2 * hd)[:, hd:], out=gate.reshape(T * H, hd), nthreads=nt)
        k, v = S.get("att_k", T, KV, hd), S.get("att_v", T, KV, hd)
        ops.copy2d(k_src, out=k.reshape(T, nkv), nthreads=nt)
        ops.copy2d(v_src, out=v.reshape(T, nkv), nthreads=nt)
        ops.rmsnorm(q, L.q_norm, cfg.norm_eps, out=q, nthreads=nt)
        ops.rmsnorm(k, L.k_norm, cfg.norm_eps, out=k, nthreads=nt)
        cos, sin, rows = self.rope.rows(batch)  # (T, n_rot/2) each, rows (T,): row t -> t
        ops.rope(q, rows, cos, sin, cfg.rope_neox, out=q, nthreads=nt)
        ops.rope(k, rows, cos, sin, cfg.rope_neox, out=k, nthreads=nt)
        ops.kv_write(kc, vc, k, v, batch.slots, nthreads=nt)
        att = self.attend(li, q, kc, vc, batch, S.get("att_out", T, H, hd), 0, 0.0, None)
        flat = att.reshape(T, H * hd)
        ops.sigmoid_mul(gate.reshape(T, H * hd), flat, out=flat, nthreads=nt)
        self.mm(Act(ops, flat, S.qact(T, H * hd), nt), L.wo, out)

    def linear_block(self, L: Qwen35LayerWeights, h, batch: Batch, out) -> None:
        """Gated DeltaNet: normed h (T, D) -> out (T, D); updates each segment's state."""
        ops, cfg, S, nt = self.ops, self.cfg, self.scratch, self.threads
        W, T = L.lin, h.shape[0]
        Hk, Hv, d = cfg.n_k_heads_lin, cfg.n_v_heads_lin, cfg.d_state
        C, VD = 2 * Hk * d + Hv * d, Hv * d
        a = Act(ops, h, S.qact(T, h.shape[1]), nt)
        if W.w_in is not None:
            pz = self.mm(a, W.w_in, S.get("lin_in", T, C + VD))  # (T, C + VD): qkv | z
            mixed, z = pz[:, :C], pz[:, C:]
        else:
            mixed = self.mm(a, W.w_qkv, S.get("lin_qkv", T, C))
            z = self.mm(a, W.w_z, S.get("lin_z", T, VD))
        if W.w_ba is not None:
            ab = self.mm(a, W.w_ba, S.get("lin_ab", T, 2 * Hv))  # (T, 2 Hv): beta | alpha
        else:
            ab = S.get("lin_ab", T, 2 * Hv)
            ops.copy2d(self.mm(a, W.w_b, S.get("lin_b", T, Hv)), out=ab[:, :Hv], nthreads=nt)
            ops.copy2d(self.mm(a, W.w_a, S.get("lin_a", T, Hv)), out=ab[:, Hv:], nthreads=nt)
        conv = S.get("lin_conv", T, C)
        core = S.get("lin_core", T, VD)
        i = L.lin_index
        for seg in batch.segments:
            r, rec = slice(seg.start, seg.stop), seg.rec
            rows, snap_conv, snap_ssm = rec.layer_snaps(i)
            ops.ssm_conv(
                mixed[r],
                W.conv_wT,
                rec.state.conv[i],
                out=conv[r],
                snap_rows=rows,
                snaps=snap_conv,
                nthreads=nt,
            )
            ops.gated_delta(
                conv[r],
                ab[r],
                W.A,
                W.dt_bias,
                rec.state.ssm[i],
                Hk,
                out=core[r],
                snap_rows=rows,
                snaps=snap_ssm,
                eps=L2_EPS,
                nthreads=nt,
            )
        normed = S.get("lin_normed", T, VD)
        ops.rmsnorm(
            core.reshape(T * Hv, d),
            W.norm,
            cfg.norm_eps,
            out=normed.reshape(T * Hv, d),
            nthreads=nt,
        )
        y = ops.swiglu(z, normed, out=S.get("lin_y", T, VD), nthreads=nt)  # silu(z) * normed
        self.mm(Act(ops, y, S.qact(T, VD), nt), W.w_out, out)

    def ffn_block(self, L: Qwen35LayerWeights, h, out) -> None:
        """Normed input h (T, D) -> feed-forward output out (T, D)."""
        self.gated_ffn(L, h, out)


class Qwen35MoEFamily(Qwen35Family):
    """Qwen3.5 MoE: Qwen35Family's mixers, the routed experts of models/experts.py (router,
    expert-major GEMMs, shared expert, fold) in every layer."""

    capturable = False  # not vetted for graph replay: its decode steps run the Python path
    weight_types = (Qwen35MoELayerWeights, LinearWeights, MoEWeights, FFNWeights)
    read_config = staticmethod(read_moe_config)

    def __init__(
        self,
        g: GGUFFile,
        cfg: Qwen35MoEConfig,
        ops,
        threads: int,
        progress=None,
        weights: dict | None = None,
    ):
        super().__init__(g, cfg, ops, threads, progress, weights)
        self.moe = MoEFFN(self)

    def ffn_block(self, L: Qwen35MoELayerWeights, h, out) -> None:
        self.moe(L.moe, h, out)
