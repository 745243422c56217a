"""The routed-experts feed-forward, shared by every MoE family (mixtral, qwen2moe, qwen3moe,
olmoe: models/moe.py; gpt-oss; qwen35moe; Gemma 4 26B-A4B): its config fields, its weights,
their loading, and the component that runs it (``MoEFFN``).

  router matmul (T, E) -> moe_route: k experts and weights per row ->
  moe_group: the T*k (row, expert) entries sorted by expert -> per expert, ONE GEMM over
  all its rows: gate/up -> gated activation -> down -> moe_fold: each row's k outputs weighted
  and summed in rank order, in float64, divided by the weights' sum where they are meant to sum
  to 1 [+ the shared expert behind a sigmoid gate (qwen2moe)], rounded once.
Matmul rows are independent, so a row's expert outputs do not depend on which rows share
the GEMM: the expert-major result is bit-identical to running the tokens one at a time, and
a decoded token reads only its k experts' weights.

GGUF layout (llama.cpp's): router blk.N.ffn_gate_inp.weight (E, D); experts stacked as
blk.N.ffn_{gate,up}_exps.weight (E, F, D) (or one ffn_gate_up_exps (E, 2F, D)) and
ffn_down_exps.weight (E, D, F); shared expert ffn_{gate,up,down}_shexp.weight and its gate
ffn_gate_inp_shexp.weight (D,).  Metadata {arch}.expert_count, .expert_used_count,
.expert_feed_forward_length, .expert_shared_feed_forward_length, .expert_weights_norm,
.expert_weights_scale, .expert_gating_func (softmax only).  How each architecture routes by
default (llama.cpp's choices) is in the registry (routing, norm_topk).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from goinfer.errors import ModelFormatError, UnsupportedArchitectureError
from goinfer.models.base import Act
from goinfer.models.loading import Loader, scalar_int
from goinfer.quant import QAct, QWeight, concat_rows, pack_float

if TYPE_CHECKING:
    from goinfer.gguf import GGUFFile
    from goinfer.models.arch import Arch
    from goinfer.models.family import Family

_SOFTMAX_GATING = 1  # gguf ExpertGatingFuncType.SOFTMAX

# ============================================================================ config


@dataclass(kw_only=True)
class ExpertFields:
    """The config fields of a model with routed experts (mixed into its ModelConfig)."""

    n_expert: int = 0
    n_expert_used: int = 0  # k
    d_ff_expert: int = 0
    d_ff_shared: int = 0  # 0: no shared expert
    routing: str = "softmax_topk"  # or "topk_softmax"
    norm_topk: bool = False  # renormalize the chosen softmax weights to sum 1
    expert_weights_scale: float = 1.0

    def describe_experts(self) -> str:
        shared = f" + shared ffn {self.d_ff_shared}" if self.d_ff_shared else ""
        return (
            f", {self.n_expert} experts (top {self.n_expert_used}, ffn {self.d_ff_expert}){shared}"
        )


def has_experts(g: GGUFFile) -> bool:
    """Does the GGUF carry MoE routers (blk.N.ffn_gate_inp.weight)?"""
    return any(n.startswith("blk.") and n.endswith(".ffn_gate_inp.weight") for n in g.tensor_names)


def read_experts(g: GGUFFile, arch: Arch, n_layers: int, d_model: int) -> dict:
    """The ExpertFields of the file: expert count and width from the first layer with a router,
    checked against the metadata; routing and norm_topk from the registry unless the file's
    expert_weights_norm says otherwise; llama.cpp reads an expert_weights_scale of 0 as 1."""
    a = g.arch
    E = int(g.arch_get("expert_count", 0) or 0)
    k = int(g.arch_get("expert_used_count", 0) or 0)
    if E < 1 or not 1 <= k <= E:
        raise ModelFormatError(
            f"{g.path}: {a}.expert_count = {E} and {a}.expert_used_count "
            f"= {k} do not describe a mixture of experts (need 1 <= used <= count)"
        )
    gating = g.arch_get("expert_gating_func")
    if gating is not None and int(gating) != _SOFTMAX_GATING:
        raise UnsupportedArchitectureError(
            f"{g.path}: expert gating function {gating} is not supported (softmax only)"
        )
    i = next((i for i in range(n_layers) if g.has_tensor(f"blk.{i}.ffn_gate_inp.weight")), None)
    if i is None:
        raise ModelFormatError(
            f"{g.path}: {a}.expert_count = {E} but no layer has an expert "
            "router (blk.N.ffn_gate_inp.weight)"
        )
    p = f"blk.{i}."
    if g.has_tensor(p + "ffn_gate_up_exps.weight"):  # gate | up stacked in one tensor
        name, per = p + "ffn_gate_up_exps.weight", 2
    elif g.has_tensor(p + "ffn_gate_exps.weight"):
        name, per = p + "ffn_gate_exps.weight", 1
    elif g.has_tensor(p + "ffn_gate.0.weight"):
        raise ModelFormatError(
            f"{g.path}: experts stored one tensor each (blk.N.ffn_gate.E.weight, "
            "an old llama.cpp layout); re-convert the model with a current "
            "llama.cpp, which stacks them (blk.N.ffn_gate_exps.weight)"
        )
    else:
        raise ModelFormatError(
            f"{g.path}: layer {i} has an expert router but no experts ({p}ffn_gate_exps.weight)"
        )
    _, shape = g.tensor_info(name)
    if len(shape) != 3 or shape[0] != E or shape[2] != d_model or shape[1] % per:
        raise ModelFormatError(
            f"{g.path}: {name} has shape {shape}, expected ({E}, "
            f"{'2 x ' if per == 2 else ''}n_ff, {d_model})"
        )
    F = int(shape[1]) // per
    meta_ff = g.arch_get("expert_feed_forward_length")
    if meta_ff is not None and scalar_int(g, "expert_feed_forward_length") != F:
        raise ModelFormatError(
            f"{g.path}: {a}.expert_feed_forward_length = {meta_ff} but the "
            f"expert tensors have {F} rows"
        )
    shared = 0
    if g.has_tensor(p + "ffn_gate_shexp.weight"):
        shared = int(g.tensor_info(p + "ffn_gate_shexp.weight")[1][0])
    return dict(
        n_expert=E,
        n_expert_used=k,
        d_ff_expert=F,
        d_ff_shared=shared,
        routing=arch.routing,
        norm_topk=bool(g.arch_get("expert_weights_norm", arch.norm_topk)),
        expert_weights_scale=float(g.arch_get("expert_weights_scale", 1.0) or 1.0),
    )


# ============================================================================ weights


@dataclass
class FFNWeights:
    """One gated feed-forward: an expert, or the shared expert."""

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

    def weights(self) -> list[QWeight]:
        return [w for w in (self.w_gate_up, self.w_gate, self.w_up, self.w_down) if w is not None]


@dataclass
class MoEWeights:
    router: QWeight  # (E, D)
    experts: list[FFNWeights]
    shared: FFNWeights | None = None
    shared_gate: QWeight | None = None  # (1, D) float32
    router_bias: np.ndarray | None = None  # (E,) f32 (gpt-oss)

    def weights(self) -> list[QWeight]:
        ws = [self.router] + [w for x in self.experts for w in x.weights()]
        if self.shared is not None:
            ws += self.shared.weights() + [self.shared_gate]
        return ws


def _ffn(
    ld: Loader,
    name: str,
    gate: QWeight,
    up: QWeight,
    down: QWeight,
    F: int,
    D: int,
    biases: tuple | None = None,
) -> FFNWeights:
    """A feed-forward from its three matrices (checked, gate and up fused when they can be).
    biases: (b_gate (F,), b_up (F,), b_down (D,)) or None."""
    ld.check(name + " gate", gate, F, D)
    ld.check(name + " up", up, F, D)
    ld.check(name + " down", down, D, F)
    gu = concat_rows([gate, up])
    if gu is not None:
        gate = up = None
    b = dict(zip(("b_gate", "b_up", "b_down"), biases)) if biases is not None else {}
    return FFNWeights(gu, gate, up, down, **b)


def load_experts(ld: Loader, E: int, F: int, D: int, *, biases: bool = False) -> list[FFNWeights]:
    """A layer's E experts of width F from the stacked tensors (one ffn_gate_up_exps, or
    ffn_gate_exps and ffn_up_exps; ffn_down_exps), with their biases ffn_*_exps.bias (E, n)
    when biases (gpt-oss)."""
    p = ld.prefix
    if ld.has("ffn_gate_up_exps.weight"):
        gus, downs = ld.stacked("ffn_gate_up_exps.weight"), ld.stacked("ffn_down_exps.weight")
        if len(gus) != E or len(downs) != E:
            raise ld.error(
                f"{p}ffn_*_exps hold {len(gus)}/{len(downs)} gate_up/down experts, expected {E}"
            )
        return [
            FFNWeights(
                ld.check(f"expert {e} gate_up", gus[e], 2 * F, D),
                None,
                None,
                ld.check(f"expert {e} down", downs[e], D, F),
            )
            for e in range(E)
        ]
    gates, ups, downs = (ld.stacked(f"ffn_{n}_exps.weight") for n in ("gate", "up", "down"))
    if not len(gates) == len(ups) == len(downs) == E:
        raise ld.error(
            f"{p}ffn_*_exps hold {len(gates)}/{len(ups)}/{len(downs)} gate/up/down "
            f"experts, expected {E}"
        )
    bg = bu = bd = None
    if biases:
        bg, bu, bd = (
            ld.array(f"ffn_{n}_exps.bias", E, m) for n, m in (("gate", F), ("up", F), ("down", D))
        )
    experts = []
    for e in range(E):
        b = None if bg is None else (bg[e], bu[e], bd[e])
        experts.append(_ffn(ld, f"expert {e}", gates[e], ups[e], downs[e], F, D, b))
        gates[e] = ups[e] = None  # drop the unfused copies as we go
    return experts


def load_moe(ld: Loader, cfg: ExpertFields, D: int, *, biases: bool = False) -> MoEWeights:
    """A layer's router, experts and shared expert (llama.cpp's tensor names); biases: the
    router's and the experts' biases too (gpt-oss)."""
    E = cfg.n_expert
    router = ld.mat("ffn_gate_inp.weight", E, D)
    moe = MoEWeights(router, load_experts(ld, E, cfg.d_ff_expert, D, biases=biases))
    if biases:
        moe.router_bias = ld.vec("ffn_gate_inp.bias", E)
    if ld.has("ffn_gate_shexp.weight"):
        Fs = cfg.d_ff_shared
        gu, (gate, up) = ld.fused(("ffn_gate_shexp.weight", Fs, D), ("ffn_up_shexp.weight", Fs, D))
        moe.shared = FFNWeights(gu, gate, up, ld.mat("ffn_down_shexp.weight", D, Fs))
        gate_vec = ld.g.load_f32(ld.prefix + "ffn_gate_inp_shexp.weight").reshape(-1)
        if gate_vec.shape != (D,):
            raise ld.error(
                f"{ld.prefix}ffn_gate_inp_shexp.weight has {gate_vec.size} values, expected {D}"
            )
        moe.shared_gate = pack_float("f32", np.ascontiguousarray(gate_vec[None, :], np.float32))
    return moe


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


# ============================================================================ running them


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


class MoEFFN:
    """The routed experts of a model, run for its family (``host``: the kernels, threads and
    scratch are the host's at every call, so a graph capture that swaps host.ops sees them).

    ``expert_major`` (default True) runs each expert once over all its rows; False runs
    every (token, expert) pair on its own (the token-by-token baseline; same bits).
    act, act_args: the experts' gated activation, a kernel called act(gate, up, *act_args)."""

    def __init__(self, host: Family, act: str = "swiglu", act_args: tuple = ()):
        self.host = host
        self.cfg = host.cfg  # a ModelConfig with ExpertFields
        self.act, self.act_args = act, act_args
        self.expert_major = True
        cfg = self.cfg
        # weights that sum to 1 mathematically: the fold divides by their float32 sum
        self.renorm = (
            cfg.routing == "topk_softmax" or cfg.norm_topk
        ) and cfg.expert_weights_scale == 1.0
        self.stats = MoEStats()
        self._qbufs: dict[str, QAct] = {}

    def qact(self, name: str, n: int, K: int) -> QAct:
        """A QAct buffer of its own (the shared Scratch.qact is keyed by the width K only)."""
        q = self._qbufs.get(name)
        if q is None or q.qa.shape[0] < n or q.qa.shape[1] != K:
            q = QAct.empty(max(n, 1), K)
            self._qbufs[name] = q
        return q.rows(n)

    def __call__(self, M: MoEWeights, h: np.ndarray, out: np.ndarray) -> None:
        """A standard MoE layer: normed input h (T, D) -> router [+ bias] -> moe_route ->
        experts [+ the shared expert] -> moe_fold into out (T, D)."""
        ops, cfg, S, nt = self.host.ops, self.cfg, self.host.scratch, self.host.threads
        T, D = h.shape
        a = Act(ops, h, self.qact("moe_h", T, D), nt)
        logits = self.host.mm(a, M.router, S.get("moe_logits", T, cfg.n_expert))  # (T, E)
        if M.router_bias is not None:
            ops.add_bias(logits, M.router_bias, out=logits, nthreads=nt)
        ids, w = self.route(logits)
        y, pos = self.experts(M, h, ids, a)
        shared = logit = None
        if M.shared is not None:
            shared = self._shared_expert(M.shared, a, T)
            logit = self.host.mm(a, M.shared_gate, S.get("moe_sh_logit", T, 1)).reshape(T)
        ops.moe_fold(y, w, pos, shared, logit, renorm=self.renorm, out=out, nthreads=nt)

    def route(self, logits: np.ndarray):
        """Router logits (T, E) -> the chosen experts ids (T, k) int32 and their weights (T, k)."""
        ops, cfg, S, nt = self.host.ops, self.cfg, self.host.scratch, self.host.threads
        T, k = logits.shape[0], cfg.n_expert_used
        return ops.moe_route(
            logits,
            k,
            cfg.routing,
            cfg.norm_topk,
            cfg.expert_weights_scale,
            ids=S.get("moe_ids", T, k, dtype=np.int32),
            weights=S.get("moe_w", T, k),
            nthreads=nt,
        )

    def experts(self, M, h: np.ndarray, ids: np.ndarray, a: Act | None = None):
        """The routed experts over the rows of h (T, D) (a: the Act of h, for the token-major
        path) -> y (T*k, D), pos (T*k,): entry t*k+r of the fold is row pos[t*k+r] of y."""
        if self.expert_major:
            return self._experts_by_expert(M, h, ids)
        if a is None:
            a = Act(self.host.ops, h, self.qact("moe_h", *h.shape), self.host.threads)
        return self._experts_by_token(M, a, ids)

    def _experts_by_expert(self, M, h, ids):
        """Expert-major: sort the T*k entries by expert and run every expert over its rows,
        all experts of the layer in one matmul_experts call per projection.
        -> y (T*k, D) in sorted order, pos (T*k,) (entry t*k+r -> row of y)."""
        ops, cfg, S, nt = self.host.ops, self.cfg, self.host.scratch, self.host.threads
        T, D = h.shape
        n, E = T * cfg.n_expert_used, cfg.n_expert
        rows, offsets, pos = ops.moe_group(
            ids,
            E,
            rows=S.get("moe_rows", n, dtype=np.int32),
            offsets=S.get("moe_off", E + 1, dtype=np.int64),
            pos=S.get("moe_pos", n, dtype=np.int32),
            nthreads=nt,
        )
        xg = ops.gather_rows(h, rows, out=S.get("moe_xg", n, D), nthreads=nt)  # (n, D) routed rows
        table = expert_table(M)

        def project(name, act, out):
            ws, bias = table[name]
            ops.matmul_experts(act.for_weight(ws[0]), ws, offsets, bias, out=out, nthreads=nt)

        y = self._gated(
            Act(ops, xg, self.qact("moe_xg", n, D), nt),
            n,
            cfg.d_ff_expert,
            "gate_up" in table,
            "moe_x",
            S.get("moe_y", n, D),
            project,
        )
        if getattr(ops, "recording", False):  # a graph capture: offsets hold no routing yet
            return y, pos
        self.stats.add([M.experts[e] for e in np.flatnonzero(np.diff(offsets))], n)
        return y, pos

    def _experts_by_token(self, M, a: Act, ids):
        """Token-major baseline: every (row t, rank r) entry runs its expert alone (a GEMV per
        entry and projection, by plain matmul).
        -> y (T*k, D) with entry t*k+r in row t*k+r, pos = identity."""
        cfg, S = self.cfg, self.host.scratch
        T, k = ids.shape
        n, D = T * k, cfg.d_model
        runs = [
            (t, t + 1, t * k + r, M.experts[e])
            for t in range(T)
            for r, e in enumerate(ids[t].tolist())
        ]
        y = self._gated(
            a,
            n,
            cfg.d_ff_expert,
            M.experts[0].w_gate_up is not None,
            "moe_x",
            S.get("moe_y", n, D),
            self._one_by_one(runs),
        )
        self.stats.add([X for *_, X in runs], n)
        pos = S.get("moe_pos", n, dtype=np.int32)
        pos[:] = np.arange(n, dtype=np.int32)
        return y, pos

    def _shared_expert(self, X: FFNWeights, a: Act, T: int):
        """The shared expert over the T rows of a -> (T, D)."""
        return self._gated(
            a,
            T,
            self.cfg.d_ff_shared,
            X.w_gate_up is not None,
            "moe_sh",
            self.host.scratch.get("moe_sh", T, self.cfg.d_model),
            self._one_by_one([(0, T, 0, X)]),
        )

    def _one_by_one(self, runs) -> Callable:
        """project() for _gated running FFNs one at a time: a run (i0, i1, o0, ffn) is ffn on
        input rows [i0, i1) into output rows [o0, o0 + i1 - i0)."""
        ops, nt = self.host.ops, self.host.threads

        def project(name, act, out):
            for i0, i1, o0, X in runs:
                o1 = o0 + i1 - i0
                w, b = getattr(X, "w_" + name), getattr(X, "b_" + name)
                x = act.for_weight(w)
                dst = out[o0:o1]  # the down projection reads the activation's rows o0..o1
                ops.matmul(
                    _rows(x, o0, o1) if name == "down" else _rows(x, i0, i1),
                    w,
                    out=dst,
                    nthreads=nt,
                )
                if b is not None:
                    ops.add_bias(dst, b, out=dst, nthreads=nt)

        return project

    def _gated(self, a: Act, n: int, F: int, fused: bool, tag: str, y, project):
        """A gated feed-forward over n output rows: project(name, act, out) runs projection name
        ("gate_up" when fused, else "gate" and "up"; then "down") over its rows of the Act
        (the input a, then the activation) into out.  Returns y (n, D)."""
        ops, S, nt = self.host.ops, self.host.scratch, self.host.threads
        if fused:
            gu = S.get(tag + "_gu", n, 2 * F)  # (n, 2F): gate | up
            gate, up = gu[:, :F], gu[:, F:]
            project("gate_up", a, gu)
        else:
            gate, up = S.get(tag + "_gate", n, F), S.get(tag + "_up", n, F)
            project("gate", a, gate)
            project("up", a, up)
        f = getattr(ops, self.act)(
            gate, up, *self.act_args, out=S.get(tag + "_f", n, F), nthreads=nt
        )  # (n, F)
        project("down", Act(ops, f, self.qact(tag + "_f", n, F), nt), y)
        return y
