"""Fidelity tools: perplexity over a text, and a teacher-forced comparison of two settings.

    goinfer perplexity MODEL FILE [--ctx N] [--stride S] [--exact] [--threads T]
    goinfer compare MODEL --a SETTINGS --b SETTINGS FILE [--ctx N] [--stride S]

Windows (the same for both tools, and for the llama.cpp measurement in
benchmarks/perplexity_llamacpp.py): the text's token ids (no BOS, special-token strings
read as plain text) are cut into windows [b, e) of at most ctx tokens, b = 0, stride,
2*stride, ... while the previous window did not reach the end.  Each window is one fresh
prefill of e - b tokens at positions 0.. (so in the default mode rows at window positions
>= 512 run the fast attention, as for a Session) and scores the tokens t in [max(b + 1, previous e), e): every
token after the first is scored exactly once, by the first window that holds it with some
context (with stride == ctx the windows do not overlap and the first token of each window
is not scored).  NLL is -log softmax(logits)[target] in float64.

SETTINGS: comma-separated key=value pairs; keys: model (a name or path; default: MODEL),
exact (true/false; exact_prefill is its old name), threads (int).  E.g. ``--a exact=true
--b exact=false`` or ``--a model=q4_1.gguf --b model=q8_0.gguf``.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import numpy as np

from goinfer.errors import ContextLengthError
from goinfer.kv_cache import KVCache
from goinfer.model import PREFILL_CHUNK
from goinfer.recurrent import SeqRecurrent

# ============================================================================ windows


def windows(n_tokens: int, ctx: int, stride: int) -> list[tuple[int, int, int]]:
    """Sliding windows over n_tokens ids: (begin, end, first scored token) per window."""
    if ctx < 2:
        raise ValueError(f"ctx must be >= 2, got {ctx}")
    if not 1 <= stride <= ctx:
        raise ValueError(f"stride must be in 1..ctx ({ctx}), got {stride}")
    if n_tokens < 2:
        raise ValueError(f"the text must have at least 2 tokens, got {n_tokens}")
    out, prev_end, b = [], 0, 0
    while prev_end < n_tokens:
        e = min(b + ctx, n_tokens)
        if max(b + 1, prev_end) < e:  # (a last window of one token scores nothing)
            out.append((b, e, max(b + 1, prev_end)))
        prev_end = e
        b += stride
    return out


def _log_softmax_at(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """-log softmax(logits[i])[targets[i]] per row, in float64 -> (R,)"""
    x = logits.astype(np.float64)
    mx = x.max(axis=1, keepdims=True)
    lse = np.log(np.exp(x - mx).sum(axis=1)) + mx[:, 0]
    return lse - x[np.arange(len(targets)), targets]


class _Runner:
    """One model setting: fresh-prefill windows and give the logits of their scored rows."""

    def __init__(self, model, ctx: int):
        if ctx > model.n_ctx:
            raise ContextLengthError(
                f"window of {ctx} tokens exceeds the context length {model.n_ctx} of {model.name}"
            )
        self.model = model
        self.cache = KVCache(model, max_tokens=ctx, block_size=16)
        self.bt = np.array([self.cache.allocate() for _ in range(self.cache.n_blocks)], np.int32)

    def rows(self, ids: np.ndarray, b: int, e: int, s: int) -> Iterator[tuple[int, np.ndarray]]:
        """(p, logits (R, vocab)) pieces: logits of positions p.. (predicting tokens p+1..) for
        every scored token of window [b, e) from s on, as one prefill call of e - b tokens
        (run in PREFILL_CHUNK pieces, like Model.forward)."""
        m = self.model
        first = s - 1 - b  # window row of the first scored prediction
        rec = (SeqRecurrent(m.new_state()),) if m.hybrid else ()  # a fresh window's state
        for c0 in range(0, e - b, PREFILL_CHUNK):
            c1 = min(e - b, c0 + PREFILL_CHUNK)
            want = "all" if c1 > first else "none"
            lg = m.forward_batch(self.cache, [(self.bt, ids[b + c0 : b + c1], c0, want) + rec])[0]
            if lg is None:
                continue
            lo, hi = max(c0, first), min(c1, e - b - 1)
            if hi > lo:
                yield b + lo, lg[lo - c0 : hi - c0]


def _progress(total: int, desc: str, show: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="tok", disable=None if show else True, leave=False)


# ============================================================================ perplexity


@dataclass
class PerplexityResult:
    model: str
    exact: bool
    threads: int
    ctx: int
    stride: int
    n_tokens: int  # tokens of the text
    n_windows: int
    n_scored: int
    nll: float  # mean negative log-likelihood (nats)
    perplexity: float
    seconds: float
    tokens_per_second: float  # prefilled tokens (all windows) per second

    def as_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        return (
            f"{self.model}: perplexity {self.perplexity:.4f} (mean NLL {self.nll:.5f}) over "
            f"{self.n_scored} tokens, {self.n_windows} windows of {self.ctx} (stride "
            f"{self.stride}), exact={self.exact}, threads={self.threads}, "
            f"{self.tokens_per_second:.1f} tok/s"
        )


def perplexity(
    model, ids, ctx: int = 1024, stride: int | None = None, *, progress: bool = True
) -> PerplexityResult:
    """Perplexity of model over token ids with sliding windows (see the module doc)."""
    ids = np.asarray(ids, dtype=np.int32)
    stride = ctx // 2 if stride is None else stride
    wins = windows(len(ids), ctx, stride)
    run = _Runner(model, ctx)
    total, n, work = 0.0, 0, sum(e - b for b, e, _ in wins)
    t0 = time.perf_counter()
    bar = _progress(work, f"perplexity {model.name}", progress)
    try:
        for b, e, s in wins:
            for p, lg in run.rows(ids, b, e, s):
                nll = _log_softmax_at(lg, ids[p + 1 : p + 1 + len(lg)])
                total += float(nll.sum())
                n += len(nll)
            bar.update(e - b)
            bar.set_postfix(ppl=f"{math.exp(total / max(n, 1)):.3f}")
    finally:
        bar.close()
    dt = time.perf_counter() - t0
    return PerplexityResult(
        model=model.name,
        exact=model.exact,
        threads=model.threads,
        ctx=ctx,
        stride=stride,
        n_tokens=len(ids),
        n_windows=len(wins),
        n_scored=n,
        nll=total / n,
        perplexity=math.exp(total / n),
        seconds=dt,
        tokens_per_second=work / dt if dt > 0 else 0.0,
    )


# ============================================================================ compare

SETTING_KEYS = ("model", "exact", "threads", "kv_dtype")
SETTING_ALIASES = {"exact_prefill": "exact"}


def parse_settings(text: str) -> dict:
    """'exact=true,threads=2' -> {'exact': True, 'threads': 2} (exact_prefill: exact)"""
    out: dict = {}
    for part in (p.strip() for p in (text or "").split(",")):
        if not part:
            continue
        key, sep, val = part.partition("=")
        key = key.strip().replace("-", "_")
        key = SETTING_ALIASES.get(key, key)
        if not sep or key not in SETTING_KEYS:
            raise ValueError(
                f"bad setting {part!r}: expected key=value with key in {', '.join(SETTING_KEYS)}"
            )
        val = val.strip()
        if key == "exact":
            if val.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(f"exact must be true or false, got {val!r}")
            out[key] = val.lower() in ("true", "1", "yes")
        elif key == "kv_dtype":
            from goinfer.kv_cache import check_kv_dtype

            out[key] = check_kv_dtype(val)
        elif key == "threads":
            try:
                out[key] = int(val)
            except ValueError:
                raise ValueError(f"threads must be an int, got {val!r}") from None
        else:
            out[key] = val
    return out


def load_pair(default_model: str, a: dict, b: dict, **load_kw):
    """Models for two settings; when only exact / kv_dtype differ the weights are loaded once
    (a shallow copy of the Model with its own flags)."""
    from goinfer.kv_cache import DEFAULT_KV_DTYPE
    from goinfer.model import Model

    def full(s):
        return (
            s.get("model", default_model),
            s.get("threads"),
            s.get("exact", False),
            s.get("kv_dtype", DEFAULT_KV_DTYPE),
        )

    (pa, ta, ea, ka), (pb, tb, eb, kb) = full(a), full(b)
    ma = Model.load(pa, threads=ta, exact=ea, kv_dtype=ka, **load_kw)
    if (pa, ta) == (pb, tb):
        mb = copy.copy(ma)
        mb.exact = eb
        mb.kv_dtype = kb
    else:
        mb = Model.load(pb, threads=tb, exact=eb, kv_dtype=kb, **load_kw)
    return ma, mb


@dataclass
class CompareResult:
    a: dict
    b: dict
    ctx: int
    stride: int
    n_tokens: int
    n_scored: int
    top1_agreement: float  # argmax of a == argmax of b, over scored positions
    cosine_mean: float  # cosine similarity of the two logit vectors per position
    cosine_min: float
    nll_a: float
    nll_b: float
    nll_diff_mean: float  # mean of NLL_b - NLL_a (nats); > 0: b predicts the text worse
    seconds: float
    worst_position: int = -1  # position of cosine_min

    def as_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        return (
            f"a={self.a} b={self.b}: top-1 agreement {self.top1_agreement:.4f}, logit cosine "
            f"mean {self.cosine_mean:.6f} min {self.cosine_min:.6f} (position "
            f"{self.worst_position}), NLL a {self.nll_a:.5f} b {self.nll_b:.5f}, mean "
            f"NLL diff (b - a) {self.nll_diff_mean:+.6f} over {self.n_scored} tokens"
        )


def compare(
    model_a,
    model_b,
    ids,
    ctx: int = 1024,
    stride: int | None = None,
    *,
    settings_a: dict | None = None,
    settings_b: dict | None = None,
    progress: bool = True,
) -> CompareResult:
    """Teacher-forced comparison of two models (or settings) over the same windows."""
    ids = np.asarray(ids, dtype=np.int32)
    if model_a.vocab_size != model_b.vocab_size:
        raise ValueError(f"vocabularies differ: {model_a.vocab_size} vs {model_b.vocab_size}")
    stride = ctx // 2 if stride is None else stride
    wins = windows(len(ids), ctx, stride)
    ra, rb = _Runner(model_a, ctx), _Runner(model_b, ctx)
    n = agree = 0
    cos_sum, cos_min, worst = 0.0, math.inf, -1
    nll_a = nll_b = 0.0
    t0 = time.perf_counter()
    bar = _progress(sum(e - b for b, e, _ in wins), "compare", progress)
    try:
        for b, e, s in wins:
            for (p, la), (_, lb) in zip(ra.rows(ids, b, e, s), rb.rows(ids, b, e, s)):
                tgt = ids[p + 1 : p + 1 + len(la)]
                x, y = la.astype(np.float64), lb.astype(np.float64)
                cos = (x * y).sum(1) / (np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1))
                agree += int((la.argmax(1) == lb.argmax(1)).sum())
                cos_sum += float(cos.sum())
                i = int(cos.argmin())
                if cos[i] < cos_min:
                    cos_min, worst = float(cos[i]), p + i
                nll_a += float(_log_softmax_at(la, tgt).sum())
                nll_b += float(_log_softmax_at(lb, tgt).sum())
                n += len(la)
            bar.update(e - b)
    finally:
        bar.close()
    return CompareResult(
        a=settings_a or {},
        b=settings_b or {},
        ctx=ctx,
        stride=stride,
        n_tokens=len(ids),
        n_scored=n,
        top1_agreement=agree / n,
        cosine_mean=cos_sum / n,
        cosine_min=cos_min,
        nll_a=nll_a / n,
        nll_b=nll_b / n,
        nll_diff_mean=(nll_b - nll_a) / n,
        seconds=time.perf_counter() - t0,
        worst_position=worst,
    )


def read_ids(model, path, max_tokens: int | None = None, skip_tokens: int = 0) -> np.ndarray:
    """The token ids of a text file (no BOS; special-token strings as plain text), from
    skip_tokens on, at most max_tokens of them."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    ids = model.tokenize(text, add_special=False, parse_special=False)[skip_tokens:]
    if max_tokens is not None:
        ids = ids[:max_tokens]
    return np.asarray(ids, dtype=np.int32)
