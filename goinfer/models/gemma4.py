"""The Gemma 4 family (GGUF arch ``gemma4``): the text part of Gemma 4 (E2B, E4B, 31B; 26B-A4B MoE).

Gemma 3's step (models/gemma.py: sliding/global layers, QK-norm, post-attention and post-FFN
norms, GeGLU, embeddings scaled by sqrt(d_model), a final logit softcap) with these changes:

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
with the experts expert-major and the float64 rank-order fold of models/moe.py (no renorm in
the fold: the per-expert scales make the weights sum to anything).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from goinfer.errors import ModelFormatError, UnsupportedArchitectureError
from goinfer.models import gemma, llama, moe
from goinfer.models.base import Act, Batch, RopeCache
from goinfer.quant import QWeight, concat_rows

# ============================================================================ config


@dataclass
class Gemma4Config(gemma.Gemma3Config):
    head_dim_swa: int = 0  # head dim of the sliding layers (head_dim: the global layers')
    rope_dim_swa: int = 0  # rotated dims of the sliding layers
    layer_heads_kv: tuple = ()  # per layer: kv heads
    layer_d_ff: tuple = ()  # per layer: MLP width
    kv_source: tuple = ()  # per layer: the cache layer whose KV it reads (and writes, if own)
    n_kv_layers: int = 0  # layers with their own KV (the first ones)
    kv_layers: tuple = ()  # per cache layer: (n_kv_heads, head_dim) (kv_cache.kv_geometry)
    per_layer_dim: int = 0  # P: width of the per-layer embeddings (0: none)

    @property
    def n_attn_layers(self) -> int:  # every layer attends (the shared ones over others' KV)
        return self.n_layers

    def layer_head_dim(self, li: int) -> int:
        return self.head_dim_swa if self.swa_layers[li] else self.head_dim

    def describe(self) -> str:
        s = (super().describe() + f", head dims {self.head_dim_swa} (local) / {self.head_dim} "
             f"(global)")
        if self.n_kv_layers < self.n_layers:
            s += f", last {self.n_layers - self.n_kv_layers} layers reuse earlier KV"
        if self.per_layer_dim:
            s += f", per-layer embeddings {self.per_layer_dim}"
        return s


@dataclass
class Gemma4MoEConfig(Gemma4Config):
    """The fields models/moe.py's expert helpers read."""

    n_expert: int = 0
    n_expert_used: int = 0  # k
    d_ff_expert: int = 0
    d_ff_shared: int = 0  # (the dense MLP is Gemma 4's shared expert, run by the layer itself)
    routing: str = "softmax_topk"
    norm_topk: bool = True
    expert_weights_scale: float = 1.0

    def describe(self) -> str:
        return (super().describe() + f", {self.n_expert} experts (top {self.n_expert_used}, "
                f"ffn {self.d_ff_expert}) beside the dense MLP")


class _Scalars:
    """The GGUF g with some per-layer (array) keys replaced by one value, so that
    llama.read_config reads everything the families share."""

    def __init__(self, g, over: dict):
        self._g, self._over = g, over

    def arch_get(self, suffix, default=None):
        if suffix in self._over:
            return self._over[suffix]
        return self._g.arch_get(suffix, default)

    def __getattr__(self, name):
        return getattr(self._g, name)


def _per_layer(g, suffix, n: int, default=None) -> tuple:
    v = g.arch_get(suffix, default)
    if v is None:
        raise ModelFormatError(f"{g.path}: metadata key {g.arch}.{suffix} is missing")
    if isinstance(v, (np.ndarray, list, tuple)):
        vals = [int(x) for x in np.asarray(v).ravel()]
        if len(vals) != n:
            raise ModelFormatError(f"{g.path}: {g.arch}.{suffix} has {len(vals)} entries for "
                                   f"{n} layers")
        return tuple(vals)
    return (int(v),) * n


