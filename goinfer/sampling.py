"""SamplingParams and the sampler.

Order of the chain (the same as llama.cpp's default chain, minus the samplers it has and we
do not): logit bias -> repetition penalties -> grammar mask -> top-k -> top-p -> min-p ->
temperature -> draw.  temperature == 0 is greedy (argmax; ties go to the lower token id) after
bias, penalties and the mask.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np


@dataclass
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    min_p: float = 0.0  # 0: off
    repeat_penalty: float = 1.0  # llama.cpp style, over the last repeat_last_n tokens
    repeat_last_n: int = 64
    presence_penalty: float = 0.0  # OpenAI style, over the generated tokens
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None
    seed: int | None = None

    def __post_init__(self):
        def check(ok, msg):
            if not ok:
                raise ValueError(msg)

        check(
            np.isfinite(self.temperature) and self.temperature >= 0,
            f"temperature must be >= 0, got {self.temperature}",
        )
        check(
            isinstance(self.top_k, (int, np.integer)) and self.top_k >= 0,
            f"top_k must be an int >= 0, got {self.top_k}",
        )
        check(0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}")
        check(0.0 <= self.min_p <= 1.0, f"min_p must be in [0, 1], got {self.min_p}")
        check(
            np.isfinite(self.repeat_penalty) and self.repeat_penalty > 0,
            f"repeat_penalty must be > 0, got {self.repeat_penalty}",
        )
        check(
            isinstance(self.repeat_last_n, (int, np.integer)) and self.repeat_last_n >= 0,
            f"repeat_last_n must be an int >= 0, got {self.repeat_last_n}",
        )
        check(
            -2.0 <= self.presence_penalty <= 2.0,
            f"presence_penalty must be in [-2, 2], got {self.presence_penalty}",
        )
        check(
            -2.0 <= self.frequency_penalty <= 2.0,
            f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}",
        )
        if self.logit_bias:
            clean = {}
            for k, v in self.logit_bias.items():
                try:
                    tid = int(k)
                    val = float(v)
                except (TypeError, ValueError):
                    raise ValueError(
                        f"logit_bias maps token ids to numbers, got {k!r}: {v!r}"
                    ) from None
                check(
                    np.isfinite(val) or val == -np.inf, f"logit_bias value for {tid} is not finite"
                )
                clean[tid] = val
            self.logit_bias = clean

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def sampling_params(
    params: SamplingParams | None = None,
    overrides: Mapping | None = None,
    caller: str = "generate",
    default: SamplingParams | None = None,
) -> SamplingParams:
    """params (default: `default`, else SamplingParams()) with the fields `overrides` names
    replaced, as ``generate(prompt, params, temperature=0.7)`` takes them.  TypeError for a keyword that
    is no field of SamplingParams (naming it, as Python does for `caller`'s own keywords),
    ValueError for a value out of range."""
    overrides = dict(overrides or {})
    names = {f.name for f in dataclasses.fields(SamplingParams)}
    for k in overrides:
        if k not in names:
            raise TypeError(f"{caller}() got an unexpected keyword argument {k!r}")
    if params is None:
        params = default
    if params is None:
        return SamplingParams(**overrides)
    if not isinstance(params, SamplingParams):
        raise TypeError(f"{caller}() params must be a SamplingParams, got {type(params).__name__}")
    return dataclasses.replace(params, **overrides) if overrides else params


@dataclass
class Sampler:
    """Stateful sampler for one generation: the rng and the token history for penalties."""

    params: SamplingParams
    vocab_size: int
    history: list[int] = field(default_factory=list)  # context tokens (for repeat_penalty)
    generated: Counter = field(default_factory=Counter)  # generated token counts

    def __post_init__(self):
        self.rng = np.random.default_rng(self.params.seed)
        if self.params.logit_bias:
            bad = [t for t in self.params.logit_bias if not 0 <= t < self.vocab_size]
            if bad:
                raise ValueError(
                    f"logit_bias token ids out of range 0..{self.vocab_size - 1}: {bad[:5]}"
                )

    def accept(self, token: int) -> None:
        self.history.append(token)
        self.generated[token] += 1

    def adjust(self, logits: np.ndarray) -> np.ndarray:
        """Logit bias and penalties, on a float64 copy."""
        p = self.params
        z = np.array(logits, dtype=np.float64)
        if p.logit_bias:
            ids = np.fromiter(p.logit_bias.keys(), dtype=np.int64)
            z[ids] += np.fromiter(p.logit_bias.values(), dtype=np.float64)
        if p.repeat_penalty != 1.0 and p.repeat_last_n > 0 and self.history:
            ids = np.unique(np.asarray(self.history[-p.repeat_last_n :], dtype=np.int64))
            v = z[ids]
            z[ids] = np.where(v > 0, v / p.repeat_penalty, v * p.repeat_penalty)
        if (p.presence_penalty or p.frequency_penalty) and self.generated:
            ids = np.fromiter(self.generated.keys(), dtype=np.int64)
            cnt = np.fromiter(self.generated.values(), dtype=np.float64)
            z[ids] -= p.frequency_penalty * cnt + p.presence_penalty
        return z

    def candidates(self, logits: np.ndarray, mask: np.ndarray | None = None):
        """The tokens a sampled (temperature > 0) draw can give and their probabilities:
        (ids (n,) int64, w (n,) float64 summing to 1), or None when no allowed token is left.
        Sorts only what a cut needs (top-k: the k best; top-p: the best until the nucleus is
        reached), never the whole vocabulary: a 262k-token vocabulary is ~60 ms to sort."""
        p = self.params
        z = self.adjust(logits)
        if mask is not None:
            z = np.where(mask, z, -np.inf)
        ids = None  # the drawable tokens, ascending; None: every token (no -inf left)
        if z.min() == -np.inf:
            ids = np.flatnonzero(z > -np.inf)
            if not len(ids):
                return None
            z = z[ids]
        z -= z.max()  # (n,) <= 0; z is adjust()'s own copy
        keep = None  # positions into z of the cuts' survivors (best first after top-k / top-p)
        if 0 < p.top_k < len(z):
            keep = _best_first(z, p.top_k)
        if p.top_p < 1.0 or p.min_p > 0.0:
            zk = z if keep is None else z[keep]
            probs = np.exp(zk)  # (k,) the temperature-1 softmax of what top-k kept
            probs /= probs.sum()
            pos = np.arange(len(zk))
            if p.top_p < 1.0:  # the shortest best-first prefix holding top_p of the mass
                pos = pos if keep is not None else _nucleus_head(zk, probs, p.top_p)
                i = int(np.searchsorted(np.cumsum(probs[pos]), p.top_p, side="left"))
                pos = pos[: i + 1]
            if p.min_p > 0.0:
                pos = pos[probs[pos] >= p.min_p * probs.max()]
            keep = pos if keep is None else keep[pos]
        if keep is not None:
            z = z[keep]
            ids = keep if ids is None else ids[keep]
        elif ids is None:
            ids = np.arange(len(z))
        w = np.exp(z / p.temperature) if p.temperature != 1.0 else np.exp(z)
        return ids, w / w.sum()

    def sample(self, logits: np.ndarray, mask: np.ndarray | None = None) -> int:
        """Next token from logits (vocab,).  mask: allowed tokens, (vocab,) bool (a grammar's);
        the others get -inf after bias and penalties, before top-k/p, min-p and temperature;
        -1 when no allowed token is left.  Without a mask nothing else changes.  A sampled
        step consumes one draw of the rng (speculative decoding relies on it)."""
        p = self.params
        if p.greedy:
            z = self.adjust(logits)
            if mask is not None:  # argmax over the allowed ids only (ties: the lower id)
                idx = np.flatnonzero(mask)
                zi = z[idx]
                if not len(idx) or zi.max() == -np.inf:
                    return -1  # every allowed token is banned (logit_bias -inf)
                return int(idx[np.argmax(zi)])
            return int(np.argmax(z))
        c = self.candidates(logits, mask)
        if c is None:
            return -1  # nothing can be drawn (only with a mask: logits are finite)
        ids, w = c
        return int(ids[self.rng.choice(len(ids), p=w)])


def _best_first(z: np.ndarray, m: int) -> np.ndarray:
    """Positions of the m largest values of z (n,), largest first, ties by lower position:
    the first m of np.argsort(-z, kind="stable"), with a partition instead of a full sort."""
    n = len(z)
    if m >= n:
        return np.argsort(-z, kind="stable")
    kth = np.partition(z, n - m)[n - m]  # the m-th largest value
    head = np.flatnonzero(z >= kth)  # every tie of it too, ascending
    return head[np.argsort(-z[head], kind="stable")][:m]


def _nucleus_head(z: np.ndarray, probs: np.ndarray, top_p: float) -> np.ndarray:
    """A best-first prefix of positions of z (n,) (as _best_first) whose mass under probs
    (n,) reaches top_p, or all of them: the 64 or 512 best when they hold it (a peaked
    distribution), else every position at or above the value where the sorted mass reaches
    it (values sorted without their ids: several times cheaper than ranking all ids)."""
    for m in (64, 512):
        if m >= len(z):
            break
        head = _best_first(z, m)
        if np.cumsum(probs[head])[-1] >= top_p:
            return head
    if len(z) <= 512:
        return _best_first(z, len(z))
    srt = np.sort(probs)[::-1]  # (n,) the mass of each rank, best first (probs rises with z)
    i = min(int(np.searchsorted(np.cumsum(srt), top_p, side="left")), len(z) - 1)
    head = np.flatnonzero(probs >= srt[i])  # ascending; ties of the cut included
    return head[np.argsort(-z[head], kind="stable")]
