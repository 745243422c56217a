"""The Gemma 4 family (GGUF arch ``gemma4``): the text part of Gemma 4 (E2B, E4B, 31B; 26B-A4B MoE).

Gemma 3's step (models/gemma.py: sliding/global layers, QK-norm, post-attention and post-FFN
norms, GeGLU, embeddings scaled by sqrt(d_model), a final logit softcap) with these changes
(the whole step is in this file):

  - per-layer attention geometry: sliding layers have ``key_length_swa`` heads dims and
    ``head_count_kv[i]`` kv heads, global layers ``key_length`` (wider) and their own kv heads;
  - RoPE (NeoX) per layer kind: sliding layers base ``rope.freq_base_swa`` over
    ``rope.dimension_count_swa`` dims; global layers base ``rope.freq_base`` over the whole
    head with ``rope_freqs`` (transformers' "proportional" RoPE: the converter writes factor
    1e30 for the pairs that do not rotate, so their angle is 0);
  - attention scale 1.0 (q and k are RMS-normed), no attention softcap;
  - V: RMS-normed without a weight; a layer without ``attn_v`` uses its raw K as V
    (``attention_k_eq_v``);
  - KV sharing: the last ``attention.shared_kv_layers`` layers compute only Q and read the KV
    of the last earlier layer of the same kind (sliding / global), so the KV cache holds the
    first n_layers - shared layers only (``cfg.kv_source`` maps a layer to its cache layer);
  - the MLP width is per layer (``feed_forward_length`` array: double-wide in shared layers);
  - per-layer embeddings (``embedding_length_per_layer_input`` P > 0, E2B/E4B): before the
    layers, ``ple = (rmsnorm(x0 W_proj / sqrt(D)) + E_pl[token] sqrt(P)) / sqrt(2)``, (T, L, P);
    after layer i's FFN residual, ``x += rmsnorm(W_proj_i (gelu(W_gate_i x) * ple[:, i]))``;
  - ``layer_output_scale``: the whole residual stream is multiplied by it after each layer.

The MoE variant (26B-A4B, ``Gemma4MoEFamily``): in a layer with a router ``ffn_gate_inp``,
the dense MLP runs as a shared expert beside the routed experts, each branch with its own norms:

  dense = rmsnorm(MLP(rmsnorm(x, ffn_norm)), post_ffw_norm_1)
  r     = rmsnorm(x) * ffn_gate_inp.scale / sqrt(D)        (x: the residual after attention)
  ids, w = top k of softmax(r W_router), renormalized, times ffn_down_exps.scale[ids]
  moe   = rmsnorm(sum_r w_r GeGLU_expert(rmsnorm(x, pre_ffw_norm_2)), post_ffw_norm_2)
  x    += rmsnorm(dense + moe, post_ffw_norm)
with the experts expert-major and the float64 rank-order fold of models/experts.py (no renorm
in the fold: the per-expert scales make the weights sum to anything).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from goinfer.errors import ModelFormatError, UnsupportedArchitectureError
from goinfer.models.base import Act, Batch, ModelConfig, RopeCache
from goinfer.models.experts import (
    ExpertFields,
    FFNWeights,
    MoEFFN,
    has_experts,
    load_experts,
    read_experts,
)
from goinfer.models.family import Family, LayerWeights, load_gated_ffn
from goinfer.models.gemma import ROPE_BASE_LOCAL
from goinfer.models.loading import Loader, config_fields, per_layer_ints, require, swa_layers
from goinfer.quant import QWeight

if TYPE_CHECKING:
    from goinfer.gguf import GGUFFile
    from goinfer.models.arch import Arch

# ============================================================================ config


@dataclass
class Gemma4Config(ModelConfig):
    rope_base_local: float = ROPE_BASE_LOCAL  # RoPE base of the sliding layers
    attn_scale: float = 1.0  # multiplies q.k (q and k are RMS-normed)
    final_softcap: float = 0.0  # 0: none
    head_dim_swa: int = 0  # head dim of the sliding layers (head_dim: the global layers')
    rope_dim_swa: int = 0  # rotated dims of the sliding layers
    layer_heads_kv: tuple = ()  # per layer: kv heads
    layer_d_ff: tuple = ()  # per layer: MLP width
    kv_source: tuple = ()  # per layer: the cache layer whose KV it reads (and writes, if own)
    n_shared_kv: int = 0  # the last layers, which read an earlier layer's KV
    per_layer_dim: int = 0  # P: width of the per-layer embeddings (0: none)

    @property
    def n_kv_layers(self) -> int:  # the first layers hold their own KV
        return self.n_layers - self.n_shared_kv

    @property
    def n_attn_layers(self) -> int:  # every layer attends (the shared ones over others' KV)
        return self.n_layers

    def kv_geometry(self) -> tuple[tuple[int, int], ...]:  # sliding and global layers differ
        return tuple(
            (self.layer_heads_kv[j], self.layer_head_dim(j)) for j in range(self.n_kv_layers)
        )

    def layer_head_dim(self, li: int) -> int:
        return self.head_dim_swa if self.swa_layers[li] else self.head_dim

    def describe(self) -> str:
        n_local = sum(self.swa_layers)
        s = (
            super().describe() + f", {n_local} local layers (window {self.sliding_window}) + "
            f"{self.n_layers - n_local} global, head dims {self.head_dim_swa} (local) / "
            f"{self.head_dim} (global)"
        )
        if self.n_shared_kv:
            s += f", last {self.n_shared_kv} layers reuse earlier KV"
        if self.per_layer_dim:
            s += f", per-layer embeddings {self.per_layer_dim}"
        return s


@dataclass
class Gemma4MoEConfig(Gemma4Config, ExpertFields):
    def describe(self) -> str:
        return (
            super().describe() + f", {self.n_expert} experts (top {self.n_expert_used}, "
            f"ffn {self.d_ff_expert}) beside the dense MLP"
        )


def read_config(g: GGUFFile, arch: Arch) -> Gemma4Config:
    n = int(require(g, "block_count"))
    if g.has_tensor("blk.0.attn_qkv.weight"):
        raise UnsupportedArchitectureError(
            f"{g.path}: gemma4 with a fused attn_qkv tensor is not supported yet"
        )
    kv = per_layer_ints(g, "attention.head_count_kv", n, g.arch_get("attention.head_count"))
    ff = per_layer_ints(g, "feed_forward_length", n)
    hd = int(require(g, "attention.key_length"))
    hd_swa = int(g.arch_get("attention.key_length_swa", hd))
    if (
        int(g.arch_get("attention.value_length", hd)) != hd
        or int(g.arch_get("attention.value_length_swa", hd_swa)) != hd_swa
    ):
        raise UnsupportedArchitectureError(f"{g.path}: gemma4 with value_length != key_length")
    fields = config_fields(g, arch, n_kv_heads=kv[0], d_ff=max(ff))
    swa = swa_layers(g, n, fields["sliding_window"], arch.swa_pattern)  # no window: all global
    fields.update(qk_norm=True, swa_layers=swa)
    n_shared = int(g.arch_get("attention.shared_kv_layers", 0) or 0)
    n_own = n - n_shared
    if not 0 < n_own <= n:
        raise ModelFormatError(f"{g.path}: {n_shared} shared-KV layers of {n}")
    src = list(range(n_own))
    for i in range(n_own, n):  # the last own-KV layer of the same kind
        own = [j for j in range(n_own) if swa[j] == swa[i]]
        if not own:
            raise ModelFormatError(
                f"{g.path}: layer {i} reuses the KV of an earlier "
                f"{'sliding' if swa[i] else 'global'} layer, and there is none"
            )
        src.append(own[-1])
    for i in range(n):
        if fields["n_heads"] % kv[i]:
            raise ModelFormatError(
                f"{g.path}: {fields['n_heads']} heads is not a multiple of "
                f"{kv[i]} kv heads (layer {i})"
            )
    cls, experts = Gemma4Config, {}
    if has_experts(g) or int(g.arch_get("expert_count", 0) or 0) > 0:
        cls, experts = Gemma4MoEConfig, read_experts(g, arch, n, fields["d_model"])
        # the router's softmax weights, renormalized, times the per-expert scales: the file's
        # expert_weights_norm / expert_weights_scale do not apply
        experts.update(norm_topk=arch.norm_topk, expert_weights_scale=1.0)
    return cls(
        **fields,
        **experts,
        rope_base_local=float(g.arch_get("rope.freq_base_swa", ROPE_BASE_LOCAL)),
        attn_scale=1.0,  # q and k are RMS-normed; llama.cpp fixes it at 1 for gemma4 too
        final_softcap=float(g.arch_get("final_logit_softcapping", 0.0) or 0.0),
        head_dim_swa=hd_swa,
        rope_dim_swa=int(g.arch_get("rope.dimension_count_swa", hd_swa)),
        layer_heads_kv=kv,
        layer_d_ff=ff,
        kv_source=tuple(src),
        n_shared_kv=n_shared,
        per_layer_dim=int(g.arch_get("embedding_length_per_layer_input", 0) or 0),
    )


# ============================================================================ weights


@dataclass
class Gemma4MoEWeights:
    """A Gemma 4 MoE layer's router and experts (the dense MLP stays in the layer)."""

    router: QWeight  # (E, D)
    router_scale: np.ndarray  # (D,) ffn_gate_inp.scale
    experts: list  # FFNWeights per expert (gate | up fused when possible)
    expert_scale: np.ndarray  # (E,) ffn_down_exps.scale: multiplies each expert's weight
    pre_norm_2: np.ndarray  # (D,) the experts' input norm
    post_norm_1: np.ndarray  # (D,) the dense MLP's output norm
    post_norm_2: np.ndarray  # (D,) the experts' output norm

    def weights(self) -> list[QWeight]:
        return [self.router] + [w for x in self.experts for w in x.weights()]


