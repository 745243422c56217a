"""Graph replay of decode and verify steps: record a forward step's kernel calls once, replay
them in C.

A decode step of B sequences (one token each) calls ~18 kernels per layer.  Called from
Python each costs argument checks and, when it runs on several threads, an OpenMP fork/join;
on a busy machine every one of those parallel regions waits for a descheduled thread.  A
``DecodePlan`` runs the family's Python ``forward`` once with a recording stand-in for the
kernels module (nothing is computed), binds every recorded call (``bind_*`` in the Cython
modules: the same argument checks, then a C record), and from then on runs the whole step as
ONE OpenMP parallel region (``goinfer._kernels.graph.Graph``), where running threads claim the
shares of each op and an op starts once the ops it depends on are complete (a descheduled
thread holds nobody up: it claims nothing).  Each op computes the same tiles / row ranges /
work items with the same C code as the Python path, so logits are bit-identical.

Everything a plan points to is persistent: the plan's own input buffers (tokens, positions,
slots, block tables, and a cache that trims sliding windows their window slots and tables,
the RoPE cos / sin of the step's positions, logits), the model's scratch buffers, weights and
the KV cache (a plan keeps every array it points into alive: when the model's scratch is
regrown for a bigger batch the plan keeps using the buffers it was captured with, which carry
nothing from one step to the next).  Per step the inputs are copied into the plan's buffers
(and the RoPE of its positions computed there; the row blocks of its tokens are read into the
staging weight of each row table that a get_rows is bound to: goinfer/row_table.py).  A plan
is rebuilt when its assumptions break: another batch size, KV cache, thread count or kernel
variant, an attention crossing the size at which the Python kernel switches from one thread
to several, or a sequence crossing the position from which its rows run the fast attention
kernel (``Batch.fast_from``: a plan binds the exact or the fast kernel per sequence, as the
Python path would call it).

A verify step of speculative decoding (goinfer/speculative.py: a sequence's last token and
its draft, logits of every row) is replayed the same way: a plan's shape is the rows of each
sequence, and a shape with several rows is captured when its key comes a second time.

Only a family that declares itself ``capturable`` (models/family.py: its forward routes every
array operation through the kernels) is captured, with the compiled kernels; everything else
(prefill chunks, the NumPy reference kernels, a profiling proxy in place of the kernels) runs
the Python path.

MoE decode steps: the routing is data, not shape.  moe_route, moe_group and the expert
matmuls are bound to the same buffers, and the bound matmul_experts reads each step's expert
offsets when it runs, so one plan serves every routing; a replayed step reads only the chosen
experts' weights, as the Python path does.

Hybrid models (Qwen3.5): every sequence brings its recurrent state, which the linear layers'
kernels update in place.  A plan binds those kernels to slots of its own pointer tables
(``state_slot``, ssm.pyx) and writes the current sequences' state addresses there before each
step, so one plan serves any sequences of the batch size; a step that must copy a state
snapshot (a block boundary every ``snapshot_every`` blocks) runs the Python path.  Only decode
steps (one row per sequence) are replayed for them: a hybrid model never drafts (its state,
advanced in place over a draft's rows, cannot be cut back to the accepted ones), so it has no
verify steps, and any other step with several rows runs the Python path.
"""

from __future__ import annotations

import importlib
import os
import weakref

import numpy as np

from goinfer.models.base import Batch, Segment
from goinfer.recurrent import RecurrentState, SeqRecurrent

MAX_PLANS_PER_CACHE = 32  # plans kept per KV cache (least recently used dropped)
MAX_ROWS = 65  # rows per sequence a plan replays (a token + a draft of up to 64)


def enabled_by_env() -> bool:
    """GOINFER_GRAPH=0 turns graph replay off (default on)."""
    return os.environ.get("GOINFER_GRAPH", "1").strip().lower() not in ("0", "false", "off", "no")


def supported(impl, kernels) -> bool:
    """Can this family's decode step be captured with these kernels?  Its class declares it
    (Family.declared("capturable")); the NumPy reference kernels are never captured."""
    compiled = getattr(kernels, "__name__", "") == "goinfer._kernels"
    return compiled and bool(type(impl).declared("capturable"))


class CaptureError(RuntimeError):
    """A forward step did something a plan cannot replay (internal: the step falls back)."""


# ============================================================================ recording


