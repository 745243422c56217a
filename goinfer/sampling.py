"""SamplingParams and the sampler.

Order of the chain (the same as llama.cpp's default chain, minus the samplers it has and we
do not): logit bias -> repetition penalties -> grammar mask -> top-k -> top-p -> min-p ->
temperature -> draw.  temperature == 0 is greedy (argmax; ties go to the lower token id) after
bias, penalties and the mask.
"""
from __future__ import annotations

from collections import Counter
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

        check(np.isfinite(self.temperature) and self.temperature >= 0,
              f"temperature must be >= 0, got {self.temperature}")
        check(isinstance(self.top_k, (int, np.integer)) and self.top_k >= 0,
              f"top_k must be an int >= 0, got {self.top_k}")
        check(0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}")
        check(0.0 <= self.min_p <= 1.0, f"min_p must be in [0, 1], got {self.min_p}")
        check(np.isfinite(self.repeat_penalty) and self.repeat_penalty > 0,
              f"repeat_penalty must be > 0, got {self.repeat_penalty}")
        check(isinstance(self.repeat_last_n, (int, np.integer)) and self.repeat_last_n >= 0,
              f"repeat_last_n must be an int >= 0, got {self.repeat_last_n}")
        check(-2.0 <= self.presence_penalty <= 2.0,
              f"presence_penalty must be in [-2, 2], got {self.presence_penalty}")
        check(-2.0 <= self.frequency_penalty <= 2.0,
              f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}")
        if self.logit_bias:
            clean = {}
            for k, v in self.logit_bias.items():
                try:
                    tid = int(k)
                    val = float(v)
                except (TypeError, ValueError):
                    raise ValueError(f"logit_bias maps token ids to numbers, got {k!r}: {v!r}") from None
                check(np.isfinite(val) or val == -np.inf, f"logit_bias value for {tid} is not finite")
                clean[tid] = val
            self.logit_bias = clean

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


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
                raise ValueError(f"logit_bias token ids out of range 0..{self.vocab_size - 1}: {bad[:5]}")

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
            ids = np.unique(np.asarray(self.history[-p.repeat_last_n:], dtype=np.int64))
            v = z[ids]
            z[ids] = np.where(v > 0, v / p.repeat_penalty, v * p.repeat_penalty)
        if (p.presence_penalty or p.frequency_penalty) and self.generated:
            ids = np.fromiter(self.generated.keys(), dtype=np.int64)
            cnt = np.fromiter(self.generated.values(), dtype=np.float64)
            z[ids] -= p.frequency_penalty * cnt + p.presence_penalty
        return z

    def sample(self, logits: np.ndarray, mask: np.ndarray | None = None) -> int:
        """Next token from logits (vocab,).  mask: allowed tokens, (vocab,) bool (a grammar's);
        the others get -inf after bias and penalties, before top-k/p, min-p and temperature;
        -1 when no allowed token is left.  Without a mask nothing else changes."""
        p = self.params
        z = self.adjust(logits)
        if mask is not None:
            if p.greedy:  # argmax over the allowed ids only (ties: the lower id, as below)
                idx = np.flatnonzero(mask)
                zi = z[idx]
                if not len(idx) or zi.max() == -np.inf:
                    return -1  # every allowed token is banned (logit_bias -inf)
                return int(idx[np.argmax(zi)])
            z = np.where(mask, z, -np.inf)
        if p.greedy:
            return int(np.argmax(z))
        order = np.argsort(-z, kind="stable")  # best first; ties keep the lower id first
        if p.top_k > 0:
            order = order[: p.top_k]
        zs = z[order]
        if zs[0] == -np.inf:
            return -1  # nothing can be drawn (only with a mask: logits are finite)
        zs = zs - zs[0]
        probs = np.exp(zs)
        probs /= probs.sum()
        keep = len(order)
        if p.top_p < 1.0:
            c = np.cumsum(probs)
            keep = min(keep, int(np.searchsorted(c, p.top_p, side="left")) + 1)
        if p.min_p > 0.0:
            keep = min(keep, max(1, int((probs >= p.min_p * probs[0]).sum())))
        order, zs = order[:keep], zs[:keep]
        w = np.exp(zs / p.temperature)
        w /= w.sum()
        return int(order[self.rng.choice(len(order), p=w)])
