"""The llama family: llama (SmolLM2, Llama 2/3), mistral, qwen2 (QKV bias), qwen3 (QK-norm).

One forward step per layer:
  RMSNorm -> int8 activation (once) -> fused QKV matmul -> bias / QK-norm -> RoPE ->
  write K,V into the session's blocks -> attention through the block table -> output
  projection -> residual -> RMSNorm -> fused gate/up -> SwiGLU -> down -> residual.
GGUF files of arch llama/mistral store Q and K rows permuted for interleaved ("normal") RoPE;
qwen2/qwen3 keep the Hugging Face layout and use NeoX-style RoPE.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from goinfer.errors import ModelFormatError, UnsupportedArchitectureError
from goinfer.models.base import Act, Batch, ModelConfig, RopeCache, Scratch, Yarn
from goinfer.quant import QWeight, concat_rows

NEOX_ARCHS = {"qwen2", "qwen3"}

# ============================================================================ config


def _req(g, suffix):
    v = g.arch_get(suffix)
    if v is None:
        raise ModelFormatError(f"{g.path}: metadata key {g.arch}.{suffix} is missing")
    return v


def _scalar_int(g, suffix, v):
    if isinstance(v, np.ndarray):
        if v.size and np.all(v == v.flat[0]):
            return int(v.flat[0])
        raise UnsupportedArchitectureError(
            f"{g.path}: per-layer {g.arch}.{suffix} values are not supported")
    return int(v)


def _d_ff(g) -> int:
    """feed_forward_length; an all-MoE file (qwen35moe) may carry only the experts' width."""
    v = g.arch_get("feed_forward_length")
    if v is None and g.arch_get("expert_feed_forward_length") is not None:
        return _scalar_int(g, "expert_feed_forward_length", g.arch_get("expert_feed_forward_length"))
    return _scalar_int(g, "feed_forward_length", _req(g, "feed_forward_length"))