def _bind_modules():
    m = {
        n: importlib.import_module(f"goinfer._kernels.{n}")
        for n in ("matmul", "ops", "attention", "ssm", "moe")
    }
    return {
        "quantize_act": m["matmul"].bind_quantize_act,
        "quantize_gated": m["matmul"].bind_quantize_gated,
        "matmul": m["matmul"].bind_matmul,
        "matmul_experts": m["matmul"].bind_matmul_experts,
        "get_rows": m["matmul"].bind_get_rows,
        "rmsnorm": m["ops"].bind_rmsnorm,
        "swiglu": m["ops"].bind_swiglu,
        "swiglu_oai": m["ops"].bind_swiglu_oai,
        "gelu_tanh_mul": m["ops"].bind_gelu_tanh_mul,
        "add": m["ops"].bind_add,
        "add_bias": m["ops"].bind_add_bias,
        "copy2d": m["ops"].bind_copy2d,
        "scale": m["ops"].bind_scale,
        "rope": m["ops"].bind_rope,
        "softcap": m["ops"].bind_softcap,
        "gather_rows": m["ops"].bind_gather_rows,
        "kv_write": m["attention"].bind_kv_write,
        "attention": m["attention"].bind_attention,
        "attention_fast": m["attention"].bind_attention_fast,
        "ssm_conv": m["ssm"].bind_ssm_conv,
        "gated_delta": m["ssm"].bind_gated_delta,
        "sigmoid_mul": m["ssm"].bind_sigmoid_mul,
        "moe_route": m["moe"].bind_moe_route,
        "moe_group": m["moe"].bind_moe_group,
        "moe_fold": m["moe"].bind_moe_fold,
    }, m["attention"]


# kernels whose results are several out= buffers (returned as a tuple, in this order)
OUTS = {"moe_route": ("ids", "weights"), "moe_group": ("rows", "offsets", "pos")}


class _Recorder:
    """Stands in for the kernels module during capture: records each call, computes nothing,
    and returns the call's ``out`` (every call of a captured forward passes one; the MoE
    routing kernels their several out buffers, OUTS).  A family's forward sees ``recording``
    and skips what only the Python path keeps (counters read from kernel results)."""

    recording = True

    def __init__(self, kernels, names):
        self._k = kernels
        self._names = names
        self.calls: list[tuple[str, tuple, dict]] = []

    def __getattr__(self, name):
        fn = getattr(self._k, name)
        if name.startswith("_") or not callable(fn):
            return fn
        if name not in self._names:
            raise CaptureError(f"kernel {name!r} cannot be replayed")
        calls = self.calls

        def record(*a, **kw):
            calls.append((name, a, kw))
            if name == "kv_write":
                return None
            if name in OUTS:
                if any(kw.get(o) is None for o in OUTS[name]):
                    raise CaptureError(f"{name} called without {'=, '.join(OUTS[name])}=")
                return tuple(kw[o] for o in OUTS[name])
            if kw.get("out") is None:
                raise CaptureError(f"{name} called without out=")
            return kw["out"]

        return record


# ============================================================================ barriers


ATTENTION = ("attention", "attention_fast")


def _same_attention_group(prev, cur) -> bool:
    """Two attention calls (either kernel) of one layer: rows of the same q and out buffers,
    the same cache views (Family.attend passes one k/v cache view per layer to every
    segment)."""
    (_, pa, pk), (_, ca, ck) = prev, cur
    qb, ob = pa[0].base, pk["out"].base
    return (
        qb is not None
        and ob is not None
        and qb is ca[0].base
        and ob is ck["out"].base
        and pa[1] is ca[1]
        and pa[2] is ca[2]
    )


def place_barriers(ops, calls) -> None:
    """Set each op's barrier flag: start only when every earlier op is complete.  Every op
    needs it (shares are claimed by whichever thread runs, so program order on one thread
    proves nothing) except the first, and the next segment's attention of the same layer:
    those ops only read q, the caches, positions and block tables (written before the group,
    behind a barrier) and write disjoint rows of out and the running thread's scratch row."""
    prev_call = None
    for i, (op, call) in enumerate(zip(ops, calls)):
        grouped = (
            prev_call is not None
            and call[0] in ATTENTION
            and prev_call[0] in ATTENTION
            and _same_attention_group(prev_call, call)
        )
        op.barrier = not (i == 0 or grouped)
        if op.nshares > 0:
            prev_call = call


# ============================================================================ a plan


