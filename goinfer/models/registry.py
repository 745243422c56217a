"""The architectures goinfer runs: one table from a GGUF ``general.architecture`` to the family
that runs it and the facts about the architecture that its files leave out.

Adding a family is its module (models/<family>.py: config, weights, the family class with its
declared capabilities, models/family.py) and a line here; tests/test_registry.py checks that
every family here declares its capabilities and that every architecture loads.
"""
from __future__ import annotations

from dataclasses import dataclass

from goinfer.errors import UnsupportedArchitectureError
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


@dataclass(frozen=True)
class Arch:
    """One architecture: its family, and what the family must know that the file does not say
    (llama.cpp's choices for the architecture).

    experts       the family of a file whose layers carry expert routers (None: ``family``)
    rope_neox     RoPE rotates the pairs (i, i + n/2) (NeoX), not (2i, 2i + 1)
    routing       MoE: "softmax_topk" (softmax over all experts, then the top k) or
                  "topk_softmax" (the top k logits, softmax over those k)
    norm_topk     MoE: renormalize the chosen weights to sum 1 (unless the file's
                  {arch}.expert_weights_norm says otherwise)
    swa_pattern   a sliding window without attention.sliding_window_pattern in the file:
                  layer i slides when i % n < n - 1 (0: every layer)
    no_rope_step  every n-th layer has no positional encoding (0: none)
    """

    family: type[Family]
    experts: type[Family] | None = None
    rope_neox: bool = False
    routing: str = "softmax_topk"
    norm_topk: bool = False
    swa_pattern: int = 0
    no_rope_step: int = 0

    def family_of(self, g) -> type[Family]:
        """The family that runs the GGUF g of this architecture."""
        if self.experts is not None and has_experts(g):
            return self.experts
        return self.family


ARCHITECTURES: dict[str, Arch] = {
    "llama": Arch(LlamaFamily, experts=MoEFamily, routing="topk_softmax", norm_topk=True),  # Mixtral
    "mistral": Arch(LlamaFamily, experts=MoEFamily, routing="topk_softmax", norm_topk=True),
    "qwen2": Arch(LlamaFamily, experts=MoEFamily, rope_neox=True),
    "qwen3": Arch(LlamaFamily, experts=MoEFamily, rope_neox=True),
    "qwen2moe": Arch(MoEFamily, rope_neox=True),
    "qwen3moe": Arch(MoEFamily, rope_neox=True, norm_topk=True),
    "olmoe": Arch(MoEFamily, rope_neox=True),
    "gemma3": Arch(Gemma3Family, rope_neox=True, swa_pattern=6),
    "gemma4": Arch(Gemma4Family, experts=Gemma4MoEFamily, rope_neox=True, norm_topk=True,
                   swa_pattern=6),
    "smollm3": Arch(SmolLM3Family, no_rope_step=4),
    "qwen35": Arch(Qwen35Family, rope_neox=True),
    "qwen35moe": Arch(Qwen35MoEFamily, rope_neox=True, norm_topk=True),
    "gpt-oss": Arch(GptOssFamily, rope_neox=True, routing="topk_softmax", swa_pattern=2),
}

FAMILIES: tuple[type[Family], ...] = tuple(dict.fromkeys(
    f for a in ARCHITECTURES.values() for f in (a.family, a.experts) if f is not None))


def arch_of(g) -> Arch:
    """The registry entry of the GGUF g; UnsupportedArchitectureError if there is none."""
    arch = ARCHITECTURES.get(g.arch)
    if arch is None:
        raise UnsupportedArchitectureError(
            f"{g.path}: architecture {g.arch!r} is not supported; supported: "
            f"{', '.join(sorted(ARCHITECTURES))}")
    return arch


def family_for(g) -> type[Family] | None:
    """The family that runs the GGUF file g, or None if its architecture is not supported:
    by ``general.architecture``, except that a file whose layers carry expert routers runs as
    its architecture's MoE family (Mixtral: arch "llama" with blk.N.ffn_gate_inp and
    ffn_*_exps tensors)."""
    arch = ARCHITECTURES.get(g.arch)
    return None if arch is None else arch.family_of(g)


def read_config(g) -> tuple[type[Family], ModelConfig]:
    """(family, config) of the GGUF g; UnsupportedArchitectureError if goinfer does not run it."""
    arch = arch_of(g)
    family = arch.family_of(g)
    return family, family.read_config(g, arch)