def read_config(g, allow_yarn: bool = False) -> ModelConfig:
    """The config every llama-like family shares.  allow_yarn: the caller runs YaRN RoPE
    scaling (ModelConfig.rope_yarn); otherwise a YaRN file is an UnsupportedArchitectureError."""
    arch = g.arch
    d_model = int(_req(g, "embedding_length"))
    n_heads = _scalar_int(g, "attention.head_count", _req(g, "attention.head_count"))
    n_kv = _scalar_int(g, "attention.head_count_kv", g.arch_get("attention.head_count_kv", n_heads))
    head_dim = int(g.arch_get("attention.key_length", d_model // n_heads))
    v_dim = int(g.arch_get("attention.value_length", head_dim))
    if v_dim != head_dim:
        raise UnsupportedArchitectureError(f"{g.path}: key_length {head_dim} != value_length {v_dim}")
    if n_heads % n_kv:
        raise ModelFormatError(f"{g.path}: {n_heads} heads is not a multiple of {n_kv} kv heads")
    vocab = g.arch_get("vocab_size")
    if vocab is None:
        toks = g.get("tokenizer.ggml.tokens")
        vocab = len(toks) if toks is not None else g.tensor_info("token_embd.weight")[1][0]
    scaling = g.arch_get("rope.scaling.type", "none")
    rope_scale = 1.0
    yarn = None
    if scaling == "linear":
        rope_scale = float(g.arch_get("rope.scaling.factor", 1.0))
    elif scaling == "yarn" and allow_yarn:
        orig = g.arch_get("rope.scaling.original_context_length")
        factor = g.arch_get("rope.scaling.factor")
        if orig is None or factor is None:
            raise ModelFormatError(f"{g.path}: YaRN RoPE scaling without rope.scaling.factor "
                                   "and rope.scaling.original_context_length")
        yarn = Yarn(float(factor), int(orig),
                    float(g.arch_get("rope.scaling.yarn_beta_fast", 32.0) or 32.0),
                    float(g.arch_get("rope.scaling.yarn_beta_slow", 1.0) or 1.0),
                    float(g.arch_get("rope.scaling.yarn_attn_factor", 0.0) or 0.0))
    elif scaling not in ("none", None):
        raise UnsupportedArchitectureError(f"{g.path}: RoPE scaling {scaling!r} is not supported yet")
    return ModelConfig(
        arch=arch,
        n_layers=int(_req(g, "block_count")),
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        d_ff=_d_ff(g),
        vocab_size=int(vocab),
        context_length=int(g.arch_get("context_length", 4096)),
        norm_eps=float(g.arch_get("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_base=float(g.arch_get("rope.freq_base", 10000.0)),
        rope_dim=int(g.arch_get("rope.dimension_count", head_dim)),
        rope_neox=arch in NEOX_ARCHS,
        rope_scale=rope_scale,
        rope_yarn=yarn,
        qkv_bias=g.has_tensor("blk.0.attn_q.bias"),
        qk_norm=g.has_tensor("blk.0.attn_q_norm.weight"),
        tied_embeddings=not g.has_tensor("output.weight"),
        sliding_window=int(g.arch_get("attention.sliding_window", 0) or 0),
    )


# ============================================================================ weights


@dataclass
class LayerWeights:
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

    def weights(self):
        return [w for w in (self.wqkv, self.wq, self.wk, self.wv, self.wo, self.w_gate_up,
                            self.w_gate, self.w_up, self.w_down) if w is not None]


def _check_shape(name, w: QWeight, n_out, n_in):
    if (w.n_out, w.n_in) != (n_out, n_in):
        raise ModelFormatError(f"tensor {name} has shape ({w.n_out}, {w.n_in}), "
                               f"expected ({n_out}, {n_in})")


def _check_vec(name, v: np.ndarray, n):
    if v.shape != (n,):
        raise ModelFormatError(f"tensor {name} has shape {v.shape}, expected ({n},)")
    return np.ascontiguousarray(v, dtype=np.float32)


def load_attention(g, cfg: ModelConfig, i: int) -> dict:
    """The attention half of layer i: the LayerWeights fields attn_norm .. wo (a dict)."""
    p = f"blk.{i}."
    D, hd = cfg.d_model, cfg.head_dim
    nq, nkv = cfg.n_heads * hd, cfg.n_kv_heads * hd
    wq, wk, wv = (g.load_weight(p + f"attn_{n}.weight") for n in "qkv")
    _check_shape(p + "attn_q.weight", wq, nq, D)
    _check_shape(p + "attn_k.weight", wk, nkv, D)
    _check_shape(p + "attn_v.weight", wv, nkv, D)
    wqkv = concat_rows([wq, wk, wv])
    if wqkv is not None:
        wq = wk = wv = None
    bqkv = None
    if cfg.qkv_bias:
        bqkv = np.concatenate([_check_vec(p + f"attn_{n}.bias", g.load_f32(p + f"attn_{n}.bias"), m)
                               for n, m in (("q", nq), ("k", nkv), ("v", nkv))])
    q_norm = k_norm = None
    if cfg.qk_norm:
        q_norm = _check_vec(p + "attn_q_norm.weight", g.load_f32(p + "attn_q_norm.weight"), hd)
        k_norm = _check_vec(p + "attn_k_norm.weight", g.load_f32(p + "attn_k_norm.weight"), hd)
    wo = g.load_weight(p + "attn_output.weight")
    _check_shape(p + "attn_output.weight", wo, D, nq)
    return dict(attn_norm=_check_vec(p + "attn_norm.weight", g.load_f32(p + "attn_norm.weight"), D),
                wqkv=wqkv, wq=wq, wk=wk, wv=wv, bqkv=bqkv, q_norm=q_norm, k_norm=k_norm, wo=wo)


def load_layer(g, cfg: ModelConfig, i: int) -> LayerWeights:
    p = f"blk.{i}."
    D, F = cfg.d_model, cfg.d_ff
    attn = load_attention(g, cfg, i)
    w_gate = g.load_weight(p + "ffn_gate.weight")
    w_up = g.load_weight(p + "ffn_up.weight")
    _check_shape(p + "ffn_gate.weight", w_gate, F, D)
    _check_shape(p + "ffn_up.weight", w_up, F, D)
    w_gate_up = concat_rows([w_gate, w_up])
    if w_gate_up is not None:
        w_gate = w_up = None
    w_down = g.load_weight(p + "ffn_down.weight")
    _check_shape(p + "ffn_down.weight", w_down, D, F)
    return LayerWeights(
        **attn, ffn_norm=_check_vec(p + "ffn_norm.weight", g.load_f32(p + "ffn_norm.weight"), D),
        w_gate_up=w_gate_up, w_gate=w_gate, w_up=w_up, w_down=w_down)


# ============================================================================ the family


class LlamaFamily:
    """Weights and forward step of llama / mistral / qwen2 / qwen3 models."""

    read_config = staticmethod(read_config)
    ffn_act = "swiglu"  # the kernel combining gate and up (gelu_tanh_mul for GeGLU families)

    def __init__(self, g, cfg: ModelConfig, kernels, threads: int, progress=None,
                 weights: dict | None = None):
        """weights: the dict load_weights returns (memory-mapped from the layout cache,
        goinfer/layout.py); None loads them from the GGUF g."""
        self.cfg = cfg
        self.K = kernels
        self.threads = threads
        if weights is None:
            weights = self.load_weights(g, progress)
        self.tok_embd = weights["tok_embd"]
        self.layers = weights["layers"]
        self.out_norm = weights["out_norm"]
        self.lm_head = self.tok_embd if weights["lm_head"] is None else weights["lm_head"]
        self.rope = RopeCache(cfg.n_rot, cfg.rope_base, cfg.context_length, weights["rope_freqs"],
                              cfg.rope_scale, cfg.rope_yarn)
        self.attn_scale: float | None = None  # None: 1/sqrt(head_dim)
        self.attn_softcap = 0.0
        self.scratch = Scratch()

    def load_weights(self, g, progress=None, keep=None) -> dict:
        """Every weight of the model from the GGUF g, as a dict of plain containers (QWeight,
        float32 arrays, the family's layer dataclasses, lists, None): tok_embd, layers, out_norm,
        lm_head (None when tied to tok_embd), rope_freqs (or None).  keep(obj) is called on each
        layer (and the other top-level weights) as soon as it is loaded and returns what to keep
        in its place (the layout cache writes it out and keeps a reference).  Reads self.cfg
        only (the layout cache calls it before the rest of __init__ has run)."""
        cfg = self.cfg
        keep = keep or (lambda obj: obj)
        D = cfg.d_model
        tok_embd = g.load_weight("token_embd.weight")
        _check_shape("token_embd.weight", tok_embd, cfg.vocab_size, D)
        tok_embd = keep(tok_embd)
        layers = []
        for i in range(cfg.n_layers):
            layers.append(keep(self.load_layer(g, i)))
            if progress is not None:
                progress(1)
        out_norm = _check_vec("output_norm.weight", g.load_f32("output_norm.weight"), D)
        lm_head = None
        if not cfg.tied_embeddings:
            lm_head = g.load_weight("output.weight")
            _check_shape("output.weight", lm_head, cfg.vocab_size, D)
            lm_head = keep(lm_head)
        rope_freqs = g.load_f32("rope_freqs.weight") if g.has_tensor("rope_freqs.weight") else None
        return dict(tok_embd=tok_embd, layers=layers, out_norm=out_norm, lm_head=lm_head,
                    rope_freqs=rope_freqs)

    def load_layer(self, g, i: int) -> LayerWeights:
        return load_layer(g, self.cfg, i)

    # ------------------------------------------------------------------ per-layer attention

    def layer_rope(self, li: int) -> RopeCache | None:
        """The RoPE tables of layer li (families with local/global layers differ here), or None
        for a layer that applies no RoPE."""
        return self.rope

    def layer_window(self, li: int) -> int:
        """Sliding window of layer li in tokens (0: full causal attention)."""
        return self.cfg.sliding_window

    def weights(self):
        ws = [self.tok_embd] + [w for L in self.layers for w in L.weights()]
        if self.lm_head is not self.tok_embd:
            ws.append(self.lm_head)
        return ws

    # ------------------------------------------------------------------ helpers

    def _mm(self, act: Act, w: QWeight, out: np.ndarray) -> np.ndarray:
        return self.K.matmul(act.for_weight(w), w, out=out, nthreads=self.threads)

    # ------------------------------------------------------------------ forward

    def forward(self, batch: Batch, k_cache: np.ndarray, v_cache: np.ndarray,
                logits: np.ndarray | None = None) -> np.ndarray:
        """Run the batch through the model, writing its K/V into the cache slots.

        Returns logits (len(batch.logit_rows), vocab) float32 (in `logits` when given).
        Every array operation goes through a kernel of self.K, so goinfer/graph.py can record
        the whole step."""
        K, cfg, nt, S = self.K, self.cfg, self.threads, self.scratch
        T, D = len(batch.tokens), cfg.d_model
        x = self.embed(batch.tokens, S.get("x", T, D))  # (T, D) residual stream
        h = S.get("h", T, D)
        o = S.get("o", T, D)
        for li, L in enumerate(self.layers):
            K.rmsnorm(x, L.attn_norm, cfg.norm_eps, out=h, nthreads=nt)
            self.attention_block(li, L, h, batch, k_cache[li], v_cache[li], o)
            K.add(x, o, out=x, nthreads=nt)
            K.rmsnorm(x, L.ffn_norm, cfg.norm_eps, out=h, nthreads=nt)
            self.ffn_block(li, L, h, o)
            K.add(x, o, out=x, nthreads=nt)
        return self.head(x, batch.logit_rows, logits)

    def embed(self, tokens: np.ndarray, out: np.ndarray) -> np.ndarray:
        return self.K.get_rows(self.tok_embd, tokens, out=out, nthreads=self.threads)

    def head(self, x: np.ndarray, rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Final norm and LM head for the rows that need logits -> (len(rows), vocab) (in out
        when given)."""
        K, cfg, S = self.K, self.cfg, self.scratch
        R = len(rows)
        if R == 0:
            return np.zeros((0, cfg.vocab_size), np.float32)
        xr = x if R == x.shape[0] else K.gather_rows(x, rows, out=S.get("xr", R, cfg.d_model),
                                                     nthreads=self.threads)  # (R, D)
        hr = K.rmsnorm(xr, self.out_norm, cfg.norm_eps, out=S.get("hr", R, cfg.d_model),
                       nthreads=self.threads)
        logits = np.empty((R, cfg.vocab_size), np.float32) if out is None else out
        self._mm(Act(K, hr, S.qact(R, cfg.d_model), self.threads), self.lm_head, logits)
        return logits

    def qkv(self, L: LayerWeights, h: np.ndarray):
        """Normed input h (T, D) -> q (T, H, hd), k, v (T, KV, hd) (scratch views), with bias."""
        K, cfg, S, nt = self.K, self.cfg, self.scratch, self.threads
        T = h.shape[0]
        H, KV, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        nq, nkv = H * hd, KV * hd
        q, k, v = S.get("q", T, H, hd), S.get("k", T, KV, hd), S.get("v", T, KV, hd)
        a = Act(K, h, S.qact(T, h.shape[1]), nt)
        if L.wqkv is not None:
            qkv = self._mm(a, L.wqkv, S.get("qkv", T, nq + 2 * nkv))  # (T, nq + 2 nkv)
            if L.bqkv is not None:
                K.add_bias(qkv, L.bqkv, out=qkv, nthreads=nt)
            K.copy2d(qkv[:, :nq], out=q.reshape(T, nq), nthreads=nt)
            K.copy2d(qkv[:, nq:nq + nkv], out=k.reshape(T, nkv), nthreads=nt)
            K.copy2d(qkv[:, nq + nkv:], out=v.reshape(T, nkv), nthreads=nt)
        else:
            for w, dst, b in ((L.wq, q, slice(0, nq)), (L.wk, k, slice(nq, nq + nkv)),
                              (L.wv, v, slice(nq + nkv, nq + 2 * nkv))):
                flat = dst.reshape(T, -1)
                self._mm(a, w, flat)
                if L.bqkv is not None:
                    K.add_bias(flat, L.bqkv[b], out=flat, nthreads=nt)
        return q, k, v

    def attend(self, li: int, q, kc, vc, batch: Batch, out, window: int = 0, softcap: float = 0.0,
               scale: float | None = None, sinks=None):
        """Attention of q (T, H, hd) over each segment's blocks -> out (T, H, hd).  A row at a
        position below batch.fast_from runs the exact kernel, a row at or above it the float32
        tiled one (a segment crossing it is two calls; its positions ascend).  sinks (H,)
        float32: attention sink logits (gpt-oss), given to either kernel."""
        if scale is None:
            scale = 1.0 / float(np.sqrt(self.cfg.head_dim))
        extra = {} if sinks is None else {"sinks": sinks}
        ff = batch.fast_from
        for seg in batch.segments:
            pos = batch.positions[seg.start:seg.stop]
            split = seg.start + (len(pos) if ff is None else int(np.searchsorted(pos, ff)))
            for a, b, fast in ((seg.start, split, False), (split, seg.stop, True)):
                if b > a:
                    kernel = self.K.attention_fast if fast else self.K.attention
                    kernel(q[a:b], kc, vc, seg.block_table, batch.positions[a:b], scale, window,
                           softcap, out=out[a:b], nthreads=self.threads, **extra)
        return out

    def layer_sinks(self, li: int, L: LayerWeights):
        """Layer li's attention sink logits (H,) float32, or None (no sinks: all but gpt-oss)."""
        return None

    def attention_block(self, li: int, L: LayerWeights, h, batch: Batch, kc, vc, out) -> None:
        """Normed input h (T, D) -> attention output projected to out (T, D); writes K/V."""
        K, cfg, S, nt = self.K, self.cfg, self.scratch, self.threads
        T = h.shape[0]
        q, k, v = self.qkv(L, h)
        if L.q_norm is not None:  # QK-norm, per head, in place
            K.rmsnorm(q, L.q_norm, cfg.norm_eps, out=q, nthreads=nt)
            K.rmsnorm(k, L.k_norm, cfg.norm_eps, out=k, nthreads=nt)
        rope = self.layer_rope(li)
        if rope is not None:  # None: a layer without positional encoding (SmolLM3's NoPE layers)
            cos, sin = rope.tables(int(batch.positions.max()) + 1)
            K.rope(q, batch.positions, cos, sin, cfg.rope_neox, out=q, nthreads=nt)
            K.rope(k, batch.positions, cos, sin, cfg.rope_neox, out=k, nthreads=nt)
        K.kv_write(kc, vc, k, v, batch.slots, nthreads=nt)
        att = self.attend(li, q, kc, vc, batch, S.get("att", T, cfg.n_heads, cfg.head_dim),
                          self.layer_window(li), self.attn_softcap, self.attn_scale,
                          self.layer_sinks(li, L))
        nq = cfg.n_heads * cfg.head_dim
        self._mm(Act(K, att.reshape(T, nq), S.qact(T, nq), nt), L.wo, out)

    def ffn_block(self, li: int, L: LayerWeights, h, out) -> None:
        """Normed input h (T, D) -> gated feed-forward output out (T, D).  The width F is the
        layer's own (w_down's input): Gemma 4's KV-shared layers have a double-wide MLP."""
        K, S, nt, F = self.K, self.scratch, self.threads, L.w_down.n_in
        T = h.shape[0]
        sfx = "" if F == self.cfg.d_ff else str(F)  # scratch per width: no regrowth per layer
        a = Act(K, h, S.qact(T, h.shape[1]), nt)
        if L.w_gate_up is not None:
            gu = self._mm(a, L.w_gate_up, S.get("gu" + sfx, T, 2 * F))  # (T, 2F): gate | up
            gate, up = gu[:, :F], gu[:, F:]
        else:
            gate = self._mm(a, L.w_gate, S.get("gate" + sfx, T, F))
            up = self._mm(a, L.w_up, S.get("up" + sfx, T, F))
        f = getattr(K, self.ffn_act)(gate, up, out=S.get("f" + sfx, T, F), nthreads=nt)
        self._mm(Act(K, f, S.qact(T, F), nt), L.w_down, out)