def attention_key(impl, batch: Batch) -> tuple:
    """Per sequence of a batch: (its rows, how many of them run the exact kernel (the rest run
    the fast one), whether each of its one or two attention calls runs on several threads).
    The rules of the Python path (Family.attend, attention.pyx _run_items), which a plan
    reproduces."""
    ff = batch.fast_from
    grain = importlib.import_module("goinfer._kernels.attention")._get_grain()
    hw = impl.cfg.n_heads * impl.cfg.head_dim
    key = []
    for seg in batch.segments:
        pos = batch.positions[seg.start : seg.stop]
        k = len(pos) if ff is None else int(np.searchsorted(pos, ff))
        threaded = (
            ()
            if impl.threads <= 1
            else tuple(
                len(p) * hw * (int(p[-1]) + 1) >= grain for p in (pos[:k], pos[k:]) if len(p)
            )
        )
        key.append((len(pos), k, threaded))
    return tuple(key)


class DecodePlan:
    """One step of B sequences over one KVCache, captured once: a decode step (one token
    each) or a verify step (a token and its draft: a few tokens, logits of every row).
    shape: rows per sequence."""

    def __init__(self, impl, kernels, cache, shape: tuple[int, ...], n_ctx: int):
        cfg = impl.cfg
        B, T = len(shape), sum(shape)
        self.impl, self.B, self.T, self.shape, self.threads = impl, B, T, shape, impl.threads
        self.k, self.v = cache.k, cache.v
        bs = cache.block_size
        self.block_size = bs
        self.max_blocks = min(cache.n_blocks, -(-n_ctx // bs))
        self.max_pos = min(n_ctx, self.max_blocks * bs) - 1
        self.dispatch = kernels._config.dispatch_key()  # the kernel tables bound
        # ---- the plan's own input and output buffers (the graph points into them)
        self.tokens = np.zeros(T, np.int64)  # (T,)
        self.positions = np.zeros(T, np.int32)  # (T,)
        self.slots = np.zeros(T, np.int64)  # (T,)
        self.tables = np.zeros((B, self.max_blocks), np.int32)  # (B, max_blocks)
        # a cache that trims sliding windows: those layers' slots and tables (window slots)
        self.windowed = bool(cache.window)
        self.wslots = np.zeros(T, np.int64) if self.windowed else None  # (T,)
        self.wtables = np.zeros((B, self.max_blocks), np.int32) if self.windowed else None
        self.logits = np.zeros((T, cfg.vocab_size), np.float32)  # (T, vocab)
        self.rows = np.arange(T, dtype=np.int64)
        # RoPE of the step's positions, per RoPE of the model: cos, sin (T, n_rot/2), rows (T,)
        ropes = {impl.layer_rope(li) for li in range(cfg.n_layers)} - {None}
        self.rope = {
            r: (
                np.zeros((T, r.args[0] // 2)),
                np.zeros((T, r.args[0] // 2)),
                np.arange(T, dtype=np.int32),
            )
            for r in ropes
        }
        self.starts = np.concatenate([[0], np.cumsum(shape)]).astype(int).tolist()
        # hybrid models: the state each sequence's linear-layer ops read, by address
        self.spec = cfg.state_spec
        if self.spec is not None:
            n_lin = self.spec.n_lin
            self.conv_slots = np.zeros(B * n_lin, np.uint64)  # (B * n_lin,) conv state addresses
            self.ssm_slots = np.zeros(B * n_lin, np.uint64)  # (B * n_lin,) ssm state addresses
        self._kernels = kernels
        self._graph = None
        self.attn_key = None

    # ------------------------------------------------------------------ per step

    def load(self, batch: Batch) -> None:
        """Copy a batch's inputs into the plan's buffers (hybrid: the addresses of the
        sequences' states into the slot tables; GraphRunner.decode checked their shapes)."""
        self.tokens[:] = batch.tokens
        for table in self.impl.row_tables.values():  # the bound get_rows reads its staging
            table.stage(self.tokens)
        self.positions[:] = batch.positions
        for r, (cos, sin, _) in self.rope.items():
            r.fill(self.positions, cos, sin)
        self.slots[:] = batch.slots
        if self.windowed:
            self.wslots[:] = batch.wslots
        for i, seg in enumerate(batch.segments):
            need = int(batch.positions[seg.stop - 1]) // self.block_size + 1
            self.tables[i, :need] = seg.block_table[:need]
            if self.windowed:
                self.wtables[i, :need] = seg.window_table[:need]
        if self.spec is not None:
            n_lin = self.spec.n_lin
            for i, seg in enumerate(batch.segments):
                st = seg.rec.state
                c0, cs = st.conv.ctypes.data, st.conv.strides[0]
                s0, ss = st.ssm.ctypes.data, st.ssm.strides[0]
                self.conv_slots[i * n_lin : (i + 1) * n_lin] = [c0 + li * cs for li in range(n_lin)]
                self.ssm_slots[i * n_lin : (i + 1) * n_lin] = [s0 + li * ss for li in range(n_lin)]

    def fits(self, batch: Batch, cache, attn_key: tuple) -> bool:
        """Can this plan run the batch (whose attention_key is attn_key) as captured?"""
        pmax = int(batch.positions.max())
        return (
            cache.k is self.k
            and cache.v is self.v
            and self.impl.threads == self.threads
            and self._kernels._config.dispatch_key() == self.dispatch
            and pmax <= self.max_pos
            and attn_key == self.attn_key
        )

    def run(self) -> np.ndarray:
        """One step over the loaded inputs -> logits (T, vocab), a fresh array."""
        self._graph.run()
        L = self.impl.cfg.n_attn_layers
        # the Python path counts each attention call and its rows
        exact = [k for n, k, _ in self.attn_key if k]
        fast = [n - k for n, k, _ in self.attn_key if n > k]
        self._attn_mod.count_exact(L * len(exact), L * sum(exact))
        self._attn_mod.count_fast(L * len(fast), L * sum(fast))
        return self.logits.copy()

    # ------------------------------------------------------------------ capture

    def capture(self, fast_from: int | None) -> None:
        """Record the family's forward over the loaded inputs and bind every call (rows at
        positions >= fast_from run the fast attention kernel)."""
        impl, B = self.impl, self.B
        binders, self._attn_mod = _bind_modules()
        Graph = importlib.import_module("goinfer._kernels.graph").Graph
        st = self.starts
        segs = [
            Segment(
                st[i],
                st[i + 1],
                self.tables[i],
                window_table=self.wtables[i] if self.windowed else None,
            )
            for i in range(B)
        ]
        slot_of = {}  # address of a capture state view -> (slot table, index)
        if self.spec is not None:  # stand-in states: the ops read the real ones through slots
            n_lin = self.spec.n_lin
            for i, seg in enumerate(segs):
                state = RecurrentState.zeros(self.spec)
                seg.rec = SeqRecurrent(state)
                for li in range(n_lin):
                    slot_of[state.conv[li].ctypes.data] = (self.conv_slots, i * n_lin + li)
                    slot_of[state.ssm[li].ctypes.data] = (self.ssm_slots, i * n_lin + li)
        batch = Batch(
            self.tokens,
            self.positions,
            self.slots,
            segs,
            self.rows,
            fast_from,
            wslots=self.wslots,
            rope=dict(self.rope),  # the plan's RoPE buffers, filled per step by load()
        )
        self.attn_key = attention_key(impl, batch)
        rec = _Recorder(self._kernels, binders)
        old = impl.ops
        impl.ops = rec
        try:
            impl.forward(batch, self.k, self.v, self.logits)
        finally:
            impl.ops = old
        # one scratch serves every attention of the graph: a row per thread
        att = importlib.import_module("goinfer._kernels.attention")
        per = max(
            [
                att.attention_scratch(*a, **kw, max_pos=self.max_pos, fast=name == "attention_fast")
                for name, a, kw in rec.calls
                if name in ATTENTION
            ]
            + [8]
        )
        self.scratch = np.zeros((self.threads, per), np.float64)  # (threads, per)
        ops, calls = [], []
        for call in rec.calls:
            name, a, kw = call
            if name in ATTENTION:
                kw = dict(kw, scratch=self.scratch, max_pos=self.max_pos)
            elif name in ("ssm_conv", "gated_delta"):
                state = a[2] if name == "ssm_conv" else a[4]
                if state.ctypes.data not in slot_of:
                    raise CaptureError(f"{name} on a state the plan does not know")
                kw = dict(kw, state_slot=slot_of[state.ctypes.data])
            op = binders[name](*a, **kw)
            for o in op if isinstance(op, list) else [op]:  # gated_delta: two ops
                ops.append(o)
                calls.append(call)
        place_barriers(ops, calls)
        self.calls = [c[0] for c in calls]
        # no op with several shares: run on the calling thread, no parallel region at all
        threads = self.threads if any(op.nshares > 1 for op in ops) else 1
        self._graph = Graph(ops, threads)

    @property
    def n_ops(self) -> int:
        return len(self._graph)

    @property
    def graph(self):
        """The bound ops (goinfer._kernels.graph.Graph): its profile() times them."""
        return self._graph

    def op_table(self) -> list[dict]:
        """Per op of the step, in order: {"name": the kernel, "weight": "q4_k 2048x8192" for
        a matmul (its kind and shape, n_out x n_in), else None, "weight_bytes": the bytes a
        matmul streams (qs and scales), else 0}."""
        out = []
        for op in self._graph.op_list:
            w = op.refs[1] if op.name == "matmul" else None
            out.append(
                {
                    "name": op.name,
                    "weight": None if w is None else f"{w.kind} {w.n_out}x{w.n_in}",
                    "weight_bytes": 0 if w is None else int(w.nbytes),
                }
            )
        return out

    @property
    def n_barriers(self) -> int:
        return self._graph.n_barriers


# ============================================================================ per model


def _replayable_state(rec, spec) -> bool:
    """A sequence's recurrent state can be read by a plan's slots: the spec's shapes, float32,
    C-contiguous, writeable, and no snapshot to take in this step."""
    if rec is None or len(rec.snap_rows):
        return False
    st = rec.state
    return all(
        a.shape == shape and a.dtype == np.float32 and a.flags.c_contiguous and a.flags.writeable
        for a, shape in ((st.conv, spec.conv_shape), (st.ssm, spec.ssm_shape))
    )


class GraphRunner:
    """The plans of one model: per KV cache (weakly held) and attention_key (each sequence's
    rows, attention kernels and threading).  A decode step's plan is captured at once; a step
    with several rows in a sequence (a verify step) is captured the second time its key
    comes, so a shape that does not recur never costs a capture."""

    def __init__(self, model):
        self.model = model
        self._plans: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._seen: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.captures = 0  # plans built (tests: invalidation)
        self.replays = 0  # steps run by a plan
        self.disabled = False  # a capture failed: this model stays on the Python path
        self.spec = model.config.state_spec  # hybrid models: the recurrent state's shapes

    def plans(self, cache) -> list[DecodePlan]:
        """The plans held for a KV cache, least recently used first."""
        return list(self._plans.get(cache, {}).values())

    @staticmethod
    def replayable(batch: Batch) -> bool:
        """Logits for every row, at most MAX_ROWS rows per sequence (decode and verify steps;
        prefill chunks want the last row only)."""
        return len(batch.logit_rows) == len(batch.tokens) and all(
            seg.stop - seg.start <= MAX_ROWS for seg in batch.segments
        )

    def decode(self, cache, batch: Batch):
        """Logits (T, vocab) of a replayable batch by a plan, or None (use the Python path)."""
        m = self.model
        if self.disabled or m.impl.ops is not m.kernels:  # (supported() was checked at load)
            return None
        for seg in batch.segments:  # block ids are checked here, not in the replayed kernels
            for bt in (seg.block_table, seg.window_table):  # (window slots: < n_blocks too)
                if (
                    bt is not None
                    and len(bt)
                    and (int(bt.min()) < 0 or int(bt.max()) >= cache.n_blocks)
                ):
                    return None  # the Python path raises the kernel's error
        if any(len(batch.tokens) > t.capacity for t in m.impl.row_tables.values()):
            return None  # more rows than a row table stages at once
        spec = self.spec
        if spec is not None and not all(
            seg.stop - seg.start == 1 and _replayable_state(seg.rec, spec) for seg in batch.segments
        ):
            return None  # hybrid: decode steps only; a snapshot is due (or an odd state)
        plans = self._plans.setdefault(cache, {})
        key = attention_key(m.impl, batch)
        plan = plans.pop(key, None)
        if plan is None or not plan.fits(batch, cache, key):
            if any(n > 1 for n, _, _ in key):  # a verify step: capture when it recurs
                seen = self._seen.setdefault(cache, {})
                if len(seen) > 4 * MAX_PLANS_PER_CACHE:
                    seen.clear()
                seen[key] = seen.get(key, 0) + 1
                if seen[key] < 2:
                    return None
            shape = tuple(seg.stop - seg.start for seg in batch.segments)
            plan = DecodePlan(m.impl, m.kernels, cache, shape, m.n_ctx)
            if int(batch.positions.max()) > plan.max_pos:
                return None
            plan.load(batch)
            try:
                plan.capture(batch.fast_from)
            except CaptureError:
                self.disabled = True
                return None
            self.captures += 1
        else:
            plan.load(batch)
        plans[key] = plan  # most recently used last
        while len(plans) > MAX_PLANS_PER_CACHE:
            plans.pop(next(iter(plans)))
        self.replays += 1
        return plan.run()
