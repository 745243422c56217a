"""Every script in benchmarks/ runs: its --smoke mode (the tiny shape of benchmarks/shapes.py,
one short iteration) in a fresh process, started as `python benchmarks/x.py`.  Scripts that
compare with llama.cpp must still run their goinfer side without llama-cpp-python and say the
peer was skipped.

goinfer must be the one the environment provides (the installed package in CI, whose source
tree has no compiled .so; PYTHONPATH's in development), never the source tree put on sys.path by
the script: each run sees goinfer only through a link in a fresh directory, and an import hook
(sitecustomize, inherited by the script's child processes) fails any import of goinfer that
would come from elsewhere."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import goinfer

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
HELPERS = {"regime.py", "isolate.py", "report.py"}  # modules the scripts share, not benchmarks
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if p.name not in HELPERS)
# scripts with a llama.cpp side: without llama-cpp-python they must say it was skipped
PEERS = {"agent_loop.py", "agreement.py", "memory.py", "peers.py", "perplexity_llamacpp.py",
         "shapes.py"}
HAVE_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None

GUARD = '''\
import importlib.machinery, os, sys
_SITE = os.environ["GOINFER_TEST_SITE"]


class _OnlyThisGoinfer:
    """fails an import of goinfer that sys.path would resolve outside GOINFER_TEST_SITE"""

    def find_spec(self, name, path=None, target=None):
        if name != "goinfer":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, sys.path)
        origin = getattr(spec, "origin", None) or ""
        if not origin.startswith(_SITE + os.sep):
            raise ImportError(f"goinfer would be imported from {origin}, not the environment's "
                              f"package (sys.path: {sys.path})")
        return None


sys.meta_path.insert(0, _OnlyThisGoinfer())
'''


def test_every_script_is_covered():
    """A new benchmark script is run here automatically; this pins that the list is not empty
    and that each script offers --smoke."""
    assert len(SCRIPTS) >= 15
    for name in SCRIPTS:
        assert "--smoke" in (BENCH / name).read_text(), f"{name} has no --smoke mode"


def _env(tmp_path: Path) -> dict:
    """PYTHONPATH: a directory holding only a link to the goinfer package this test imports,
    and the import guard; inherited entries that hold a goinfer package are dropped."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "goinfer").symlink_to(Path(goinfer.__file__).resolve().parent)
    (site / "sitecustomize.py").write_text(GUARD)
    keep = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if p and not (Path(p) / "goinfer").is_dir()]
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(site)] + keep), OMP_NUM_THREADS="1",
                GOINFER_TEST_SITE=str(site), GOINFER_LAYOUT_DIR=str(tmp_path / "layouts"))


