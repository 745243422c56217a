"""One architecture's registry row (models/registry.py): its family, and the facts about the
architecture that its GGUF files leave out.  Plain data, imported by the families and the
registry alike."""

from __future__ import annotations

from dataclasses import dataclass


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

    family: type  # models.family.Family subclass
    experts: type | None = None
    rope_neox: bool = False
    routing: str = "softmax_topk"
    norm_topk: bool = False
    swa_pattern: int = 0
    no_rope_step: int = 0
