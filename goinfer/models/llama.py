"""The llama family: llama (SmolLM2, Llama 2/3), mistral, qwen2 (QKV bias), qwen3 (QK-norm).

One forward step per layer:
  RMSNorm -> int8 activation (once) -> fused QKV matmul -> bias / QK-norm -> RoPE ->
  write K,V into the session's blocks -> attention through the block table -> output
  projection -> residual -> RMSNorm -> fused gate/up -> SwiGLU -> down -> residual.
GGUF files of arch llama/mistral store Q and K rows permuted for interleaved ("normal") RoPE;
qwen2/qwen3 keep the Hugging Face layout and use NeoX-style RoPE (the registry's rope_neox).

Gemma 3, SmolLM3, gpt-oss and the MoE models run this step with their own hooks
(layer_rope, layer_window, layer_sinks, attention_block, ffn_block).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from goinfer.models.base import Act, Batch, ModelConfig
from goinfer.models.family import Family, LayerWeights, load_gated_ffn
from goinfer.models.loading import Loader, config_fields

if TYPE_CHECKING:
    from goinfer.gguf import GGUFFile
    from goinfer.models.arch import Arch

# ============================================================================ config


def read_config(g: GGUFFile, arch: Arch) -> ModelConfig:
    return ModelConfig(**config_fields(g, arch))


# ============================================================================ weights


def load_attention(ld: Loader, cfg: ModelConfig) -> dict:
    """The attention half of a layer: the LayerWeights fields attn_norm .. wo (a dict)."""
    D, hd = cfg.d_model, cfg.head_dim
    nq, nkv = cfg.n_heads * hd, cfg.n_kv_heads * hd
    wqkv, (wq, wk, wv) = ld.fused(
        ("attn_q.weight", nq, D), ("attn_k.weight", nkv, D), ("attn_v.weight", nkv, D)
    )
    bqkv = None
    if cfg.qkv_bias:
        bqkv = np.concatenate(
            [ld.vec(f"attn_{n}.bias", m) for n, m in (("q", nq), ("k", nkv), ("v", nkv))]
        )
    q_norm = k_norm = None
    if cfg.qk_norm:
        q_norm, k_norm = ld.vec("attn_q_norm.weight", hd), ld.vec("attn_k_norm.weight", hd)
    wo = ld.mat("attn_output.weight", D, nq)
    return dict(
        attn_norm=ld.vec("attn_norm.weight", D),
        wqkv=wqkv,
        wq=wq,
        wk=wk,
        wv=wv,
        bqkv=bqkv,
        q_norm=q_norm,
        k_norm=k_norm,
        wo=wo,
    )


def load_layer(g: GGUFFile, cfg: ModelConfig, i: int) -> LayerWeights:
    ld = Loader.layer(g, i)
    attn = load_attention(ld, cfg)
    ffn = load_gated_ffn(ld, cfg.d_ff, cfg.d_model)
    return LayerWeights(**attn, ffn_norm=ld.vec("ffn_norm.weight", cfg.d_model), **ffn)


# ============================================================================ the family


class LlamaFamily(Family):
    """Weights and forward step of llama / mistral / qwen2 / qwen3 models."""

    capturable = True
    weight_types = (LayerWeights,)
    read_config = staticmethod(read_config)
    load_layer = staticmethod(load_layer)

    def forward(
        self,
        batch: Batch,
        k_cache: np.ndarray,
        v_cache: np.ndarray,
        logits: np.ndarray | None = None,
    ) -> np.ndarray:
        """Run the batch through the model, writing its K/V into the cache slots.

        Returns logits (len(batch.logit_rows), vocab) float32 (in `logits` when given).
        Every array operation goes through a kernel of self.ops, so goinfer/graph.py can record
        the whole step."""
        ops, cfg, nt, S = self.ops, self.cfg, self.threads, self.scratch
        T, D = len(batch.tokens), cfg.d_model
        x = self.embed(batch.tokens, S.get("x", T, D))  # (T, D) residual stream
        h = S.get("h", T, D)
        o = S.get("o", T, D)
        for li, L in enumerate(self.layers):
            ops.rmsnorm(x, L.attn_norm, cfg.norm_eps, out=h, nthreads=nt)
            self.attention_block(li, L, h, batch, k_cache[li], v_cache[li], o)
            ops.add(x, o, out=x, nthreads=nt)
            ops.rmsnorm(x, L.ffn_norm, cfg.norm_eps, out=h, nthreads=nt)
            self.ffn_block(li, L, h, o)
            ops.add(x, o, out=x, nthreads=nt)
        return self.head(x, batch.logit_rows, logits, batch.hidden)

    # ------------------------------------------------------------------ attention

    def qkv(self, L: LayerWeights, h: np.ndarray):
        """Normed input h (T, D) -> q (T, H, hd), k, v (T, KV, hd) (scratch views), with bias."""
        ops, cfg, S, nt = self.ops, self.cfg, self.scratch, self.threads
        T = h.shape[0]
        H, KV, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        nq, nkv = H * hd, KV * hd
        q, k, v = S.get("q", T, H, hd), S.get("k", T, KV, hd), S.get("v", T, KV, hd)
        a = Act(ops, h, S.qact(T, h.shape[1]), nt)
        if L.wqkv is not None:
            qkv = self.mm(a, L.wqkv, S.get("qkv", T, nq + 2 * nkv))  # (T, nq + 2 nkv)
            if L.bqkv is not None:
                ops.add_bias(qkv, L.bqkv, out=qkv, nthreads=nt)
            ops.copy2d(qkv[:, :nq], out=q.reshape(T, nq), nthreads=nt)
            ops.copy2d(qkv[:, nq : nq + nkv], out=k.reshape(T, nkv), nthreads=nt)
            ops.copy2d(qkv[:, nq + nkv :], out=v.reshape(T, nkv), nthreads=nt)
        else:
            for w, dst, b in (
                (L.wq, q, slice(0, nq)),
                (L.wk, k, slice(nq, nq + nkv)),
                (L.wv, v, slice(nq + nkv, nq + 2 * nkv)),
            ):
                flat = dst.reshape(T, -1)
                self.mm(a, w, flat)
                if L.bqkv is not None:
                    ops.add_bias(flat, L.bqkv[b], out=flat, nthreads=nt)
        return q, k, v

    def layer_sinks(self, li: int, L: LayerWeights):
        """Layer li's attention sink logits (H,) float32, or None (no sinks: all but gpt-oss)."""
        return None

    def attention_block(self, li: int, L: LayerWeights, h, batch: Batch, kc, vc, out) -> None:
        """Normed input h (T, D) -> attention output projected to out (T, D); writes K/V."""
        ops, cfg, S, nt = self.ops, self.cfg, self.scratch, self.threads
        T = h.shape[0]
        q, k, v = self.qkv(L, h)
        if L.q_norm is not None:  # QK-norm, per head, in place
            ops.rmsnorm(q, L.q_norm, cfg.norm_eps, out=q, nthreads=nt)
            ops.rmsnorm(k, L.k_norm, cfg.norm_eps, out=k, nthreads=nt)
        rope = self.layer_rope(li)
        if rope is not None:  # None: a layer without positional encoding (SmolLM3's NoPE layers)
            cos, sin, rows = rope.rows(batch)  # (T, n_rot/2) each, rows (T,): row t -> t
            ops.rope(q, rows, cos, sin, cfg.rope_neox, out=q, nthreads=nt)
            ops.rope(k, rows, cos, sin, cfg.rope_neox, out=k, nthreads=nt)
        window = self.layer_window(li)
        ops.kv_write(kc, vc, k, v, batch.slots_for(window), nthreads=nt)
        att = self.attend(
            li,
            q,
            kc,
            vc,
            batch,
            S.get("att", T, cfg.n_heads, cfg.head_dim),
            window,
            self.attn_softcap,
            self.attn_scale,
            self.layer_sinks(li, L),
        )
        nq = cfg.n_heads * cfg.head_dim
        self.mm(Act(ops, att.reshape(T, nq), S.qact(T, nq), nt), L.wo, out)

    # ------------------------------------------------------------------ feed-forward

    def ffn_block(self, li: int, L: LayerWeights, h, out) -> None:
        """Normed input h (T, D) -> feed-forward output out (T, D)."""
        self.gated_ffn(L, h, out)
