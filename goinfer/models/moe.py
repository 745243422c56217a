"""Mixture-of-Experts models: mixtral (GGUF arch llama with expert tensors), qwen2moe,
qwen3moe, olmoe.

Attention is LlamaFamily's, hooks and fast path included; only the feed-forward differs:
  RMSNorm -> router matmul (T, E) -> moe_route: k experts and weights per row ->
  moe_group: the T*k (row, expert) entries sorted by expert -> per expert, ONE GEMM over
  all its rows: gate/up -> SwiGLU -> down -> moe_fold: each row's k outputs weighted and
  summed in rank order, in float64, divided by the weights' sum where they are meant to sum
  to 1 [+ the shared expert behind a sigmoid gate (qwen2moe)], rounded once.
Matmul rows are independent, so a row's expert outputs do not depend on which rows share
the GEMM: the expert-major result is bit-identical to running the tokens one at a time, and
a decoded token reads only its k experts' weights.

GGUF layout (llama.cpp's): router blk.N.ffn_gate_inp.weight (E, D); experts stacked as
blk.N.ffn_{gate,up}_exps.weight (E, F, D) and ffn_down_exps.weight (E, D, F); shared expert
ffn_{gate,up,down}_shexp.weight and its gate ffn_gate_inp_shexp.weight (D,).  Metadata
{arch}.expert_count, .expert_used_count, .expert_feed_forward_length,
.expert_shared_feed_forward_length, .expert_weights_norm, .expert_weights_scale,
.expert_gating_func (softmax only).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from goinfer.errors import ModelFormatError, UnsupportedArchitectureError
from goinfer.models import llama
from goinfer.models.base import Act, ModelConfig
from goinfer.quant import QAct, QWeight, concat_rows, pack_float

# ============================================================================ config

# How each architecture routes (llama.cpp's choices; see docs/design/kernels.md):
#   mixtral (llama): top-k of the logits, softmax over the chosen k
#   qwen2moe / qwen3moe / olmoe: softmax over all experts, then top-k
ROUTING = {"llama": "topk_softmax", "mistral": "topk_softmax", "qwen2moe": "softmax_topk",
           "qwen3moe": "softmax_topk", "olmoe": "softmax_topk", "gpt-oss": "topk_softmax",
           "qwen35moe": "softmax_topk"}
# Renormalize the chosen softmax weights to sum 1 (qwen3's norm_topk_prob), unless the file
# says otherwise in {arch}.expert_weights_norm.  (topk_softmax sums to 1 by construction.)
NORM_TOPK = {"llama": True, "mistral": True, "qwen2moe": False, "qwen3moe": True, "olmoe": False,
             "gpt-oss": False, "qwen35moe": True}
NEOX_ARCHS = {"qwen2moe", "qwen3moe", "olmoe"}
_SOFTMAX_GATING = 1  # gguf ExpertGatingFuncType.SOFTMAX


@dataclass
class MoEConfig(ModelConfig):
    n_expert: int = 0
    n_expert_used: int = 0  # k
    d_ff_expert: int = 0
    d_ff_shared: int = 0  # 0: no shared expert
    routing: str = "softmax_topk"  # or "topk_softmax"
    norm_topk: bool = False
    expert_weights_scale: float = 1.0
    qk_norm_full: bool = False  # olmoe: one RMSNorm over all q (k) heads, not per head

    def describe(self) -> str:
        shared = f" + shared ffn {self.d_ff_shared}" if self.d_ff_shared else ""
        return (super().describe() + f", {self.n_expert} experts (top {self.n_expert_used}, "
                f"ffn {self.d_ff_expert}){shared}")


def has_experts(g) -> bool:
    """Does the GGUF carry MoE routers (blk.N.ffn_gate_inp.weight)?"""
    return any(n.startswith("blk.") and n.endswith(".ffn_gate_inp.weight") for n in g.tensor_names)


def _first_moe_layer(g, n_layers: int) -> int:
    for i in range(n_layers):
        if g.has_tensor(f"blk.{i}.ffn_gate_inp.weight"):
            return i
    raise ModelFormatError(f"{g.path}: {g.arch} file has no expert router (blk.N.ffn_gate_inp.weight)")


def read_config(g, allow_yarn: bool = False) -> MoEConfig:
    base = llama.read_config(g, allow_yarn)
    arch = g.arch
    cfg = MoEConfig(**{f.name: getattr(base, f.name) for f in fields(base)})
    E = int(g.arch_get("expert_count", 0) or 0)
    k = int(g.arch_get("expert_used_count", 0) or 0)
    if E < 1 or not 1 <= k <= E:
        raise ModelFormatError(f"{g.path}: {arch}.expert_count = {E} and {arch}.expert_used_count "
                               f"= {k} do not describe a mixture of experts (need 1 <= used <= count)")
    gating = g.arch_get("expert_gating_func")
    if gating is not None and int(gating) != _SOFTMAX_GATING:
        raise UnsupportedArchitectureError(f"{g.path}: expert gating function {gating} is not "
                                           "supported (softmax only)")
    i = _first_moe_layer(g, cfg.n_layers)
    if not g.has_tensor(f"blk.{i}.ffn_gate_exps.weight") and g.has_tensor(f"blk.{i}.ffn_gate.0.weight"):
        raise ModelFormatError(f"{g.path}: experts stored one tensor each (blk.N.ffn_gate.E.weight, "
                               "an old llama.cpp layout); re-convert the model with a current "
                               "llama.cpp, which stacks them (blk.N.ffn_gate_exps.weight)")
    _, gshape = g.tensor_info(f"blk.{i}.ffn_gate_exps.weight")
    if len(gshape) != 3 or gshape[0] != E or gshape[2] != cfg.d_model:
        raise ModelFormatError(f"{g.path}: blk.{i}.ffn_gate_exps.weight has shape {gshape}, "
                               f"expected ({E}, n_ff, {cfg.d_model})")
    cfg.n_expert, cfg.n_expert_used, cfg.d_ff_expert = E, k, int(gshape[1])
    meta_ff = g.arch_get("expert_feed_forward_length")
    if meta_ff is not None and llama._scalar_int(g, "expert_feed_forward_length", meta_ff) != cfg.d_ff_expert:
        raise ModelFormatError(f"{g.path}: {arch}.expert_feed_forward_length = {meta_ff} but the "
                               f"expert tensors have {cfg.d_ff_expert} rows")
    if g.has_tensor(f"blk.{i}.ffn_gate_shexp.weight"):
        cfg.d_ff_shared = int(g.tensor_info(f"blk.{i}.ffn_gate_shexp.weight")[1][0])
    cfg.routing = ROUTING.get(arch, "softmax_topk")
    cfg.norm_topk = bool(g.arch_get("expert_weights_norm", NORM_TOPK.get(arch, False)))
    scale = float(g.arch_get("expert_weights_scale", 1.0) or 1.0)  # llama.cpp: 0 means 1
    cfg.expert_weights_scale = scale
    cfg.rope_neox = cfg.rope_neox or arch in NEOX_ARCHS
    if cfg.qk_norm:  # per-head (qwen3moe) or over all heads at once (olmoe)?
        _, qn = g.tensor_info("blk.0.attn_q_norm.weight")
        if qn == (cfg.n_heads * cfg.head_dim,) and cfg.n_heads > 1:
            cfg.qk_norm, cfg.qk_norm_full = False, True
    return cfg


# ============================================================================ weights


@dataclass
class FFNWeights:
    """One SwiGLU feed-forward: an expert, or the shared expert."""

    w_gate_up: QWeight | None  # fused (2F, D), or None when gate/up cannot be fused
    w_gate: QWeight | None
    w_up: QWeight | None
    w_down: QWeight  # (D, F)
    nbytes: int = 0  # bytes of all its weights (set at construction)
    b_gate: np.ndarray | None = None  # (F,) f32 biases (gpt-oss), added after each matmul
    b_up: np.ndarray | None = None  # (F,)
    b_down: np.ndarray | None = None  # (D,)
    b_gate_up: np.ndarray | None = None  # (2F,) [b_gate; b_up] when gate/up are fused

    def __post_init__(self):
        self.nbytes = sum(w.nbytes for w in self.weights())
        if self.w_gate_up is not None and self.b_gate is not None and self.b_gate_up is None:
            self.b_gate_up = np.concatenate([self.b_gate, self.b_up])

    def weights(self):
        return [w for w in (self.w_gate_up, self.w_gate, self.w_up, self.w_down) if w is not None]


@dataclass
class MoEWeights:
    router: QWeight  # (E, D)
    experts: list[FFNWeights]
    shared: FFNWeights | None = None
    shared_gate: QWeight | None = None  # (1, D) float32
    router_bias: np.ndarray | None = None  # (E,) f32 (gpt-oss)

    def weights(self):
        ws = [self.router] + [w for x in self.experts for w in x.weights()]
        if self.shared is not None:
            ws += self.shared.weights() + [self.shared_gate]
        return ws


@dataclass
class MoELayerWeights(llama.LayerWeights):
    """A llama layer whose FFN fields are None when the layer is MoE (``moe`` set)."""

    moe: MoEWeights | None = None
    q_norm_full: np.ndarray | None = None  # (H*hd,) olmoe
    k_norm_full: np.ndarray | None = None  # (KV*hd,)

    def weights(self):
        return super().weights() + (self.moe.weights() if self.moe is not None else [])


def _ffn(name: str, gate: QWeight, up: QWeight, down: QWeight, F: int, D: int,
         biases=None) -> FFNWeights:
    """biases: (b_gate (F,), b_up (F,), b_down (D,)) or None."""
    llama._check_shape(name + " gate", gate, F, D)
    llama._check_shape(name + " up", up, F, D)
    llama._check_shape(name + " down", down, D, F)
    gu = concat_rows([gate, up])
    if gu is not None:
        gate = up = None
    b = dict(zip(("b_gate", "b_up", "b_down"), biases)) if biases is not None else {}
    return FFNWeights(gu, gate, up, down, **b)


def load_moe(g, cfg: MoEConfig, i: int) -> MoEWeights:
    """Layer i's router, experts and shared expert (llama.cpp's tensor names)."""
    p = f"blk.{i}."
    D, E = cfg.d_model, cfg.n_expert
    router = g.load_weight(p + "ffn_gate_inp.weight")
    llama._check_shape(p + "ffn_gate_inp.weight", router, E, D)
    gates, ups, downs = (g.load_experts(p + f"ffn_{n}_exps.weight") for n in ("gate", "up", "down"))
    if not len(gates) == len(ups) == len(downs) == E:
        raise ModelFormatError(f"{g.path}: layer {i} has {len(gates)}/{len(ups)}/{len(downs)} "
                               f"gate/up/down experts, expected {E}")
    experts = []
    for e in range(E):
        experts.append(_ffn(f"{p}expert {e}", gates[e], ups[e], downs[e], cfg.d_ff_expert, D))
        gates[e] = ups[e] = None  # drop the unfused copies as we go
    moe = MoEWeights(router, experts)
    if g.has_tensor(p + "ffn_gate_shexp.weight"):
        Fs = cfg.d_ff_shared
        moe.shared = _ffn(p + "shared expert", *(g.load_weight(p + f"ffn_{n}_shexp.weight")
                                                 for n in ("gate", "up", "down")), Fs, D)
        gate_vec = g.load_f32(p + "ffn_gate_inp_shexp.weight").reshape(-1)
        if gate_vec.shape != (D,):
            raise ModelFormatError(f"{g.path}: {p}ffn_gate_inp_shexp.weight has "
                                   f"{gate_vec.size} values, expected {D}")
        moe.shared_gate = pack_float("f32", np.ascontiguousarray(gate_vec[None, :], np.float32))
    return moe


def load_layer(g, cfg: MoEConfig, i: int) -> MoELayerWeights:
    p = f"blk.{i}."
    D, E = cfg.d_model, cfg.n_expert
    if not g.has_tensor(p + "ffn_gate_inp.weight"):  # a dense layer inside an MoE model
        dense = llama.load_layer(g, cfg, i)
        L = MoELayerWeights(**{f.name: getattr(dense, f.name) for f in fields(dense)})
    else:
        attn = llama.load_attention(g, cfg, i)
        L = MoELayerWeights(**attn, ffn_norm=llama._check_vec(
            p + "ffn_norm.weight", g.load_f32(p + "ffn_norm.weight"), D),
            w_gate_up=None, w_gate=None, w_up=None, w_down=None, moe=load_moe(g, cfg, i))
    if cfg.qk_norm_full:
        L.q_norm_full = llama._check_vec(p + "attn_q_norm.weight", g.load_f32(p + "attn_q_norm.weight"),
                                         cfg.n_heads * cfg.head_dim)
        L.k_norm_full = llama._check_vec(p + "attn_k_norm.weight", g.load_f32(p + "attn_k_norm.weight"),
                                         cfg.n_kv_heads * cfg.head_dim)
    return L


# ============================================================================ the family


@dataclass
class MoEStats:
    """Non-vacuity counters: what the expert matmuls did (reset by the caller).  Counted by
    the Python path only: a decode step replayed by a graph (goinfer/graph.py) counts nothing."""

    expert_runs: int = 0  # (expert, GEMM) runs: one per active expert per layer and call
    expert_rows: int = 0  # routed rows through the experts
    expert_bytes: int = 0  # expert weight bytes the matmuls read (each run reads its expert once)

    def reset(self) -> None:
        self.expert_runs = self.expert_rows = self.expert_bytes = 0

    def add(self, experts, rows: int) -> None:
        """One GEMM run per FFNWeights in experts, over rows routed rows in all."""
        self.expert_runs += len(experts)
        self.expert_rows += rows
        self.expert_bytes += sum(X.nbytes for X in experts)


def _rows(src, o0: int, o1: int):
    """Rows [o0, o1) of a QAct or a float array (views)."""
    if isinstance(src, QAct):
        return QAct(src.qa[o0:o1], src.da[o0:o1], src.asum[o0:o1], src.sa[o0:o1])
    return src[o0:o1]


class MoEFamily(llama.LlamaFamily):
    """Llama-family attention with a Mixture-of-Experts feed-forward.

    ``expert_major`` (default True) runs each expert once over all its rows; False runs
    every (token, expert) pair on its own (the token-by-token baseline; same bits)."""

    read_config = staticmethod(read_config)

    def load_layer(self, g, i: int) -> MoELayerWeights:
        return load_layer(g, self.cfg, i)

    def __init__(self, g, cfg: MoEConfig, kernels, threads: int, progress=None,
                 weights: dict | None = None):
        super().__init__(g, cfg, kernels, threads, progress, weights)
        self.expert_major = True
        # weights that sum to 1 mathematically: the fold divides by their float32 sum
        self.renorm = (cfg.routing == "topk_softmax" or cfg.norm_topk) and cfg.expert_weights_scale == 1.0
        self.stats = MoEStats()
        self._qbufs: dict[str, QAct] = {}

    def _qact(self, name: str, n: int, K: int) -> QAct:
        """A QAct buffer of its own (the shared Scratch.qact is keyed by K only)."""
        q = self._qbufs.get(name)
        if q is None or q.qa.shape[0] < n or q.qa.shape[1] != K:
            q = QAct.empty(max(n, 1), K)
            self._qbufs[name] = q
        return q.rows(n)

    # ------------------------------------------------------------------ attention

    def qkv(self, L, h):
        q, k, v = super().qkv(L, h)
        if getattr(L, "q_norm_full", None) is not None:  # olmoe: RMSNorm over all heads
            K, T, eps, nt = self.K, h.shape[0], self.cfg.norm_eps, self.threads
            K.rmsnorm(q.reshape(T, -1), L.q_norm_full, eps, out=q.reshape(T, -1), nthreads=nt)
            K.rmsnorm(k.reshape(T, -1), L.k_norm_full, eps, out=k.reshape(T, -1), nthreads=nt)
        return q, k, v

    # ------------------------------------------------------------------ feed-forward

    def ffn_block(self, li: int, L, h, out) -> None:
        M = L.moe
        if M is None:
            return super().ffn_block(li, L, h, out)
        K, cfg, S, nt = self.K, self.cfg, self.scratch, self.threads
        T, D = h.shape
        E, k = cfg.n_expert, cfg.n_expert_used
        a = Act(K, h, self._qact("moe_h", T, D), nt)
        logits = self._mm(a, M.router, S.get("moe_logits", T, E))  # (T, E)
        if M.router_bias is not None:
            K.add_bias(logits, M.router_bias, out=logits, nthreads=nt)
        ids, w = K.moe_route(logits, k, cfg.routing, cfg.norm_topk, cfg.expert_weights_scale,
                             ids=S.get("moe_ids", T, k, dtype=np.int32), weights=S.get("moe_w", T, k),
                             nthreads=nt)
        if self.expert_major:
            y, pos = self._experts_by_expert(M, h, ids)
        else:
            y, pos = self._experts_by_token(M, a, ids)
        shared = logit = None
        if M.shared is not None:
            shared = self._shared_expert(M.shared, a, T)
            logit = self._mm(a, M.shared_gate, S.get("moe_sh_logit", T, 1)).reshape(T)
        K.moe_fold(y, w, pos, shared, logit, renorm=self.renorm, out=out, nthreads=nt)

    def _experts_by_expert(self, M, h, ids):
        """Expert-major: sort the T*k entries by expert and run every expert over its rows,
        all experts of the layer in one matmul_experts call per projection.
        -> y (T*k, D) in sorted order, pos (T*k,) (entry t*k+r -> row of y)."""
        K, cfg, S, nt = self.K, self.cfg, self.scratch, self.threads
        T, D = h.shape
        n, E = T * cfg.n_expert_used, cfg.n_expert
        rows, offsets, pos = K.moe_group(ids, E, rows=S.get("moe_rows", n, dtype=np.int32),
                                         offsets=S.get("moe_off", E + 1, dtype=np.int64),
                                         pos=S.get("moe_pos", n, dtype=np.int32), nthreads=nt)
        xg = K.gather_rows(h, rows, out=S.get("moe_xg", n, D), nthreads=nt)  # (n, D) routed rows
        table = expert_table(M)

        def project(name, act, out):
            ws, bias = table[name]
            K.matmul_experts(act.for_weight(ws[0]), ws, offsets, bias, out=out, nthreads=nt)

        y = self._swiglu_ffn(Act(K, xg, self._qact("moe_xg", n, D), nt), n, cfg.d_ff_expert,
                             "gate_up" in table, "moe_x", S.get("moe_y", n, D), project)
        if getattr(K, "recording", False):  # a graph capture: offsets hold no routing yet
            return y, pos
        self.stats.add([M.experts[e] for e in np.flatnonzero(np.diff(offsets))], n)
        return y, pos

    def _experts_by_token(self, M, a: Act, ids):
        """Token-major baseline: every (row t, rank r) entry runs its expert alone (a GEMV per
        entry and projection, by plain matmul).
        -> y (T*k, D) with entry t*k+r in row t*k+r, pos = identity."""
        cfg, S = self.cfg, self.scratch
        T, k = ids.shape
        n, D = T * k, cfg.d_model
        runs = [(t, t + 1, t * k + r, M.experts[e]) for t in range(T) for r, e in enumerate(ids[t].tolist())]
        y = self._swiglu_ffn(a, n, cfg.d_ff_expert, M.experts[0].w_gate_up is not None, "moe_x",
                             S.get("moe_y", n, D), self._one_by_one(runs))
        self.stats.add([X for *_, X in runs], n)
        pos = S.get("moe_pos", n, dtype=np.int32)
        pos[:] = np.arange(n, dtype=np.int32)
        return y, pos

    def _shared_expert(self, X: FFNWeights, a: Act, T: int):
        """The shared expert over the T rows of a -> (T, D)."""
        return self._swiglu_ffn(a, T, self.cfg.d_ff_shared, X.w_gate_up is not None, "moe_sh",
                                self.scratch.get("moe_sh", T, self.cfg.d_model),
                                self._one_by_one([(0, T, 0, X)]))

    def _one_by_one(self, runs):
        """project() for _swiglu_ffn running FFNs one at a time: a run (i0, i1, o0, ffn) is
        ffn on input rows [i0, i1) into output rows [o0, o0 + i1 - i0)."""
        K, nt = self.K, self.threads

        def project(name, act, out):
            for i0, i1, o0, X in runs:
                o1 = o0 + i1 - i0
                w, b = getattr(X, "w_" + name), getattr(X, "b_" + name)
                x = act.for_weight(w)
                dst = out[o0:o1]  # the down projection reads the activation's rows o0..o1
                K.matmul(_rows(x, o0, o1) if name == "down" else _rows(x, i0, i1), w, out=dst, nthreads=nt)
                if b is not None:
                    K.add_bias(dst, b, out=dst, nthreads=nt)
        return project

    def expert_act(self, gate, up, out):
        """The experts' gated activation: gate, up (n, F) -> out (n, F)."""
        return self.K.swiglu(gate, up, out=out, nthreads=self.threads)

    def _swiglu_ffn(self, a: Act, n: int, F: int, fused: bool, tag: str, y, project):
        """A gated feed-forward over n output rows: project(name, act, out) runs projection name
        ("gate_up" when fused, else "gate" and "up"; then "down") over its rows of the Act
        (the input a, then the activation) into out.  Returns y (n, D)."""
        K, S, nt = self.K, self.scratch, self.threads
        if fused:
            gu = S.get(tag + "_gu", n, 2 * F)  # (n, 2F): gate | up
            gate, up = gu[:, :F], gu[:, F:]
            project("gate_up", a, gu)
        else:
            gate, up = S.get(tag + "_gate", n, F), S.get(tag + "_up", n, F)
            project("gate", a, gate)
            project("up", a, up)
        f = self.expert_act(gate, up, S.get(tag + "_f", n, F))  # (n, F)
        project("down", Act(K, f, self._qact(tag + "_f", n, F), nt), y)
        return y


def expert_table(M) -> dict:
    """A layer's experts as matmul_experts tables, built on first use and kept on M:
    {"gate_up" (or "gate" and "up"), "down": (E weights, (E, n_out) float32 biases | None)}."""
    table = M.__dict__.get("_expert_table")
    if table is None:
        X0 = M.experts[0]
        names = ("gate_up", "down") if X0.w_gate_up is not None else ("gate", "up", "down")
        table = {}
        for name in names:
            ws = [getattr(X, "w_" + name) for X in M.experts]
            bs = [getattr(X, "b_" + name) for X in M.experts]
            bias = None if bs[0] is None else np.ascontiguousarray(np.stack(bs), np.float32)
            table[name] = (ws, bias)
        M.__dict__["_expert_table"] = table
    return table
