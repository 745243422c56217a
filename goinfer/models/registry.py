"""The architectures goinfer runs: one table from a GGUF ``general.architecture`` to the family
that runs it and the facts about the architecture that its files leave out.

Adding a family is its module (models/<family>.py: config, weights, the family class with its
declared capabilities, models/family.py) and a line here; tests/test_registry.py checks that
every family here declares its capabilities and that every architecture loads.
"""

from __future__ import annotations

from goinfer.errors import UnsupportedArchitectureError
from goinfer.models.arch import Arch
from goinfer.models.base import ModelConfig
from goinfer.models.experts import has_experts
from goinfer.models.family import Family
from goinfer.models.gemma import Gemma3Family
from goinfer.models.gemma4 import Gemma4Family, Gemma4MoEFamily
from goinfer.models.gptoss import GptOssFamily
from goinfer.models.llama import LlamaFamily
from goinfer.models.moe import MoEFamily
from goinfer.models.qwen35 import Qwen35Family, Qwen35MoEFamily
from goinfer.models.smollm3 import SmolLM3Family


def family_of(arch: Arch, g) -> type[Family]:
    """The family that runs the GGUF g of this architecture."""
    if arch.experts is not None and has_experts(g):
        return arch.experts
    return arch.family


ARCHITECTURES: dict[str, Arch] = {
    "llama": Arch(
        LlamaFamily, experts=MoEFamily, routing="topk_softmax", norm_topk=True
    ),  # Mixtral
    "mistral": Arch(LlamaFamily, experts=MoEFamily, routing="topk_softmax", norm_topk=True),
    "qwen2": Arch(LlamaFamily, experts=MoEFamily, rope_neox=True),
    "qwen3": Arch(LlamaFamily, experts=MoEFamily, rope_neox=True),
    "qwen2moe": Arch(MoEFamily, rope_neox=True),
    "qwen3moe": Arch(MoEFamily, rope_neox=True, norm_topk=True),
    "olmoe": Arch(MoEFamily, rope_neox=True),
    "gemma3": Arch(Gemma3Family, rope_neox=True, swa_pattern=6),
    "gemma4": Arch(
        Gemma4Family, experts=Gemma4MoEFamily, rope_neox=True, norm_topk=True, swa_pattern=6
    ),
    "smollm3": Arch(SmolLM3Family, no_rope_step=4),
    "qwen35": Arch(Qwen35Family, rope_neox=True),
    "qwen35moe": Arch(Qwen35MoEFamily, rope_neox=True, norm_topk=True),
    "gpt-oss": Arch(GptOssFamily, rope_neox=True, routing="topk_softmax", swa_pattern=2),
}

FAMILIES: tuple[type[Family], ...] = tuple(
    dict.fromkeys(f for a in ARCHITECTURES.values() for f in (a.family, a.experts) if f is not None)
)


def arch_of(g) -> Arch:
    """The registry entry of the GGUF g; UnsupportedArchitectureError if there is none."""
    arch = ARCHITECTURES.get(g.arch)
    if arch is None:
        raise UnsupportedArchitectureError(
            f"{g.path}: architecture {g.arch!r} is not supported; supported: "
            f"{', '.join(sorted(ARCHITECTURES))}"
        )
    return arch


def family_for(g) -> type[Family] | None:
    """The family that runs the GGUF file g, or None if its architecture is not supported:
    by ``general.architecture``, except that a file whose layers carry expert routers runs as
    its architecture's MoE family (Mixtral: arch "llama" with blk.N.ffn_gate_inp and
    ffn_*_exps tensors)."""
    arch = ARCHITECTURES.get(g.arch)
    return None if arch is None else family_of(arch, g)


def read_config(g) -> tuple[type[Family], ModelConfig]:
    """(family, config) of the GGUF g; UnsupportedArchitectureError if goinfer does not run it."""
    arch = arch_of(g)
    family = family_of(arch, g)
    return family, family.read_config(g, arch)