def read_config(g) -> Gemma4Config:
    n = int(llama._req(g, "block_count"))
    if g.has_tensor("blk.0.attn_qkv.weight"):
        raise UnsupportedArchitectureError(f"{g.path}: gemma4 with a fused attn_qkv tensor is not "
                                           "supported yet")
    kv = _per_layer(g, "attention.head_count_kv", n, g.arch_get("attention.head_count"))
    ff = _per_layer(g, "feed_forward_length", n)
    hd = int(llama._req(g, "attention.key_length"))
    hd_swa = int(g.arch_get("attention.key_length_swa", hd))
    if int(g.arch_get("attention.value_length", hd)) != hd or int(
            g.arch_get("attention.value_length_swa", hd_swa)) != hd_swa:
        raise UnsupportedArchitectureError(f"{g.path}: gemma4 with value_length != key_length")
    base = llama.read_config(_Scalars(g, {"attention.head_count_kv": kv[0],
                                          "feed_forward_length": max(ff)}))
    fields = dict(vars(base))
    fields.update(rope_neox=True, qk_norm=True, rope_dim=int(g.arch_get("rope.dimension_count", hd)))
    swa = gemma.swa_layers(g, n, base.sliding_window)  # no window: every layer global
    n_shared = int(g.arch_get("attention.shared_kv_layers", 0) or 0)
    n_own = n - n_shared
    if not 0 < n_own <= n:
        raise ModelFormatError(f"{g.path}: {n_shared} shared-KV layers of {n}")
    src = list(range(n_own))
    for i in range(n_own, n):  # the last own-KV layer of the same kind
        own = [j for j in range(n_own) if swa[j] == swa[i]]
        if not own:
            raise ModelFormatError(f"{g.path}: layer {i} reuses the KV of an earlier "
                                   f"{'sliding' if swa[i] else 'global'} layer, and there is none")
        src.append(own[-1])
    heads = int(base.n_heads)
    for i in range(n):
        if heads % kv[i]:
            raise ModelFormatError(f"{g.path}: {heads} heads is not a multiple of {kv[i]} kv "
                                   f"heads (layer {i})")
    geom = tuple((kv[j], hd_swa if swa[j] else hd) for j in range(n_own))
    cls, extra = Gemma4Config, {}
    if moe.has_experts(g) or int(g.arch_get("expert_count", 0) or 0) > 0:
        cls, extra = Gemma4MoEConfig, _moe_fields(g, n, int(base.d_model))
    return cls(
        **fields, swa_layers=swa,
        rope_base_local=float(g.arch_get("rope.freq_base_swa", gemma.ROPE_BASE_LOCAL)),
        attn_scale=1.0,  # q and k are RMS-normed; llama.cpp fixes it at 1 for gemma4 too
        final_softcap=float(g.arch_get("final_logit_softcapping", 0.0) or 0.0),
        head_dim_swa=hd_swa, rope_dim_swa=int(g.arch_get("rope.dimension_count_swa", hd_swa)),
        layer_heads_kv=kv, layer_d_ff=ff, kv_source=tuple(src), n_kv_layers=n_own,
        kv_layers=geom, per_layer_dim=int(g.arch_get("embedding_length_per_layer_input", 0) or 0),
        **extra)


def _moe_fields(g, n: int, D: int) -> dict:
    E = int(g.arch_get("expert_count", 0) or 0)
    k = int(g.arch_get("expert_used_count", 0) or 0)
    if E < 1 or not 1 <= k <= E:
        raise ModelFormatError(f"{g.path}: gemma4 expert_count = {E} and expert_used_count = {k} "
                               "do not describe a mixture of experts")
    gating = g.arch_get("expert_gating_func")
    if gating is not None and int(gating) != 1:  # gguf ExpertGatingFuncType.SOFTMAX
        raise UnsupportedArchitectureError(f"{g.path}: expert gating function {gating} is not "
                                           "supported (softmax only)")
    layers = [i for i in range(n) if g.has_tensor(f"blk.{i}.ffn_gate_inp.weight")]
    if not layers:
        raise ModelFormatError(f"{g.path}: gemma4 expert_count {E} but no router tensors")
    p = f"blk.{layers[0]}."
    if g.has_tensor(p + "ffn_gate_up_exps.weight"):
        _, shape = g.tensor_info(p + "ffn_gate_up_exps.weight")
        F = int(shape[1]) // 2
    elif g.has_tensor(p + "ffn_gate_exps.weight"):
        _, shape = g.tensor_info(p + "ffn_gate_exps.weight")
        F = int(shape[1])
    else:
        raise ModelFormatError(f"{g.path}: gemma4 layer {layers[0]} has a router but no experts")
    if len(shape) != 3 or shape[0] != E or shape[2] != D:
        raise ModelFormatError(f"{g.path}: {p}ffn_gate*_exps has shape {shape}")
    meta = g.arch_get("expert_feed_forward_length")
    if meta is not None and int(np.asarray(meta).ravel()[0]) != F:
        raise ModelFormatError(f"{g.path}: expert_feed_forward_length {meta} != the experts' {F}")
    return dict(n_expert=E, n_expert_used=k, d_ff_expert=F)


