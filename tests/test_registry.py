"""The family registry (goinfer/models/registry.py) and what each family declares about itself
(models/family.py): every registered family states its capabilities in its own class body, the
declarations match what a loaded model holds, and a tiny model of every registered
architecture (and of every registered family) loads and runs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fixtures import hfconvert, tinygemma, tinymodels, tinymoe
from fixtures.compare import load
from goinfer import KVCache, graph, layout
from goinfer.gguf import GGUFFile
from goinfer.models import ARCHITECTURES, FAMILIES, family_for
from goinfer.models.family import Family
from goinfer.models.llama import LlamaFamily
from goinfer.quant import QWeight

# ============================================================================ declarations


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.__name__)
def test_every_registered_family_declares_its_capabilities(family):
    assert isinstance(family.declared("capturable"), bool), f"{family.__name__}: capturable"
    types = family.declared("weight_types")
    assert isinstance(types, tuple) and types, f"{family.__name__}: weight_types"
    assert all(dataclasses.is_dataclass(t) and isinstance(t, type) for t in types)
    for method in ("read_config", "load_layer", "forward"):  # a family of its own, not the base's
        assert getattr(family, method) is not getattr(Family, method), f"{family.__name__}.{method}"


def test_registry_entries_are_well_formed():
    for name, arch in ARCHITECTURES.items():
        assert arch.family in FAMILIES and (arch.experts is None or arch.experts in FAMILIES), name
        assert arch.routing in ("softmax_topk", "topk_softmax"), name
        assert arch.swa_pattern >= 0 and arch.no_rope_step >= 0, name
    assert set(FAMILIES) == {f for a in ARCHITECTURES.values() for f in (a.family, a.experts) if f}


def test_capabilities_are_not_inherited():
    """A subclass that does not declare them is neither graph-captured nor layout-cached: it
    may do array work outside the kernels, or hold weights outside load_weights."""

    class Undeclared(LlamaFamily):
        pass

    from goinfer import _kernels

    impl = object.__new__(Undeclared)
    assert graph.supported(object.__new__(LlamaFamily), _kernels)
    assert not graph.supported(impl, _kernels)
    assert layout.weight_classes(LlamaFamily) is not None
    assert layout.weight_classes(Undeclared) is None


# ============================================================================ every architecture loads


def _tiny(arch):
    return lambda tiny, tmp: tiny(arch, 1)[1]


def _moe(arch):
    return lambda tiny, tmp: tinymoe.build_moe(arch, tmp, seed=1)[1]


def _conv(family, **over):
    return lambda tiny, tmp: hfconvert.build(family, **over)[1]


# case -> (GGUF arch, family class name, hybrid, how to build its tiny model)
CASES = {
    "llama": ("llama", "LlamaFamily", False, _tiny("llama")),
    "mistral": (
        "mistral",
        "LlamaFamily",
        False,
        lambda tiny, tmp: tinymodels.write_gguf(
            tinymodels.hf_model("mistral", 1), "mistral", tmp / "m.gguf", gguf_arch="mistral"
        ),
    ),
    "qwen2": ("qwen2", "LlamaFamily", False, _tiny("qwen2")),
    "qwen3": ("qwen3", "LlamaFamily", False, _tiny("qwen3")),
    "mixtral": ("llama", "MoEFamily", False, _moe("mixtral")),
    "qwen2moe": ("qwen2moe", "MoEFamily", False, _moe("qwen2moe")),
    "qwen3moe": ("qwen3moe", "MoEFamily", False, _moe("qwen3moe")),
    "olmoe": ("olmoe", "MoEFamily", False, _moe("olmoe")),
    "gemma3": (
        "gemma3",
        "Gemma3Family",
        False,
        lambda tiny, tmp: tinygemma.write_gguf(tinygemma.hf_model(1), tmp / "g3.gguf"),
    ),
    "gemma4": ("gemma4", "Gemma4Family", False, _conv("gemma4")),
    "gemma4moe": ("gemma4", "Gemma4MoEFamily", False, _conv("gemma4", **hfconvert.GEMMA4_MOE)),
    "smollm3": ("smollm3", "SmolLM3Family", False, _conv("smollm3")),
    "qwen35": ("qwen35", "Qwen35Family", True, _conv("qwen35")),
    "qwen35moe": ("qwen35moe", "Qwen35MoEFamily", True, _conv("qwen35moe")),
    "gpt-oss": ("gpt-oss", "GptOssFamily", False, _conv("gpt-oss")),
}


def test_the_cases_cover_the_registry():
    """Adding an architecture or a family to the registry needs a case here."""
    assert {arch for arch, *_ in CASES.values()} == set(ARCHITECTURES)
    assert {name for _, name, *_ in CASES.values()} == {f.__name__ for f in FAMILIES}


def _dataclass_types(obj, seen: set) -> set:
    """Types of the dataclass instances in a weights tree (QWeight aside)."""
    if isinstance(obj, (list, tuple)):
        for v in obj:
            _dataclass_types(v, seen)
    elif isinstance(obj, dict):
        for v in obj.values():
            _dataclass_types(v, seen)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, QWeight):
        seen.add(type(obj))
        for f in dataclasses.fields(obj):
            _dataclass_types(getattr(obj, f.name), seen)
    return seen


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_registered_architecture_loads(case, tiny, tmp_path):
    arch, family_name, hybrid, build = CASES[case]
    path = build(tiny, tmp_path)
    g = GGUFFile(path)
    assert g.arch == arch
    family = family_for(g)
    assert family.__name__ == family_name
    m = load(path, threads=1, graph=True, layout_cache=False)
    assert type(m.impl) is family
    cfg = m.config
    # what the config declares about its layers is what the KV cache and the model hold
    geom = cfg.kv_geometry()
    assert len(geom) == cfg.n_kv_layers <= cfg.n_attn_layers <= cfg.n_layers
    assert KVCache(m, max_tokens=64).n_layers == len(geom)
    assert m.hybrid is hybrid and (cfg.state_spec is not None) is hybrid
    # the weight dataclasses the family declares are the ones its weights tree holds
    held = _dataclass_types(m.impl.layers, set())
    assert held == set(family.declared("weight_types"))
    assert (m.graph is not None) is family.declared("capturable")
    ids = np.random.default_rng(3).integers(0, m.vocab_size, 12).tolist()
    logits = m.logits(ids)
    assert logits.shape == (12, m.vocab_size) and np.isfinite(logits).all()
