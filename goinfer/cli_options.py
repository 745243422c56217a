"""Command-line options shared by `goinfer` (goinfer/cli.py) and `goinfer serve`
(goinfer/server/cli.py)."""

from __future__ import annotations

import argparse

__all__ = ["exact_option", "kv_dtype_option"]


def kv_dtype_option(p: argparse.ArgumentParser) -> None:
    from goinfer.kv_cache import DEFAULT_KV_DTYPE, KV_DTYPES

    p.add_argument(
        "--kv-dtype",
        choices=KV_DTYPES,
        default=DEFAULT_KV_DTYPE,
        help="KV cache storage: f16 (default, half of f32), f32, q8_0 (~a quarter)",
    )


def exact_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--exact",
        "--exact-prefill",
        dest="exact",
        action="store_true",
        help="float64 attention at every position (default: the fast float32 kernel "
        "for positions >= 512; --exact-prefill is the old name)",
    )
