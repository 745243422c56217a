"""Where goinfer keeps its files: GOINFER_HOME (default ~/.cache/goinfer), holding models/
(registered models), layouts/ (weight layout caches) and verified/ (checksum stamps of
Hugging Face files)."""

from __future__ import annotations

import os
from pathlib import Path


def goinfer_home() -> Path:
    """$GOINFER_HOME, default ~/.cache/goinfer."""
    return Path(os.environ.get("GOINFER_HOME") or "~/.cache/goinfer").expanduser()