def load_moe(ld: Loader, cfg: Gemma4MoEConfig) -> Gemma4MoEWeights:
    D, E = cfg.d_model, cfg.n_expert
    router = ld.mat("ffn_gate_inp.weight", E, D)
    experts = load_experts(ld, E, cfg.d_ff_expert, D)
    scale = (
        ld.vec("ffn_down_exps.scale", E)
        if ld.has("ffn_down_exps.scale")
        else np.ones(E, np.float32)
    )
    return Gemma4MoEWeights(
        router,
        ld.vec("ffn_gate_inp.scale", D),
        experts,
        scale,
        ld.vec("pre_ffw_norm_2.weight", D),
        ld.vec("post_ffw_norm_1.weight", D),
        ld.vec("post_ffw_norm_2.weight", D),
    )


@dataclass
class Gemma4LayerWeights(LayerWeights):
    post_attn_norm: np.ndarray = None  # (D,) f32, applied to the attention output
    post_ffn_norm: np.ndarray = None  # (D,) f32, applied to the FFN output
    out_scale: float = 1.0  # layer_output_scale: multiplies the residual after the layer
    k_eq_v: bool = False  # no attn_v: V is the raw K
    ple_gate: QWeight | None = None  # (P, D) per-layer input gate
    ple_proj: QWeight | None = None  # (D, P)
    ple_norm: np.ndarray | None = None  # (D,)
    moe: Gemma4MoEWeights | None = None  # MoE layers: router and experts beside the MLP

    def weights(self) -> list[QWeight]:
        return (
            super().weights()
            + [w for w in (self.ple_gate, self.ple_proj) if w is not None]
            + (self.moe.weights() if self.moe is not None else [])
        )