# ============================================================================ weights


@dataclass
class Gemma4MoEWeights:
    """A Gemma 4 MoE layer's router and experts (the dense MLP stays in the layer)."""

    router: QWeight  # (E, D)
    router_scale: np.ndarray  # (D,) ffn_gate_inp.scale
    experts: list  # moe.FFNWeights per expert (gate | up fused when possible)
    expert_scale: np.ndarray  # (E,) ffn_down_exps.scale: multiplies each expert's weight
    pre_norm_2: np.ndarray  # (D,) the experts' input norm
    post_norm_1: np.ndarray  # (D,) the dense MLP's output norm
    post_norm_2: np.ndarray  # (D,) the experts' output norm

    def weights(self):
        return [self.router] + [w for x in self.experts for w in x.weights()]


def load_moe(g, cfg: Gemma4MoEConfig, i: int) -> Gemma4MoEWeights:
    p, D, E, F = f"blk.{i}.", cfg.d_model, cfg.n_expert, cfg.d_ff_expert
    vec = lambda name, n: llama._check_vec(p + name, g.load_f32(p + name), n)  # noqa: E731
    router = g.load_weight(p + "ffn_gate_inp.weight")
    llama._check_shape(p + "ffn_gate_inp.weight", router, E, D)
    downs = g.load_experts(p + "ffn_down_exps.weight")
    if g.has_tensor(p + "ffn_gate_up_exps.weight"):
        gus = g.load_experts(p + "ffn_gate_up_exps.weight")
        if len(gus) != E or len(downs) != E:
            raise ModelFormatError(f"{g.path}: layer {i} has {len(gus)}/{len(downs)} experts, "
                                   f"expected {E}")
        experts = []
        for e in range(E):
            llama._check_shape(f"{p}expert {e} gate_up", gus[e], 2 * F, D)
            llama._check_shape(f"{p}expert {e} down", downs[e], D, F)
            experts.append(moe.FFNWeights(gus[e], None, None, downs[e]))
    else:
        gates, ups = (g.load_experts(p + f"ffn_{n}_exps.weight") for n in ("gate", "up"))
        if not len(gates) == len(ups) == len(downs) == E:
            raise ModelFormatError(f"{g.path}: layer {i} has {len(gates)}/{len(ups)}/"
                                   f"{len(downs)} gate/up/down experts, expected {E}")
        experts = [moe._ffn(f"{p}expert {e}", gates[e], ups[e], downs[e], F, D) for e in range(E)]
    scale = vec("ffn_down_exps.scale", E) if g.has_tensor(p + "ffn_down_exps.scale") else \
        np.ones(E, np.float32)
    return Gemma4MoEWeights(router, vec("ffn_gate_inp.scale", D), experts, scale,
                            vec("pre_ffw_norm_2.weight", D), vec("post_ffw_norm_1.weight", D),
                            vec("post_ffw_norm_2.weight", D))


