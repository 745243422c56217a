"""What a family is: the class every architecture family derives from, with what it declares
about itself and the parts of the forward step that every family runs the same way
(embedding, attention over the KV blocks, the gated feed-forward, the final norm and LM head).

A family declares (ClassVars, each in its own class body, read by Family.declared;
tests/test_registry.py checks):
  capturable    its decode steps can be recorded and replayed as one C graph (goinfer/graph.py):
                every array operation of its forward() goes through self.ops and writes out=
  weight_types  the dataclasses of its weights tree, which the layout cache stores and rebuilds
                (goinfer/layout.py); () = the family is not layout-cached
and its config (models/base.py ModelConfig) declares which layers hold KV, their geometry and
any recurrent state.  ``self.ops`` is the kernels module (goinfer._kernels, the NumPy reference,
or a stand-in that records or times the calls).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from goinfer.models.base import Act, Batch, ModelConfig, RopeCache, Scratch
from goinfer.models.loading import Loader
from goinfer.quant import INT_KINDS, QWeight

if TYPE_CHECKING:
    from goinfer.gguf import GGUFFile
    from goinfer.models.arch import Arch

# ============================================================================ a layer's weights


@dataclass
class LayerWeights:
    """An attention layer and its gated feed-forward (the fields other families extend)."""

    attn_norm: np.ndarray  # (D,) f32
    wqkv: QWeight | None  # fused (Hq*hd + 2*KV*hd, D), or None when q/k/v cannot be fused
    wq: QWeight | None
    wk: QWeight | None
    wv: QWeight | None
    bqkv: np.ndarray | None  # (Hq*hd + 2*KV*hd,) f32
    q_norm: np.ndarray | None  # (hd,) f32
    k_norm: np.ndarray | None
    wo: QWeight
    ffn_norm: np.ndarray
    w_gate_up: QWeight | None  # fused (2F, D)
    w_gate: QWeight | None
    w_up: QWeight | None
    w_down: QWeight

    def weights(self) -> list[QWeight]:
        return [
            w
            for w in (
                self.wqkv,
                self.wq,
                self.wk,
                self.wv,
                self.wo,
                self.w_gate_up,
                self.w_gate,
                self.w_up,
                self.w_down,
            )
            if w is not None
        ]


def load_gated_ffn(ld: Loader, F: int, D: int) -> dict:
    """The LayerWeights fields w_gate_up | w_gate, w_up and w_down of a gated feed-forward of
    width F."""
    w_gate_up, (w_gate, w_up) = ld.fused(("ffn_gate.weight", F, D), ("ffn_up.weight", F, D))
    return dict(
        w_gate_up=w_gate_up, w_gate=w_gate, w_up=w_up, w_down=ld.mat("ffn_down.weight", D, F)
    )


NO_FFN = dict(w_gate_up=None, w_gate=None, w_up=None, w_down=None)  # a layer whose FFN is MoE

# ============================================================================ the family


class Family:
    """Weights and forward step of one architecture family (subclasses: models/*.py)."""

    capturable: ClassVar[bool] = False
    weight_types: ClassVar[tuple[type, ...]] = ()
    ffn_act: ClassVar[str] = "swiglu"  # the kernel combining gate and up (gelu_tanh_mul: GeGLU)

    @classmethod
    def declared(cls, capability: str):
        """A capability (capturable, weight_types) as this class itself declares it, or None: a
        subclass does not inherit it, since it may do what its parent's declaration rules out."""
        return vars(cls).get(capability)

    @staticmethod
    def read_config(g: GGUFFile, arch: Arch) -> ModelConfig:
        """The family's config from the GGUF g (arch: its registry entry)."""
        raise NotImplementedError

    @staticmethod
    def load_layer(g: GGUFFile, cfg: ModelConfig, i: int) -> LayerWeights:
        """Layer i's weights."""
        raise NotImplementedError

    def __init__(
        self,
        g: GGUFFile,
        cfg: ModelConfig,
        ops,
        threads: int,
        progress: Callable[[int], object] | None = None,
        weights: dict | None = None,
    ):
        """weights: the dict load_weights returns (memory-mapped from the layout cache,
        goinfer/layout.py); None loads them from the GGUF g."""
        self.cfg = cfg
        self.ops = ops
        self.threads = threads
        if weights is None:
            weights = self.load_weights(g, cfg, progress)
        self.tok_embd = weights["tok_embd"]
        self.layers = weights["layers"]
        self.out_norm = weights["out_norm"]
        self.lm_head = self.tok_embd if weights["lm_head"] is None else weights["lm_head"]
        self.rope = RopeCache(
            cfg.n_rot,
            cfg.rope_base,
            cfg.context_length,
            weights["rope_freqs"],
            cfg.rope_scale,
            cfg.rope_yarn,
        )
        self.attn_scale: float | None = None  # multiplies q.k (None: 1/sqrt(head_dim))
        self.attn_softcap = 0.0  # tanh softcap of the attention logits (0: none)
        self.embed_scale: np.float32 | None = None  # multiplies the embedding rows (None: none)
        self.final_softcap = 0.0  # tanh softcap of the output logits (0: none)
        self.scratch = Scratch()
        self.row_tables: dict = {}  # {name: RowTable}: weights read from the file by row

    @classmethod
    def load_weights(
        cls,
        g: GGUFFile,
        cfg: ModelConfig,
        progress: Callable[[int], object] | None = None,
        keep: Callable | None = None,
    ) -> dict:
        """Every weight of the model from the GGUF g, as a dict of plain containers (QWeight,
        float32 arrays, the family's weight_types, lists, None): tok_embd, layers, out_norm,
        lm_head (None when tied to tok_embd), rope_freqs (or None).  keep(obj) is called on each
        layer (and the other top-level weights) as soon as it is loaded and returns what to keep
        in its place (the layout cache writes it out and keeps a reference)."""
        keep = keep or (lambda obj: obj)
        ld, D = Loader(g), cfg.d_model
        tok_embd = keep(ld.mat("token_embd.weight", cfg.vocab_size, D))
        layers = []
        for i in range(cfg.n_layers):
            layers.append(keep(cls.load_layer(g, cfg, i)))
            if progress is not None:
                progress(1)
        out_norm = ld.vec("output_norm.weight", D)
        lm_head = None
        if not cfg.tied_embeddings:
            lm_head = keep(ld.mat("output.weight", cfg.vocab_size, D))
        rope_freqs = g.load_f32("rope_freqs.weight") if ld.has("rope_freqs.weight") else None
        return dict(
            tok_embd=tok_embd,
            layers=layers,
            out_norm=out_norm,
            lm_head=lm_head,
            rope_freqs=rope_freqs,
        )

    @classmethod
    def row_table_names(cls, top: dict) -> tuple[str, ...]:
        """The top-level weights (keys of load_weights' dict; top maps them to a stored form
        where None stays None) that the model only ever reads a row at a time: an embedding
        table not tied to the LM head.  Loaded from the layout cache, they are read from the
        file as steps need their rows (goinfer/row_table.py; self.row_tables)."""
        return ("tok_embd",) if top.get("lm_head") is not None else ()

    def weights(self) -> list[QWeight]:
        ws = [self.tok_embd] + [w for L in self.layers for w in L.weights()]
        if self.lm_head is not self.tok_embd:
            ws.append(self.lm_head)
        return ws

    # ------------------------------------------------------------------ per layer

    def layer_rope(self, li: int) -> RopeCache | None:
        """The RoPE tables of layer li, or None for a layer that applies no RoPE."""
        return self.rope

    def layer_window(self, li: int) -> int:
        """Sliding window of layer li in tokens (0: full causal attention)."""
        return self.cfg.window(li)

    # ------------------------------------------------------------------ the shared steps

    def mm(self, act: Act, w: QWeight, out: np.ndarray) -> np.ndarray:
        """act (T, n_in) times w -> out (T, n_out)."""
        return self.ops.matmul(act.for_weight(w), w, out=out, nthreads=self.threads)

    def forward(
        self, batch: Batch, k_cache, v_cache, logits: np.ndarray | None = None
    ) -> np.ndarray:
        """Run the batch through the model, writing its K/V into the cache slots.

        Returns logits (len(batch.logit_rows), vocab) float32 (in `logits` when given)."""
        raise NotImplementedError

    def embed(self, tokens: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Token embeddings (T, D) into out (times embed_scale when set)."""
        x = self.get_rows("tok_embd", self.tok_embd, tokens, out)
        if self.embed_scale is not None:
            self.ops.scale(x, self.embed_scale, out=x, nthreads=self.threads)
        return x

    def get_rows(self, name: str, w: QWeight, tokens: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Rows tokens of the weight w (the top-level weight name) into out (T, n_in): from w,
        or, for a row table, staged from the file (row_table.py) a capacity at a time."""
        table = self.row_tables.get(name)
        if table is None:
            return self.ops.get_rows(w, tokens, out=out, nthreads=self.threads)
        for i in range(0, len(tokens), table.capacity):
            j = min(len(tokens), i + table.capacity)
            ids = table.stage(tokens[i:j])
            self.ops.get_rows(table.weight, ids, out=out[i:j], nthreads=self.threads)
        return out

    def head(
        self, x: np.ndarray, rows: np.ndarray, out: np.ndarray | None = None, hidden: bool = False
    ) -> np.ndarray:
        """Final norm and LM head for the rows that need logits -> (len(rows), vocab) (in out
        when given); hidden=True: the final-normed hidden states (len(rows), d_model) instead
        (what embedding models pool)."""
        ops, cfg, S = self.ops, self.cfg, self.scratch
        R = len(rows)
        if R == 0:
            return np.zeros((0, cfg.d_model if hidden else cfg.vocab_size), np.float32)
        xr = (
            x
            if R == x.shape[0]
            else ops.gather_rows(x, rows, out=S.get("xr", R, cfg.d_model), nthreads=self.threads)
        )  # (R, D)
        hr = ops.rmsnorm(
            xr, self.out_norm, cfg.norm_eps, out=S.get("hr", R, cfg.d_model), nthreads=self.threads
        )
        if hidden:
            return hr.copy()  # (R, D), out of the scratch buffer
        logits = np.empty((R, cfg.vocab_size), np.float32) if out is None else out
        self.mm(Act(ops, hr, S.qact(R, cfg.d_model), self.threads), self.lm_head, logits)
        if self.final_softcap > 0:  # tanh(logits / cap) * cap, per element
            ops.softcap(logits, self.final_softcap, out=logits, nthreads=self.threads)
        return logits

    def attend(
        self,
        li: int,
        q,
        kc,
        vc,
        batch: Batch,
        out,
        window: int = 0,
        softcap: float = 0.0,
        scale: float | None = None,
        sinks=None,
    ):
        """Attention of q (T, H, hd) over each segment's blocks -> out (T, H, hd).  A row at a
        position below batch.fast_from runs the exact kernel, a row at or above it the float32
        tiled one (a segment crossing it is two calls; its positions ascend).  sinks (H,)
        float32: attention sink logits (gpt-oss), given to either kernel.  A sliding-window
        layer reads its window slots (Segment.table_for)."""
        if scale is None:
            scale = 1.0 / float(np.sqrt(self.cfg.head_dim))
        extra = {} if sinks is None else {"sinks": sinks}
        ff = batch.fast_from
        for seg in batch.segments:
            pos = batch.positions[seg.start : seg.stop]
            split = seg.start + (len(pos) if ff is None else int(np.searchsorted(pos, ff)))
            for a, b, fast in ((seg.start, split, False), (split, seg.stop, True)):
                if b > a:
                    kernel = self.ops.attention_fast if fast else self.ops.attention
                    kernel(
                        q[a:b],
                        kc,
                        vc,
                        seg.table_for(window),
                        batch.positions[a:b],
                        scale,
                        window,
                        softcap,
                        out=out[a:b],
                        nthreads=self.threads,
                        **extra,
                    )
        return out

    def gated_ffn(self, L: LayerWeights, h: np.ndarray, out: np.ndarray) -> None:
        """Normed input h (T, D) -> the gated feed-forward of L into out (T, D).  The width F is
        the layer's own (w_down's input): Gemma 4's KV-shared layers have a double-wide MLP."""
        ops, S, nt, F = self.ops, self.scratch, self.threads, L.w_down.n_in
        T = h.shape[0]
        sfx = "" if F == self.cfg.d_ff else str(F)  # scratch per width: no regrowth per layer
        a = Act(ops, h, S.qact(T, h.shape[1]), nt)
        if L.w_gate_up is not None:
            gu = self.mm(a, L.w_gate_up, S.get("gu" + sfx, T, 2 * F))  # (T, 2F): gate | up
            gate, up = gu[:, :F], gu[:, F:]
        else:
            gate = self.mm(a, L.w_gate, S.get("gate" + sfx, T, F))
            up = self.mm(a, L.w_up, S.get("up" + sfx, T, F))
        if L.w_down.kind in INT_KINDS:  # the product quantized as it is computed
            q = ops.quantize_gated(gate, up, self.ffn_act, out=S.qact(T, F).rows(T), nthreads=nt)
            ops.matmul(q, L.w_down, out=out, nthreads=nt)
            return
        f = getattr(ops, self.ffn_act)(gate, up, out=S.get("f" + sfx, T, F), nthreads=nt)
        self.mm(Act(ops, f, S.qact(T, F), nt), L.w_down, out)