def load_layer(g: GGUFFile, cfg: Gemma4Config, i: int) -> Gemma4LayerWeights:
    ld, D, H = Loader.layer(g, i), cfg.d_model, cfg.n_heads
    hd, kvh, F = cfg.layer_head_dim(i), cfg.layer_heads_kv[i], cfg.layer_d_ff[i]
    own = i < cfg.n_kv_layers
    k_eq_v = own and not ld.has("attn_v.weight")
    wqkv, wq, wk, wv, k_norm = None, None, None, None, None
    if own:  # q | k [| v], one matmul when they fuse
        rows = (("q", H * hd), ("k", kvh * hd)) + ((("v", kvh * hd),) if not k_eq_v else ())
        wqkv, parts = ld.fused(*((f"attn_{n}.weight", m, D) for n, m in rows))
        wq, wk, wv = (parts + (None,))[:3]
        k_norm = ld.vec("attn_k_norm.weight", hd)
    else:  # a shared-KV layer: Q only
        wq = ld.mat("attn_q.weight", H * hd, D)
    wo = ld.mat("attn_output.weight", D, H * hd)
    ffn = load_gated_ffn(ld, F, D)
    scale = 1.0
    if ld.has("layer_output_scale.weight"):
        s = np.asarray(g.load_f32(ld.prefix + "layer_output_scale.weight")).ravel()
        if s.shape != (1,) or not np.isfinite(s[0]):
            raise ld.error(f"tensor {ld.prefix}layer_output_scale.weight must be one finite value")
        scale = float(s[0])
    extra = {}
    if cfg.per_layer_dim:
        P = cfg.per_layer_dim
        extra.update(
            ple_gate=ld.mat("inp_gate.weight", P, D),
            ple_proj=ld.mat("proj.weight", D, P),
            ple_norm=ld.vec("post_norm.weight", D),
        )
    if ld.has("ffn_gate_inp.weight"):
        if not isinstance(cfg, Gemma4MoEConfig):
            raise ld.error(f"layer {i} has an expert router but the file has no expert_count")
        extra["moe"] = load_moe(ld, cfg)
    return Gemma4LayerWeights(
        attn_norm=ld.vec("attn_norm.weight", D),
        wqkv=wqkv,
        wq=wq,
        wk=wk,
        wv=wv,
        bqkv=None,
        q_norm=ld.vec("attn_q_norm.weight", hd),
        k_norm=k_norm,
        wo=wo,
        ffn_norm=ld.vec("ffn_norm.weight", D),
        **ffn,
        post_attn_norm=ld.vec("post_attention_norm.weight", D),
        post_ffn_norm=ld.vec("post_ffw_norm.weight", D),
        out_scale=scale,
        k_eq_v=k_eq_v,
        **extra,
    )