def test_guard_catches_the_source_tree(tmp_path):
    """The guard fails a script that puts the repository root on sys.path before importing
    goinfer (what CI's non-editable install cannot survive)."""
    work = tmp_path / "work"
    work.mkdir()
    env = _env(tmp_path)
    good = tmp_path / "good.py"
    good.write_text("import goinfer\nprint(goinfer.__file__)\n")
    out = subprocess.run([sys.executable, str(good)], cwd=work, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(str(tmp_path / "site")), out.stdout
    bad = tmp_path / "bad.py"
    bad.write_text(f"import sys\nsys.path.insert(0, {str(ROOT)!r})\nimport goinfer\n")
    out = subprocess.run([sys.executable, str(bad)], cwd=work, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode != 0 and "not the environment's package" in out.stderr, out.stderr


@pytest.mark.parametrize("name", SCRIPTS)
def test_smoke(name, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    out = subprocess.run([sys.executable, str(BENCH / name), "--smoke"], cwd=work,
                         env=_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"{name} --smoke failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"
    assert out.stdout.strip(), f"{name} --smoke printed nothing"
    if name in PEERS and not HAVE_LLAMA_CPP:
        assert "skipped" in out.stdout, f"{name} did not say that llama.cpp was skipped"
    assert sorted(p.name for p in work.iterdir()) == [], \
        f"{name} --smoke left files in the working directory"


def test_kernels_attention_decode_table(capsys):
    """kernels_attention --decode prints one row per storage type and thread count."""
    sys.path.insert(0, str(BENCH))
    try:
        import kernels_attention
    finally:
        sys.path.remove(str(BENCH))

    kernels_attention.main(["--decode", "--lengths", "600", "--shapes", "4x2x64x2",
                            "--threads", "1", "2", "--reps", "1"])
    out = capsys.readouterr().out
    for dt in ("f32", "f16", "q8_0"):
        assert re.search(rf"^4x2x64x2\s+600\s+{dt}\s+2\s+[\d.]+\s+[\d.]+\s+[\d.]+", out, re.M), out


# ============================================================================ what scripts check
# (in this process, on a tiny model with a long context: the numbers each script reports)


def _script(name):
    """benchmarks/<name>.py imported as a module (the goinfer these tests use)"""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def tiny_path(tiny):
    return str(tiny("llama", 3, max_position_embeddings=4096)[1])


def test_speculative_same_text_with_drafts(tiny_path, capsys):
    """goinfer with and without drafting on the copy task: the same text, drafts made."""
    res = _script("speculative").main([tiny_path, "--smoke", "--threads", "1"])
    row = res["tasks"][0]
    assert row["goinfer_identical"] and row["goinfer + draft"]["tokens"] > 0
    out = capsys.readouterr().out
    assert "speed-up goinfer" in out and "llama.cpp: skipped" in out


@pytest.mark.parametrize("transcript", ["default", "long"])
def test_agent_loop_turns_reuse_the_prefix(tiny_path, transcript, capsys):
    res = _script("agent_loop").main([tiny_path, "--smoke", "--threads", "1",
                                      "--transcript", transcript])
    g = res["engines"]["goinfer (reuse)"]
    assert len(g) == 2 and g[1]["cached_tokens"] > 0  # the second turn reused the first
    assert res["save_load"]["cached_after_load"] > 0
    out = capsys.readouterr().out
    assert "TTFT" in out and "llama.cpp: skipped" in out


# ============================================================================ shapes.py's families
# The Qwen3.5 and gpt-oss shapes must be what llama.cpp's converter writes for those models: the
# tiny shapes of both families against convert_hf_to_gguf.py's output on a transformers model of
# the same config (tests/hfconvert.py, --outtype q8_0; gpt-oss with MXFP4 experts).


def _hf_config(shape) -> dict:
    """tests/hfconvert.py overrides that give the transformers config of a shapes.py shape."""
    kw = dict(vocab_size=shape.vocab, hidden_size=shape.d_model, num_hidden_layers=shape.n_layers,
              num_attention_heads=shape.n_heads, num_key_value_heads=shape.n_kv_heads,
              head_dim=shape.head_dim, max_position_embeddings=shape.context,
              rms_norm_eps=shape.norm_eps, tie_word_embeddings=shape.tied)
    if shape.arch == "qwen35":
        kw.update(intermediate_size=shape.d_ff, linear_num_key_heads=shape.lin_k_heads,
                  linear_num_value_heads=shape.lin_v_heads, linear_key_head_dim=shape.lin_head_dim,
                  linear_value_head_dim=shape.lin_head_dim, linear_conv_kernel_dim=shape.conv_kernel,
                  rope_parameters={"rope_type": "default", "rope_theta": shape.rope_base,
                                   "partial_rotary_factor": shape.rope_dims / shape.head_dim,
                                   "mrope_section": list(shape.rope_sections[:3]),
                                   "mrope_interleaved": True})
    else:
        factor, orig, fast, slow = shape.yarn
        kw.update(intermediate_size=shape.d_ff, num_local_experts=shape.n_expert,
                  num_experts_per_tok=shape.n_expert_used, sliding_window=shape.sliding_window,
                  rope_parameters={"rope_type": "yarn", "rope_theta": shape.rope_base,
                                   "factor": factor, "beta_fast": fast, "beta_slow": slow,
                                   "truncate": False, "original_max_position_embeddings": orig})
    return kw


def _layout(path) -> tuple[dict, dict]:
    """(<arch>.* and general.architecture keys -> (value types, value), tensor -> (shape, type))"""
    from gguf import GGUFReader

    r = GGUFReader(str(path))
    arch = r.fields["general.architecture"].contents()
    keys = {k: (tuple(int(t) for t in f.types), f.contents()) for k, f in r.fields.items()
            if k.startswith(arch + ".") or k == "general.architecture"}
    tensors = {t.name: (tuple(int(n) for n in t.shape), t.tensor_type.name) for t in r.tensors}
    return keys, tensors


@pytest.mark.parametrize("name,family,qtype", [("qwen3.5-tiny", "qwen35", "Q8_0"),
                                               ("gpt-oss-tiny", "gpt-oss", "MXFP4_MOE")])
def test_family_shape_is_the_converters(name, family, qtype, tmp_path):
    """Every <arch>.* key (type and value), tensor name, shape and type of the shape's file is
    what llama.cpp's converter writes for the same config (Q8_0 for what it quantizes, F32 for
    the rest, MXFP4 gpt-oss experts); and goinfer runs the file."""
    import hfconvert

    shapes = _script("shapes")
    shape = shapes.SHAPES[name]
    _, ref = hfconvert.build(family, outtype="q8_0", **_hf_config(shape))
    ours = shapes.make(shape, qtype, tmp_path, pure=True, vocab="bytes", log=None)
    (rk, rt), (ok, ot) = _layout(ref), _layout(ours)
    assert ok == rk
    assert ot == rt
    assert np.isfinite(shapes.goinfer_logits(ours, [1, 2, 3, 4, 5])).all()


@pytest.mark.parametrize("name,qtype", [("qwen3.5-tiny", "Q4_0"), ("gpt-oss-tiny", "MXFP4_MOE")])
def test_family_shape_loads_in_llama_cpp(name, qtype, tmp_path):
    """llama.cpp (llama-cpp-python, the benchmark environment) loads and runs the shape's file."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (benchmark env only)")
    shapes = _script("shapes")
    path = shapes.make(shapes.SHAPES[name], qtype, tmp_path, pure=True, vocab="bytes", log=None)
    lc = shapes.llama_cpp_logits(path, [1, 2, 3, 4, 5])
    assert lc.shape == (5, shapes.SHAPES[name].vocab) and np.isfinite(lc).all()


def test_peers_llama_cpp_only(tmp_path, capsys):
    """peers.py --no-goinfer runs llama.cpp alone (gpt-oss-20b does not fit both engines in one
    process on 24 GB); its rows hold llama.cpp's engine only."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (benchmark env only)")
    path = str(_script("shapes").smoke_model(tmp_path))
    res = _script("peers").main([path, "--no-goinfer", "--threads", "1", "--prompt-lengths", "64",
                                 "--decode-prompts", "16", "--decode-tokens", "2", "--repeats", "1",
                                 "--flash-attn", "off"])
    assert list(res["prefill"][0]["tok_s"]) == ["llama.cpp"]
    assert list(res["decode"][0]["tok_s"]) == ["llama.cpp"] and res["goinfer_load"] == "not run"


@pytest.mark.parametrize("side", ["--no-llama-cpp", "--no-goinfer"])
def test_peers_rows_longer_than_the_context_fail_before_any_run(tmp_path, capsys, monkeypatch, side):
    """A decode row past the model's context is refused at the start, before either engine
    loads, naming both lengths (it used to fail with ContextLengthError after every prefill
    row had run; a llama.cpp-only run read a context accessor Llama does not have)."""
    path = str(_script("shapes").smoke_model(tmp_path))
    from goinfer import Model

    ctx = Model.load(path, progress=False).config.context_length
    peers = _script("peers")
    for engine in ("GoinferEngine", "LlamaCppEngine"):
        monkeypatch.setattr(peers, engine, lambda *a, **k: pytest.fail("an engine loaded"))
    with pytest.raises(SystemExit):
        peers.main([path, side, "--threads", "1", "--prompt-lengths", "16",
                    "--decode-prompts", str(ctx), "--decode-tokens", "2", "--repeats", "1"])
    err = capsys.readouterr().err
    assert f"need {ctx + 2} tokens" in err and f"has {ctx}" in err