@dataclass
class Gemma4LayerWeights(gemma.Gemma3LayerWeights):
    out_scale: float = 1.0  # layer_output_scale: multiplies the residual after the layer
    k_eq_v: bool = False  # no attn_v: V is the raw K
    ple_gate: QWeight | None = None  # (P, D) per-layer input gate
    ple_proj: QWeight | None = None  # (D, P)
    ple_norm: np.ndarray | None = None  # (D,)
    moe: Gemma4MoEWeights | None = None  # MoE layers: router and experts beside the MLP

    def weights(self):
        return (super().weights() + [w for w in (self.ple_gate, self.ple_proj) if w is not None]
                + (self.moe.weights() if self.moe is not None else []))


def load_layer(g, cfg: Gemma4Config, i: int) -> Gemma4LayerWeights:
    p, D, H = f"blk.{i}.", cfg.d_model, cfg.n_heads
    hd, kvh, F = cfg.layer_head_dim(i), cfg.layer_heads_kv[i], cfg.layer_d_ff[i]
    own = i < cfg.n_kv_layers
    vec = lambda name, n: llama._check_vec(p + name, g.load_f32(p + name), n)  # noqa: E731
    wq = g.load_weight(p + "attn_q.weight")
    llama._check_shape(p + "attn_q.weight", wq, H * hd, D)
    wk = wv = k_norm = None
    if own:
        wk = g.load_weight(p + "attn_k.weight")
        llama._check_shape(p + "attn_k.weight", wk, kvh * hd, D)
        if g.has_tensor(p + "attn_v.weight"):
            wv = g.load_weight(p + "attn_v.weight")
            llama._check_shape(p + "attn_v.weight", wv, kvh * hd, D)
        k_norm = vec("attn_k_norm.weight", hd)
    wqkv = concat_rows([w for w in (wq, wk, wv) if w is not None]) if own else None
    if wqkv is not None:
        wq = wk = wv = None
    wo = g.load_weight(p + "attn_output.weight")
    llama._check_shape(p + "attn_output.weight", wo, D, H * hd)
    w_gate, w_up = g.load_weight(p + "ffn_gate.weight"), g.load_weight(p + "ffn_up.weight")
    llama._check_shape(p + "ffn_gate.weight", w_gate, F, D)
    llama._check_shape(p + "ffn_up.weight", w_up, F, D)
    w_gate_up = concat_rows([w_gate, w_up])
    if w_gate_up is not None:
        w_gate = w_up = None
    w_down = g.load_weight(p + "ffn_down.weight")
    llama._check_shape(p + "ffn_down.weight", w_down, D, F)
    scale = 1.0
    if g.has_tensor(p + "layer_output_scale.weight"):
        s = np.asarray(g.load_f32(p + "layer_output_scale.weight")).ravel()
        if s.shape != (1,) or not np.isfinite(s[0]):
            raise ModelFormatError(f"tensor {p}layer_output_scale.weight must be one finite value")
        scale = float(s[0])
    ple = {}
    if cfg.per_layer_dim:
        P = cfg.per_layer_dim
        ple["ple_gate"] = g.load_weight(p + "inp_gate.weight")
        llama._check_shape(p + "inp_gate.weight", ple["ple_gate"], P, D)
        ple["ple_proj"] = g.load_weight(p + "proj.weight")
        llama._check_shape(p + "proj.weight", ple["ple_proj"], D, P)
        ple["ple_norm"] = vec("post_norm.weight", D)
    if g.has_tensor(p + "ffn_gate_inp.weight"):
        if not isinstance(cfg, Gemma4MoEConfig):
            raise ModelFormatError(f"{g.path}: layer {i} has an expert router but the file no "
                                   "expert_count")
        ple["moe"] = load_moe(g, cfg, i)
    return Gemma4LayerWeights(
        attn_norm=vec("attn_norm.weight", D), wqkv=wqkv, wq=wq, wk=wk, wv=wv, bqkv=None,
        q_norm=vec("attn_q_norm.weight", hd), k_norm=k_norm, wo=wo,
        ffn_norm=vec("ffn_norm.weight", D), w_gate_up=w_gate_up, w_gate=w_gate, w_up=w_up,
        w_down=w_down, post_attn_norm=vec("post_attention_norm.weight", D),
        post_ffn_norm=vec("post_ffw_norm.weight", D), out_scale=scale,
        k_eq_v=own and not g.has_tensor(p + "attn_v.weight"), **ple)


