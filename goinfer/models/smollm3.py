"""SmolLM3 (GGUF arch ``smollm3``): the llama step with no positional encoding in every fourth
layer ("NoPE" layers 3, 7, 11, ...).

Everything else is the llama family's (models/llama.py): llama.cpp's converter writes smollm3
with the llama layout (q/k rows permuted for interleaved RoPE, tied embeddings when the
checkpoint ties them).  The file carries no layer pattern: llama.cpp fixes the NoPE step at 4
for smollm3 (``n_no_rope_layer_step``; the registry's no_rope_step), as every published SmolLM3
config has it (transformers' ``no_rope_layer_interval``); ``smollm3.no_rope_layer_step`` is
read if a file ever writes one.  A file asking for a sliding window gets a typed error: no SmolLM3
checkpoint uses one and its layer pattern (windowed NoPE layers) is not in GGUF.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from goinfer.errors import UnsupportedArchitectureError
from goinfer.models.base import ModelConfig, RopeCache
from goinfer.models.family import LayerWeights
from goinfer.models.llama import LlamaFamily
from goinfer.models.loading import config_fields

if TYPE_CHECKING:
    from goinfer.gguf import GGUFFile
    from goinfer.models.arch import Arch

# ============================================================================ config


@dataclass
class SmolLM3Config(ModelConfig):
    rope_layers: tuple = ()  # per layer: True = RoPE, False = no positional encoding

    def describe(self) -> str:
        n_nope = self.n_layers - sum(self.rope_layers)
        return super().describe() + f", {n_nope} NoPE layers"


def read_config(g: GGUFFile, arch: Arch) -> SmolLM3Config:
    fields = config_fields(g, arch)
    if fields["sliding_window"]:
        raise UnsupportedArchitectureError(
            f"{g.path}: smollm3 with a sliding window ({fields['sliding_window']}) is not supported"
        )
    step = int(g.arch_get("no_rope_layer_step", arch.no_rope_step) or arch.no_rope_step)
    rope_layers = tuple((i + 1) % step != 0 for i in range(fields["n_layers"]))
    return SmolLM3Config(**fields, rope_layers=rope_layers)


# ============================================================================ the family


class SmolLM3Family(LlamaFamily):
    """The llama step; NoPE layers skip RoPE."""

    capturable = True
    weight_types = (LayerWeights,)
    read_config = staticmethod(read_config)

    def layer_rope(self, li: int) -> RopeCache | None:
        return self.rope if self.cfg.rope_layers[li] else None
