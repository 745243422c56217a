"""Architecture families.  Each module builds its weights from a GGUF and runs the forward step.

ARCHITECTURES maps a GGUF ``general.architecture`` to the family that runs it; family_for(g)
is the one place that picks the family of a file (a llama file with experts is MoE).
"""
from __future__ import annotations

from goinfer.models import gemma, gemma4, gptoss, llama, moe, qwen35, smollm3

ARCHITECTURES = {
    "llama": llama.LlamaFamily,
    "mistral": llama.LlamaFamily,
    "qwen2": llama.LlamaFamily,
    "qwen3": llama.LlamaFamily,
    "qwen2moe": moe.MoEFamily,
    "qwen3moe": moe.MoEFamily,
    "olmoe": moe.MoEFamily,
    "gemma3": gemma.Gemma3Family,
    "gemma4": gemma4.Gemma4Family,
    "smollm3": smollm3.SmolLM3Family,
    "qwen35": qwen35.Qwen35Family,
    "qwen35moe": qwen35.Qwen35MoEFamily,
    "gpt-oss": gptoss.GptOssFamily,
}


def family_for(g):
    """The family that runs the GGUF file g, or None if its architecture is not supported.

    By ``general.architecture``, except that a llama-family file whose layers carry expert
    routers (Mixtral: arch "llama" with blk.N.ffn_gate_inp and ffn_*_exps tensors) runs as
    a Mixture of Experts."""
    family = ARCHITECTURES.get(g.arch)
    if family is llama.LlamaFamily and moe.has_experts(g):
        return moe.MoEFamily
    if family is gemma4.Gemma4Family and moe.has_experts(g):
        return gemma4.Gemma4MoEFamily
    return family
