"""Compiled kernels (Cython + C, OpenMP).  Same names and signatures as goinfer._reference.

The ISA variant is chosen at import from CPUID; GOINFER_KERNEL=portable|avx2|avx512-vnni
overrides it.
"""

import importlib as _importlib
import os as _os

from goinfer._threads import apply_wait_policy as _apply_wait_policy

_apply_wait_policy()  # before libgomp loads with the kernels' library

from goinfer._kernels import _config  # noqa: E402

if _os.environ.get("GOINFER_KERNEL"):
    _config.set_variant(_os.environ["GOINFER_KERNEL"])

# module -> the public kernels it defines, exported here (the bind_* forms and the graph
# helpers stay in their modules: goinfer._kernels.<module>.bind_*)
KERNELS: dict[str, tuple[str, ...]] = {
    "matmul": ("quantize_act", "quantize_gated", "matmul", "matmul_experts", "get_rows"),
    "ops": (
        "rmsnorm",
        "swiglu",
        "swiglu_oai",
        "gelu_tanh_mul",
        "rope",
        "add",
        "add_bias",
        "copy2d",
        "scale",
        "softcap",
        "gather_rows",
    ),
    "moe": ("moe_route", "moe_group", "moe_fold"),
    "ssm": ("ssm_conv", "gated_delta", "sigmoid_mul"),
    "attention": (
        "kv_write",
        "attention",
        "attention_fast",
        "attention_counters",
        "reset_attention_counters",
        "attention_phase_timing",
        "attention_phase_seconds",
    ),
}

for _module, _names in KERNELS.items():
    _mod = _importlib.import_module(f"goinfer._kernels.{_module}")
    globals().update({_name: getattr(_mod, _name) for _name in _names})

__all__ = [name for names in KERNELS.values() for name in names]