# ============================================================================ the family


class Gemma4Family(gemma.Gemma3Family):
    """Weights and forward step of Gemma 4 dense text models (Gemma 3's step with the changes
    of the module docstring)."""

    read_config = staticmethod(read_config)

    def __init__(self, g, cfg: Gemma4Config, kernels, threads: int, progress=None,
                 weights: dict | None = None):
        if weights is None:
            self.cfg = cfg
            weights = self.load_weights(g, progress)
        super().__init__(g, cfg, kernels, threads, progress, weights)
        rf = weights["rope_freqs"]
        if rf is not None and rf.shape != (cfg.n_rot // 2,):
            raise ModelFormatError(f"{g.path}: rope_freqs has shape {rf.shape}, expected "
                                   f"({cfg.n_rot // 2},)")
        # global layers: self.rope (rope.freq_base, rope_freqs); sliding: their own dims and base
        self.rope_local = RopeCache(cfg.rope_dim_swa, cfg.rope_base_local, cfg.context_length)
        self.attn_scale = 1.0
        self.ple_embd = weights["ple_embd"]  # (vocab, L*P) rows
        self.ple_model_proj = weights["ple_model_proj"]  # (L*P, D)
        self.ple_proj_norm = weights["ple_proj_norm"]  # (P,)
        self.ones = {hd: np.ones(hd, np.float32) for hd in {cfg.head_dim, cfg.head_dim_swa}}

    def load_weights(self, g, progress=None, keep=None) -> dict:
        w = super().load_weights(g, progress, keep)
        cfg, keep = self.cfg, keep or (lambda obj: obj)
        w.update(ple_embd=None, ple_model_proj=None, ple_proj_norm=None)
        if cfg.per_layer_dim:
            LP = cfg.n_layers * cfg.per_layer_dim
            e = g.load_weight("per_layer_token_embd.weight")
            llama._check_shape("per_layer_token_embd.weight", e, cfg.vocab_size, LP)
            m = g.load_weight("per_layer_model_proj.weight")
            llama._check_shape("per_layer_model_proj.weight", m, LP, cfg.d_model)
            w.update(ple_embd=keep(e), ple_model_proj=keep(m), ple_proj_norm=llama._check_vec(
                "per_layer_proj_norm.weight", g.load_f32("per_layer_proj_norm.weight"),
                cfg.per_layer_dim))
        return w

    def load_layer(self, g, i: int) -> Gemma4LayerWeights:
        return load_layer(g, self.cfg, i)

    def weights(self):
        return super().weights() + [w for w in (self.ple_embd, self.ple_model_proj)
                                    if w is not None]

    # ------------------------------------------------------------------ forward

    def forward(self, batch: Batch, k_cache, v_cache, logits: np.ndarray | None = None) -> np.ndarray:
        """The llama step's loop with Gemma 4's per-layer KV source, per-layer embeddings and
        output scale (k_cache[l], v_cache[l]: cache layer l, kv_cache.kv_geometry)."""
        K, cfg, nt, S = self.K, self.cfg, self.threads, self.scratch
        T, D = len(batch.tokens), cfg.d_model
        x = self.embed(batch.tokens, S.get("x", T, D))  # (T, D) residual stream
        ple = self.per_layer_inputs(batch.tokens, x) if cfg.per_layer_dim else None  # (T, L*P)
        h = S.get("h", T, D)
        o = S.get("o", T, D)
        for li, L in enumerate(self.layers):
            src = cfg.kv_source[li]
            K.rmsnorm(x, L.attn_norm, cfg.norm_eps, out=h, nthreads=nt)
            self.attention_block(li, L, h, batch, k_cache[src], v_cache[src], o)
            K.add(x, o, out=x, nthreads=nt)
            K.rmsnorm(x, L.ffn_norm, cfg.norm_eps, out=h, nthreads=nt)
            if L.moe is None:
                self.ffn_block(li, L, h, o)
            else:
                self.moe_block(li, L, x, h, o)
            K.add(x, o, out=x, nthreads=nt)
            if ple is not None:
                self.per_layer_block(li, L, x, ple, o)
                K.add(x, o, out=x, nthreads=nt)
            if L.out_scale != 1.0:
                K.scale(x, L.out_scale, out=x, nthreads=nt)
        return self.head(x, batch.logit_rows, logits)

    def per_layer_inputs(self, tokens: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Per-layer embeddings of the tokens, (T, L*P): (rmsnorm_P(x W / sqrt(D)) +
        E[token] sqrt(P)) / sqrt(2), x (T, D) the scaled token embeddings."""
        K, cfg, nt, S = self.K, self.cfg, self.threads, self.scratch
        T, P = len(tokens), cfg.per_layer_dim
        LP = cfg.n_layers * P
        e = K.get_rows(self.ple_embd, tokens, out=S.get("ple_e", T, LP), nthreads=nt)  # (T, LP)
        K.scale(e, np.float32(np.sqrt(P)), out=e, nthreads=nt)
        pr = self._mm(Act(K, x, S.qact(T, cfg.d_model), nt), self.ple_model_proj,
                      S.get("ple", T, LP))  # (T, LP)
        K.scale(pr, np.float32(1.0 / np.sqrt(cfg.d_model)), out=pr, nthreads=nt)
        prl = pr.reshape(T * cfg.n_layers, P)  # (T L, P): one norm per layer slice
        K.rmsnorm(prl, self.ple_proj_norm, cfg.norm_eps, out=prl, nthreads=nt)
        K.add(pr, e, out=pr, nthreads=nt)
        return K.scale(pr, np.float32(1.0 / np.sqrt(2.0)), out=pr, nthreads=nt)

    def per_layer_block(self, li: int, L: Gemma4LayerWeights, x, ple, out) -> None:
        """Layer li's per-layer-embedding branch: out = rmsnorm(W_proj (gelu(W_gate x) *
        ple[:, li]))  (T, D)."""
        K, cfg, nt, S = self.K, self.cfg, self.threads, self.scratch
        T, P = x.shape[0], cfg.per_layer_dim
        g = self._mm(Act(K, x, S.qact(T, cfg.d_model), nt), L.ple_gate, S.get("pg", T, P))
        pl = K.copy2d(ple[:, li * P:(li + 1) * P], out=S.get("pl", T, P), nthreads=nt)  # (T, P)
        K.gelu_tanh_mul(g, pl, out=g, nthreads=nt)
        self._mm(Act(K, g, S.qact(T, P), nt), L.ple_proj, out)
        K.rmsnorm(out, L.ple_norm, cfg.norm_eps, out=out, nthreads=nt)

    def attention_block(self, li, L: Gemma4LayerWeights, h, batch, kc, vc, out) -> None:
        """Q of layer li; K/V written only by a layer with its own KV (a shared layer reads
        its source layer's cache); attention with scale 1; output projection; post-norm."""
        K, cfg, S, nt = self.K, self.cfg, self.scratch, self.threads
        T = h.shape[0]
        H, hd, KV = cfg.n_heads, cfg.layer_head_dim(li), cfg.layer_heads_kv[li]
        nq, nkv = H * hd, KV * hd
        q = S.get(f"q{hd}", T, H, hd)
        a = Act(K, h, S.qact(T, h.shape[1]), nt)
        own = li < cfg.n_kv_layers
        k = v = None
        if own:
            k, v = S.get(f"k{hd}_{KV}", T, KV, hd), S.get(f"v{hd}_{KV}", T, KV, hd)
        if L.wqkv is not None:  # q | k [| v]
            n_all = L.wqkv.n_out
            qkv = self._mm(a, L.wqkv, S.get(f"qkv{n_all}", T, n_all))
            K.copy2d(qkv[:, :nq], out=q.reshape(T, nq), nthreads=nt)
            K.copy2d(qkv[:, nq:nq + nkv], out=k.reshape(T, nkv), nthreads=nt)
            if not L.k_eq_v:
                K.copy2d(qkv[:, nq + nkv:], out=v.reshape(T, nkv), nthreads=nt)
        else:
            self._mm(a, L.wq, q.reshape(T, nq))
            if own:
                self._mm(a, L.wk, k.reshape(T, nkv))
                if not L.k_eq_v:
                    self._mm(a, L.wv, v.reshape(T, nkv))
        K.rmsnorm(q, L.q_norm, cfg.norm_eps, out=q, nthreads=nt)
        rope = self.layer_rope(li)
        cos, sin = rope.tables(int(batch.positions.max()) + 1)
        K.rope(q, batch.positions, cos, sin, True, out=q, nthreads=nt)
        if own:  # V = rmsnorm(v) without weight (of the raw K when there is no v projection)
            K.rmsnorm(k if L.k_eq_v else v, self.ones[hd], cfg.norm_eps, out=v, nthreads=nt)
            K.rmsnorm(k, L.k_norm, cfg.norm_eps, out=k, nthreads=nt)
            K.rope(k, batch.positions, cos, sin, True, out=k, nthreads=nt)
            K.kv_write(kc, vc, k, v, batch.slots, nthreads=nt)
        att = self.attend(li, q, kc, vc, batch, S.get(f"att{hd}", T, H, hd),
                          self.layer_window(li), 0.0, 1.0)
        self._mm(Act(K, att.reshape(T, nq), S.qact(T, nq), nt), L.wo, out)
        K.rmsnorm(out, L.post_attn_norm, cfg.norm_eps, out=out, nthreads=nt)


# ============================================================================ MoE


class Gemma4MoEFamily(Gemma4Family, moe.MoEFamily):
    """Gemma 4 with routed experts beside the dense MLP (26B-A4B): Gemma4Family's step, the
    experts run by models/moe.py's expert-major GEMMs and fold."""

    ffn_act = "gelu_tanh_mul"

    def expert_act(self, gate, up, out):
        return self.K.gelu_tanh_mul(gate, up, out=out, nthreads=self.threads)

    def moe_block(self, li: int, L: Gemma4LayerWeights, x, h, out) -> None:
        """x (T, D) the residual after attention, h = rmsnorm(x, ffn_norm) -> out (T, D), the
        layer's FFN output after post_ffw_norm (module docstring)."""
        K, cfg, S, nt = self.K, self.cfg, self.scratch, self.threads
        M, eps = L.moe, cfg.norm_eps
        T, D = x.shape
        llama.LlamaFamily.ffn_block(self, li, L, h, out)  # the dense MLP
        K.rmsnorm(out, M.post_norm_1, eps, out=out, nthreads=nt)
        r = K.rmsnorm(x, M.router_scale, eps, out=S.get("moe_r", T, D), nthreads=nt)
        K.scale(r, np.float32(1.0 / np.sqrt(D)), out=r, nthreads=nt)
        logits = self._mm(Act(K, r, self._qact("moe_r", T, D), nt), M.router,
                          S.get("moe_logits", T, cfg.n_expert))  # (T, E)
        ids, w = K.moe_route(logits, cfg.n_expert_used, "softmax_topk", True, 1.0,
                             ids=S.get("moe_ids", T, cfg.n_expert_used, dtype=np.int32),
                             weights=S.get("moe_w", T, cfg.n_expert_used), nthreads=nt)
        np.multiply(w, M.expert_scale[ids], out=w)  # (T, k) float32, per-expert scales
        h2 = K.rmsnorm(x, M.pre_norm_2, eps, out=S.get("moe_h2", T, D), nthreads=nt)
        y, pos = self._experts_by_expert(M, h2, ids) if self.expert_major else \
            self._experts_by_token(M, Act(K, h2, self._qact("moe_h", T, D), nt), ids)
        o2 = K.moe_fold(y, w, pos, None, None, renorm=False, out=S.get("moe_o2", T, D),
                        nthreads=nt)
        K.rmsnorm(o2, M.post_norm_2, eps, out=o2, nthreads=nt)
        K.add(out, o2, out=out, nthreads=nt)
        K.rmsnorm(out, L.post_ffn_norm, eps, out=out, nthreads=nt)
