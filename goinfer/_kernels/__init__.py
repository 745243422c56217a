"""Compiled kernels (Cython + C, OpenMP).  Same names and signatures as goinfer._reference.

The ISA variant is chosen at import from CPUID; GOINFER_KERNEL=portable|avx2|avx512-vnni
overrides it.
"""
import os as _os

from goinfer._threads import apply_wait_policy as _apply_wait_policy

_apply_wait_policy()  # before libgomp loads with the kernels' library

from goinfer._kernels import _config  # noqa: E402

if _os.environ.get("GOINFER_KERNEL"):
    _config.set_variant(_os.environ["GOINFER_KERNEL"])
from goinfer._kernels.matmul import quantize_act, matmul, matmul_experts, get_rows

from goinfer._kernels.ops import (rmsnorm, swiglu, swiglu_oai, gelu_tanh_mul, rope, add, add_bias, copy2d,
                                  scale, softcap, gather_rows)
from goinfer._kernels.moe import moe_route, moe_group, moe_fold
from goinfer._kernels.ssm import ssm_conv, gated_delta, sigmoid_mul
from goinfer._kernels.attention import (kv_write, attention, attention_fast,
                                        attention_counters, reset_attention_counters,
                                        attention_phase_timing, attention_phase_seconds)

__all__ = ["quantize_act", "matmul", "matmul_experts", "get_rows", "rmsnorm", "swiglu", "gelu_tanh_mul", "rope",
           "add", "add_bias", "copy2d", "scale", "softcap", "gather_rows", "moe_route", "moe_group",
           "moe_fold", "ssm_conv", "gated_delta", "sigmoid_mul", "kv_write", "attention",
           "attention_fast", "attention_counters", "reset_attention_counters",
           "attention_phase_timing", "attention_phase_seconds"]