# ============================================================================ the family


class Gemma4Family(Family):
    """Weights and forward step of Gemma 4 dense text models (the module docstring)."""

    capturable = True
    weight_types = (Gemma4LayerWeights,)
    ffn_act = "gelu_tanh_mul"
    read_config = staticmethod(read_config)
    load_layer = staticmethod(load_layer)

    def __init__(
        self,
        g: GGUFFile,
        cfg: Gemma4Config,
        ops,
        threads: int,
        progress=None,
        weights: dict | None = None,
    ):
        if weights is None:
            weights = self.load_weights(g, cfg, progress)
        super().__init__(g, cfg, ops, threads, progress, weights)
        rf = weights["rope_freqs"]
        if rf is not None and rf.shape != (cfg.n_rot // 2,):
            raise ModelFormatError(
                f"{g.path}: rope_freqs has shape {rf.shape}, expected ({cfg.n_rot // 2},)"
            )
        # global layers: self.rope (rope.freq_base, rope_freqs); sliding: their own dims and base
        self.rope_local = RopeCache(cfg.rope_dim_swa, cfg.rope_base_local, cfg.context_length)
        self.embed_scale = np.float32(np.sqrt(cfg.d_model))
        self.final_softcap = cfg.final_softcap
        self.ple_embd = weights["ple_embd"]  # (vocab, L*P) rows
        self.ple_model_proj = weights["ple_model_proj"]  # (L*P, D)
        self.ple_proj_norm = weights["ple_proj_norm"]  # (P,)
        self.ones = {hd: np.ones(hd, np.float32) for hd in {cfg.head_dim, cfg.head_dim_swa}}

    @classmethod
    def load_weights(cls, g: GGUFFile, cfg: Gemma4Config, progress=None, keep=None) -> dict:
        w = super().load_weights(g, cfg, progress, keep)
        keep = keep or (lambda obj: obj)
        w.update(ple_embd=None, ple_model_proj=None, ple_proj_norm=None)
        if cfg.per_layer_dim:
            ld, LP = Loader(g), cfg.n_layers * cfg.per_layer_dim
            w.update(
                ple_embd=keep(ld.mat("per_layer_token_embd.weight", cfg.vocab_size, LP)),
                ple_model_proj=keep(ld.mat("per_layer_model_proj.weight", LP, cfg.d_model)),
                ple_proj_norm=ld.vec("per_layer_proj_norm.weight", cfg.per_layer_dim),
            )
        return w

    @classmethod
    def row_table_names(cls, top: dict) -> tuple[str, ...]:
        """The per-layer embedding table too (read by token, like tok_embd)."""
        ple = ("ple_embd",) if top.get("ple_embd") is not None else ()
        return super().row_table_names(top) + ple

    def weights(self) -> list[QWeight]:
        return super().weights() + [
            w for w in (self.ple_embd, self.ple_model_proj) if w is not None
        ]

    def layer_rope(self, li: int) -> RopeCache:
        return self.rope_local if self.cfg.swa_layers[li] else self.rope

    # ------------------------------------------------------------------ forward

    def forward(
        self, batch: Batch, k_cache, v_cache, logits: np.ndarray | None = None
    ) -> np.ndarray:
        """The llama step's loop with Gemma 4's per-layer KV source, per-layer embeddings and
        output scale (k_cache[l], v_cache[l]: cache layer l, ModelConfig.kv_geometry)."""
        ops, cfg, nt, S = self.ops, self.cfg, self.threads, self.scratch
        T, D = len(batch.tokens), cfg.d_model
        x = self.embed(batch.tokens, S.get("x", T, D))  # (T, D) residual stream
        ple = self.per_layer_inputs(batch.tokens, x) if cfg.per_layer_dim else None  # (T, L*P)
        h = S.get("h", T, D)
        o = S.get("o", T, D)
        for li, L in enumerate(self.layers):
            src = cfg.kv_source[li]
            ops.rmsnorm(x, L.attn_norm, cfg.norm_eps, out=h, nthreads=nt)
            self.attention_block(li, L, h, batch, k_cache[src], v_cache[src], o)
            ops.add(x, o, out=x, nthreads=nt)
            ops.rmsnorm(x, L.ffn_norm, cfg.norm_eps, out=h, nthreads=nt)
            if L.moe is None:
                self.ffn_block(L, h, o)
            else:  # Gemma4MoEFamily: routed experts beside the dense MLP
                self.moe_block(L, x, h, o)
            ops.add(x, o, out=x, nthreads=nt)
            if ple is not None:
                self.per_layer_block(li, L, x, ple, o)
                ops.add(x, o, out=x, nthreads=nt)
            if L.out_scale != 1.0:
                ops.scale(x, L.out_scale, out=x, nthreads=nt)
        return self.head(x, batch.logit_rows, logits, batch.hidden)

    def per_layer_inputs(self, tokens: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Per-layer embeddings of the tokens, (T, L*P): (rmsnorm_P(x W / sqrt(D)) +
        E[token] sqrt(P)) / sqrt(2), x (T, D) the scaled token embeddings."""
        ops, cfg, nt, S = self.ops, self.cfg, self.threads, self.scratch
        T, P = len(tokens), cfg.per_layer_dim
        LP = cfg.n_layers * P
        e = self.get_rows("ple_embd", self.ple_embd, tokens, S.get("ple_e", T, LP))  # (T, LP)
        ops.scale(e, np.float32(np.sqrt(P)), out=e, nthreads=nt)
        pr = self.mm(
            Act(ops, x, S.qact(T, cfg.d_model), nt), self.ple_model_proj, S.get("ple", T, LP)
        )  # (T, LP)
        ops.scale(pr, np.float32(1.0 / np.sqrt(cfg.d_model)), out=pr, nthreads=nt)
        prl = pr.reshape(T * cfg.n_layers, P)  # (T L, P): one norm per layer slice
        ops.rmsnorm(prl, self.ple_proj_norm, cfg.norm_eps, out=prl, nthreads=nt)
        ops.add(pr, e, out=pr, nthreads=nt)
        return ops.scale(pr, np.float32(1.0 / np.sqrt(2.0)), out=pr, nthreads=nt)

    def per_layer_block(self, li: int, L: Gemma4LayerWeights, x, ple, out) -> None:
        """Layer li's per-layer-embedding branch: out = rmsnorm(W_proj (gelu(W_gate x) *
        ple[:, li]))  (T, D)."""
        ops, cfg, nt, S = self.ops, self.cfg, self.threads, self.scratch
        T, P = x.shape[0], cfg.per_layer_dim
        g = self.mm(Act(ops, x, S.qact(T, cfg.d_model), nt), L.ple_gate, S.get("pg", T, P))
        pl = ops.copy2d(ple[:, li * P : (li + 1) * P], out=S.get("pl", T, P), nthreads=nt)  # (T, P)
        ops.gelu_tanh_mul(g, pl, out=g, nthreads=nt)
        self.mm(Act(ops, g, S.qact(T, P), nt), L.ple_proj, out)
        ops.rmsnorm(out, L.ple_norm, cfg.norm_eps, out=out, nthreads=nt)

    def attention_block(self, li, L: Gemma4LayerWeights, h, batch, kc, vc, out) -> None:
        """Q of layer li; K/V written only by a layer with its own KV (a shared layer reads
        its source layer's cache); attention with scale 1; output projection; post-norm."""
        ops, cfg, S, nt = self.ops, self.cfg, self.scratch, self.threads
        T = h.shape[0]
        H, hd, KV = cfg.n_heads, cfg.layer_head_dim(li), cfg.layer_heads_kv[li]
        nq, nkv = H * hd, KV * hd
        q = S.get(f"q{hd}", T, H, hd)
        a = Act(ops, h, S.qact(T, h.shape[1]), nt)
        own = li < cfg.n_kv_layers
        k = v = None
        if own:
            k, v = S.get(f"k{hd}_{KV}", T, KV, hd), S.get(f"v{hd}_{KV}", T, KV, hd)
        if L.wqkv is not None:  # q | k [| v]
            n_all = L.wqkv.n_out
            qkv = self.mm(a, L.wqkv, S.get(f"qkv{n_all}", T, n_all))
            ops.copy2d(qkv[:, :nq], out=q.reshape(T, nq), nthreads=nt)
            ops.copy2d(qkv[:, nq : nq + nkv], out=k.reshape(T, nkv), nthreads=nt)
            if not L.k_eq_v:
                ops.copy2d(qkv[:, nq + nkv :], out=v.reshape(T, nkv), nthreads=nt)
        else:
            self.mm(a, L.wq, q.reshape(T, nq))
            if own:
                self.mm(a, L.wk, k.reshape(T, nkv))
                if not L.k_eq_v:
                    self.mm(a, L.wv, v.reshape(T, nkv))
        ops.rmsnorm(q, L.q_norm, cfg.norm_eps, out=q, nthreads=nt)
        rope = self.layer_rope(li)
        cos, sin, rows = rope.rows(batch)  # (T, n_rot/2) each, rows (T,): row t -> t
        ops.rope(q, rows, cos, sin, cfg.rope_neox, out=q, nthreads=nt)
        window = self.layer_window(li)  # a shared layer's is its source layer's
        if own:  # V = rmsnorm(v) without weight (of the raw K when there is no v projection)
            ops.rmsnorm(k if L.k_eq_v else v, self.ones[hd], cfg.norm_eps, out=v, nthreads=nt)
            ops.rmsnorm(k, L.k_norm, cfg.norm_eps, out=k, nthreads=nt)
            ops.rope(k, rows, cos, sin, cfg.rope_neox, out=k, nthreads=nt)
            ops.kv_write(kc, vc, k, v, batch.slots_for(window), nthreads=nt)
        att = self.attend(
            li, q, kc, vc, batch, S.get(f"att{hd}", T, H, hd), window, 0.0, cfg.attn_scale
        )
        self.mm(Act(ops, att.reshape(T, nq), S.qact(T, nq), nt), L.wo, out)
        ops.rmsnorm(out, L.post_attn_norm, cfg.norm_eps, out=out, nthreads=nt)

    def ffn_block(self, L: Gemma4LayerWeights, h, out) -> None:
        """The dense MLP of normed h (T, D) -> out (T, D), post-normed."""
        self.gated_ffn(L, h, out)
        self.ops.rmsnorm(out, L.post_ffn_norm, self.cfg.norm_eps, out=out, nthreads=self.threads)


# ============================================================================ MoE


class Gemma4MoEFamily(Gemma4Family):
    """Gemma 4 with routed experts beside the dense MLP (26B-A4B): Gemma4Family's step, the
    experts run by models/experts.py's MoEFFN (expert-major GEMMs and the fold)."""

    capturable = False  # the per-expert scales are applied by NumPy, outside the kernels
    weight_types = (Gemma4LayerWeights, Gemma4MoEWeights, FFNWeights)

    def __init__(
        self,
        g: GGUFFile,
        cfg: Gemma4MoEConfig,
        ops,
        threads: int,
        progress=None,
        weights: dict | None = None,
    ):
        super().__init__(g, cfg, ops, threads, progress, weights)
        self.moe = MoEFFN(self, "gelu_tanh_mul")

    def moe_block(self, L: Gemma4LayerWeights, x, h, out) -> None:
        """x (T, D) the residual after attention, h = rmsnorm(x, ffn_norm) -> out (T, D), the
        layer's FFN output after post_ffw_norm (module docstring)."""
        ops, cfg, S, nt = self.ops, self.cfg, self.scratch, self.threads
        M, eps = L.moe, cfg.norm_eps
        T, D = x.shape
        self.gated_ffn(L, h, out)  # the dense MLP
        ops.rmsnorm(out, M.post_norm_1, eps, out=out, nthreads=nt)
        r = ops.rmsnorm(x, M.router_scale, eps, out=S.get("moe_r", T, D), nthreads=nt)
        ops.scale(r, np.float32(1.0 / np.sqrt(D)), out=r, nthreads=nt)
        logits = self.mm(
            Act(ops, r, self.moe.qact("moe_r", T, D), nt),
            M.router,
            S.get("moe_logits", T, cfg.n_expert),
        )  # (T, E)
        ids, w = self.moe.route(logits)
        np.multiply(w, M.expert_scale[ids], out=w)  # (T, k) float32, per-expert scales
        h2 = ops.rmsnorm(x, M.pre_norm_2, eps, out=S.get("moe_h2", T, D), nthreads=nt)
        y, pos = self.moe.experts(M, h2, ids)
        o2 = ops.moe_fold(
            y, w, pos, None, None, renorm=False, out=S.get("moe_o2", T, D), nthreads=nt
        )
        ops.rmsnorm(o2, M.post_norm_2, eps, out=o2, nthreads=nt)
        ops.add(out, o2, out=out, nthreads=nt)
        ops.rmsnorm(out, L.post_ffn_norm, eps, out=out, nthreads=nt)
