"""Architecture families.  Each module builds its weights from a GGUF and runs the forward step.

ARCHITECTURES maps a GGUF ``general.architecture`` to the family that runs it.
"""
from __future__ import annotations

from goinfer.models import gemma, llama

ARCHITECTURES = {
    "llama": llama.LlamaFamily,
    "mistral": llama.LlamaFamily,
    "qwen2": llama.LlamaFamily,
    "qwen3": llama.LlamaFamily,
    "gemma3": gemma.Gemma3Family,
}
