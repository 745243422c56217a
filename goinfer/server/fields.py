"""Checks of a JSON request body's fields, shared by every route: a field of the wrong type or
out of range raises a 400 naming it.  Booleans are never accepted as numbers."""

from __future__ import annotations

import json
import math

from goinfer.server.errors import bad

__all__ = [
    "is_int",
    "is_num",
    "number",
    "integer",
    "boolean",
    "string",
    "stop_strings",
    "logit_bias",
    "MAX_STOPS",
    "MAX_STOP_LEN",
]

MAX_STOPS = 16
MAX_STOP_LEN = 1000


def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v) -> bool:
    if isinstance(v, bool):
        return False
    return is_int(v) or (isinstance(v, float) and math.isfinite(v))


def number(body: dict, name: str, lo: float, hi: float, default, *, lo_open: bool = False):
    v = body.get(name)
    if v is None:
        return default
    if not is_num(v):
        raise bad(f"'{name}' must be a number, got {json.dumps(v)[:40]}", name, "invalid_type")
    if v < lo or v > hi or (lo_open and v == lo):
        left = "(" if lo_open else "["
        raise bad(f"'{name}' must be in {left}{lo}, {hi}], got {v}", name, "invalid_value")
    return float(v)


def integer(body: dict, name: str, lo: int, hi: int | None, default):
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, float) and v.is_integer() and not isinstance(v, bool):
        v = int(v)
    if not is_int(v):
        raise bad(f"'{name}' must be an integer, got {json.dumps(v)[:40]}", name, "invalid_type")
    if v < lo or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise bad(f"'{name}' must be an integer {rng}, got {v}", name, "invalid_value")
    return v


def boolean(body: dict, name: str, default: bool) -> bool:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad(f"'{name}' must be a boolean, got {json.dumps(v)[:40]}", name, "invalid_type")
    return v


def string(body: dict, name: str, default=None, max_len: int = 1 << 16):
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, str):
        raise bad(f"'{name}' must be a string, got {json.dumps(v)[:40]}", name, "invalid_type")
    if len(v) > max_len:
        raise bad(f"'{name}' is longer than {max_len} characters", name, "invalid_value")
    return v


def stop_strings(body: dict, name: str = "stop") -> list[str]:
    """A string or a list of strings that end the text (empty ones dropped)."""
    v = body.get(name)
    if v is None:
        return []
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise bad(f"'{name}' must be a string or a list of strings", name, "invalid_type")
    if len(v) > MAX_STOPS:
        raise bad(f"'{name}' has {len(v)} sequences; at most {MAX_STOPS}", name, "invalid_value")
    if any(len(s) > MAX_STOP_LEN for s in v):
        raise bad(
            f"a stop sequence is longer than {MAX_STOP_LEN} characters", name, "invalid_value"
        )
    return [s for s in v if s]


def logit_bias(body: dict, vocab_size: int) -> dict[int, float] | None:
    v = body.get("logit_bias")
    if v is None:
        return None
    if not isinstance(v, dict):
        raise bad(
            "'logit_bias' must be an object mapping token ids to numbers",
            "logit_bias",
            "invalid_type",
        )
    out = {}
    for k, x in v.items():
        try:
            tid = int(k)
        except (TypeError, ValueError):
            raise bad(
                f"'logit_bias' key {k!r} is not a token id", "logit_bias", "invalid_value"
            ) from None
        if not 0 <= tid < vocab_size:
            raise bad(
                f"'logit_bias' token id {tid} is out of range 0..{vocab_size - 1}",
                "logit_bias",
                "invalid_value",
            )
        if not is_num(x) or not -100 <= x <= 100:
            raise bad(
                f"'logit_bias' value for {tid} must be a number in [-100, 100]",
                "logit_bias",
                "invalid_value",
            )
        out[tid] = float(x)
    return out
