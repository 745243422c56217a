"""Architecture families.  Each module builds its weights from a GGUF and runs the forward step;
models/registry.py says which family runs which ``general.architecture``."""

from __future__ import annotations

from goinfer.models.registry import ARCHITECTURES, FAMILIES, Arch, arch_of, family_for, read_config

__all__ = ["ARCHITECTURES", "FAMILIES", "Arch", "arch_of", "family_for", "read_config"]
