"""Hugging Face names against a local server that speaks the hub's endpoints (fixtures/hfserver.py;
HF_ENDPOINT points at it, nothing goes to the internet): which file a name picks, where it
lands (the Hugging Face cache), the LFS sha256 check (a corrupted download is removed), a
download resumed after a broken connection, HF_TOKEN, offline mode with no request made."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import numpy as np
import pytest

from fixtures.hfserver import FakeHub
from goinfer import hub, hub_hf
from goinfer.errors import DownloadError, ModelNotFoundError, UnsupportedTensorTypeError
from goinfer.hub_hf import HFRef, RepoFile, candidates, choose, quant_tag


@pytest.fixture
def env(tmp_path, monkeypatch):
    """Every cache in tmp_path, no token, online, and huggingface_hub's own agent-registry
    request (made once per process, to its import-time endpoint) answered from memory."""
    for k in (
        "HF_TOKEN",
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HF_HOME",
        "HUGGINGFACE_HUB_CACHE",
    ):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("GOINFER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    try:
        from huggingface_hub.utils import _detect_agent

        monkeypatch.setattr(
            _detect_agent, "_registry", _detect_agent._EMPTY_REGISTRY, raising=False
        )
    except (ImportError, AttributeError):
        pass
    return tmp_path


@pytest.fixture
def fake(env, monkeypatch):
    with FakeHub() as h:
        monkeypatch.setenv("HF_ENDPOINT", h.url)
        yield h


def _bytes(n: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def _cache_files(root: Path) -> list[str]:
    return sorted(
        p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() or p.is_symlink()
    )


# ============================================================================ names and choice


def test_parse_names():
    assert hub_hf.parse("Qwen/Qwen3-4B-GGUF") == HFRef("Qwen/Qwen3-4B-GGUF")
    assert hub_hf.parse("hf.co/Qwen/Qwen3-4B-GGUF:q4_k_m") == HFRef("Qwen/Qwen3-4B-GGUF", "q4_k_m")
    assert hub_hf.parse("https://huggingface.co/a/b:Q8_0") == HFRef("a/b", "Q8_0")
    assert hub_hf.parse("a/b", quant="Q8_0") == HFRef("a/b", "Q8_0")
    assert hub_hf.parse("hf.co/a/b/sub/x-Q4_0.gguf") == HFRef("a/b", None, "sub/x-Q4_0.gguf")
    for bad in ("llama3.2", "qwen3:4b", "a/b/c", "/abs/path", "a--b/c", "a/b:c:d", "a/../b"):
        assert hub_hf.parse(bad) is None, bad
    with pytest.raises(ModelNotFoundError, match="names quantization Q4_0"):
        hub_hf.parse("a/b:Q4_0", quant="Q8_0")
    assert hub_hf.is_explicit("hf.co/a/b") and not hub_hf.is_explicit("a/b")


@pytest.mark.parametrize(
    "path, tag",
    [
        ("Qwen3-4B-Q4_K_M.gguf", "Q4_K_M"),
        ("qwen2.5-7b-instruct-q4_k_m.gguf", "Q4_K_M"),
        ("SmolLM2-135M-Instruct.Q4_1.gguf", "Q4_1"),
        ("gemma-3-270m-it-qat-Q4_0.gguf", "Q4_0"),
        ("gpt-oss-20b-mxfp4.gguf", "MXFP4"),
        ("Model-UD-Q4_K_XL.gguf", "UD-Q4_K_XL"),
        ("ggml-model-f16.gguf", "F16"),
        ("BF16/M-BF16-00001-of-00002.gguf", "BF16"),
        ("Llama-IQ4_XS.gguf", "IQ4_XS"),
        ("model.gguf", ""),
        ("Q8_0.gguf", "Q8_0"),
    ],
)
def test_quant_tag(path, tag):
    assert quant_tag(path) == tag


def _files(*paths: str) -> list[RepoFile]:
    return [RepoFile(p, 100) for p in paths]


def _pick(files, quant=None, filename=None) -> str:
    return choose(candidates(_files(*files)), HFRef("o/r", quant, filename), "o/r").path


def test_choose_default_and_closest():
    assert _pick(["m-Q8_0.gguf", "m-Q4_K_M.gguf", "m-Q4_K_S.gguf"]) == "m-Q4_K_M.gguf"
    assert _pick(["m-Q8_0.gguf", "m-Q4_K_S.gguf", "m-Q4_0.gguf"]) == "m-Q4_K_S.gguf"
    assert _pick(["m-Q8_0.gguf", "m-Q3_K_M.gguf", "m-Q5_K_M.gguf"]) == "m-Q5_K_M.gguf"
    assert _pick(["m-F16.gguf", "m-Q8_0.gguf", "m-IQ4_XS.gguf"]) == "m-Q8_0.gguf"  # IQ: not run
    assert _pick(["m-BF16.gguf", "m-F32.gguf"]) == "m-BF16.gguf"
    assert _pick(["model.gguf"]) == "model.gguf"  # no tag: the only model
    assert _pick(["m-Q4_K_M.gguf", "mmproj-m-F16.gguf", "imatrix.gguf"]) == "m-Q4_K_M.gguf"
    assert _pick(["gpt-oss-20b-mxfp4.gguf"]) == "gpt-oss-20b-mxfp4.gguf"


def test_choose_named_quant():
    files = ["m-Q4_K_M.gguf", "m-Q8_0.gguf", "m-UD-Q4_K_XL.gguf", "m-IQ4_XS.gguf"]
    assert _pick(files, "q8_0") == "m-Q8_0.gguf"
    assert _pick(files, "UD-Q4_K_XL") == "m-UD-Q4_K_XL.gguf"
    assert _pick(files, "Q4_K_XL") == "m-UD-Q4_K_XL.gguf"  # named between separators
    assert _pick(files, filename="M-Q8_0.gguf") == "m-Q8_0.gguf"
    with pytest.raises(
        ModelNotFoundError, match=r"no Q5_K_M file; its models: .*Q4_K_M: m-Q4_K_M.gguf"
    ):
        _pick(files, "Q5_K_M")
    with pytest.raises(UnsupportedTensorTypeError, match=r"IQ4_XS, a type goinfer cannot run"):
        _pick(files, "IQ4_XS")
    with pytest.raises(UnsupportedTensorTypeError, match=r"runs none of the quantizations"):
        _pick(["m-IQ2_M.gguf", "m-IQ4_XS.gguf"])
    with pytest.raises(ModelNotFoundError, match=r"no file nope.gguf"):
        _pick(files, filename="nope.gguf")


def test_choose_ambiguous_lists_the_models():
    files = ["base-Q4_K_M.gguf", "instruct-Q4_K_M.gguf", "base-Q8_0.gguf"]
    with pytest.raises(
        ModelNotFoundError,
        match=r"2 models .* match: base-Q4_K_M.gguf; "
        r"instruct-Q4_K_M.gguf; name one as hf.co/o/r/FILE",
    ):
        _pick(files)
    assert _pick(files, filename="instruct-Q4_K_M.gguf") == "instruct-Q4_K_M.gguf"


def test_split_candidates():
    files = [
        "Q4_K_M/m-Q4_K_M-00002-of-00002.gguf",
        "Q4_K_M/m-Q4_K_M-00001-of-00002.gguf",
        "m-Q8_0.gguf",
        "README.md",
    ]
    cands = candidates(_files(*files))
    c = next(c for c in cands if c.tag == "Q4_K_M")
    assert [f.path for f in c.files] == sorted(files[:2]) and c.count == 2 and c.complete
    assert _pick(files) == "Q4_K_M/m-Q4_K_M-00001-of-00002.gguf"
    assert _pick(files, filename="Q4_K_M/m-Q4_K_M-00002-of-00002.gguf") == c.path
    incomplete = next(c for c in candidates(_files(files[0], "x.gguf")) if c.count == 2)
    assert not incomplete.complete


# ============================================================================ the hub


def test_download_lands_in_the_hf_cache(fake, env):
    q4, q8 = _bytes(300_000, 1), _bytes(100_000, 2)
    repo = fake.add_repo("org/m-GGUF", {"m-Q4_K_M.gguf": q4, "m-Q8_0.gguf": q8, "README.md": b"hi"})
    p = hub.resolve("org/m-GGUF", progress=False)
    assert p.read_bytes() == q4
    root = env / "hf" / "models--org--m-GGUF"
    assert p == root / "snapshots" / repo.commit / "m-Q4_K_M.gguf"
    assert os.path.realpath(p) == str(root / "blobs" / repo.files["m-Q4_K_M.gguf"].sha256)
    assert (root / "refs" / "main").read_text() == repo.commit
    assert fake.count("GET", "/api/models/org/m-GGUF/revision/main") == 1
    assert fake.count("HEAD", "/resolve/") == 1 and fake.count("GET", "/cdn/") == 1
    assert not [f for f in _cache_files(env / "hf") if f.endswith(".incomplete")]
    # cached: a second resolve makes no request; a named tag downloads its own file
    n = len(fake.requests)
    assert hub.resolve("hf.co/org/m-GGUF:Q4_K_M", progress=False) == p and len(fake.requests) == n
    assert hub.resolve("org/m-GGUF:q8_0", progress=False).read_bytes() == q8
    assert hub.locate("org/m-GGUF", quant="Q8_0", progress=False).kind == "hf"


def test_corrupted_download_is_removed(fake, env):
    data = _bytes(200_000, 3)
    repo = fake.add_repo("org/bad", {"x-Q4_K_M.gguf": data})
    fake.corrupt.add("x-Q4_K_M.gguf")
    with pytest.raises(
        DownloadError,
        match=r"x-Q4_K_M.gguf: the downloaded file has sha256 "
        r"[0-9a-f]{64}, the hub lists " + repo.files["x-Q4_K_M.gguf"].sha256,
    ):
        hub.pull("org/bad", progress=False)
    left = _cache_files(env / "hf")
    assert not [
        f for f in left if "/blobs/" in f or "/snapshots/" in f or f.endswith(".incomplete")
    ]
    assert not (env / "home" / "verified").exists() or not any(
        (env / "home" / "verified").iterdir()
    )
    fake.corrupt.clear()  # the next pull fetches it whole
    assert hub.pull("org/bad", progress=False).read_bytes() == data


def test_broken_connection_resumes(fake, env):
    """huggingface_hub writes 10 MiB chunks; a connection broken after two of them resumes with
    a range request for the rest (answered 206)."""
    data = _bytes(25 << 20, 4)
    fake.add_repo("org/big", {"big-Q4_K_M.gguf": data})
    fake.drop_after["big-Q4_K_M.gguf"] = 21 << 20
    p = hub.pull("org/big", progress=False)
    gets = [h for m, path, h in fake.requests if m == "GET" and path.startswith("/cdn/")]
    assert len(gets) == 2 and "range" not in gets[0] and gets[1]["range"] == f"bytes={20 << 20}-"
    assert p.read_bytes() == data


def test_interrupted_download_leaves_nothing(fake, env, monkeypatch):
    """Ctrl-C in the middle of a file: no partial file in the cache, nothing stamped."""
    import huggingface_hub.file_download as fd

    fake.add_repo("org/i", {"i-Q4_K_M.gguf": _bytes(100_000, 14)})

    def interrupted(url, temp_file, *a, **k):
        temp_file.write(b"\0" * 5000)
        raise KeyboardInterrupt

    monkeypatch.setattr(fd, "http_get", interrupted)
    with pytest.raises(KeyboardInterrupt):
        hub.pull("org/i", progress=False)
    left = _cache_files(env / "hf")
    assert not [f for f in left if "/blobs/" in f or "/snapshots/" in f], left
    assert not (env / "home" / "verified").exists()


def test_cached_file_verified_once_then_stamped(fake, env):
    data = _bytes(50_000, 5)
    fake.add_repo("org/s", {"s-Q4_K_M.gguf": data})
    p = hub.resolve("org/s", progress=False)
    stamps = list((env / "home" / "verified").glob("*.json"))
    assert [s.stem for s in stamps] == [fake.repos["org/s"].files["s-Q4_K_M.gguf"].sha256]
    real = Path(os.path.realpath(p))
    real.chmod(0o644)
    raw = bytearray(real.read_bytes())
    raw[10] ^= 1  # same size, new mtime: the stamp no longer matches, the file is hashed again
    real.write_bytes(bytes(raw))
    with pytest.raises(DownloadError, match="the downloaded file has sha256"):
        hub.resolve("org/s", progress=False)
    assert not real.exists() and not p.is_symlink()


def test_offline_uses_the_cache_without_a_request(fake, env, monkeypatch):
    fake.add_repo("org/o", {"o-Q8_0.gguf": _bytes(1000, 6), "o-F16.gguf": _bytes(2000, 7)})
    cached = hub.resolve("org/o", progress=False)  # no Q4_K_M: the closest, Q8_0
    assert cached.name == "o-Q8_0.gguf"
    n = len(fake.requests)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def no_network(*a, **k):
        raise AssertionError("a connection was attempted in offline mode")

    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    assert hub.resolve("org/o", progress=False) == cached
    assert hub.resolve("hf.co/org/o:Q8_0", progress=False) == cached
    assert hub.pull("org/o", progress=False) == cached
    with pytest.raises(ModelNotFoundError, match=r"cache.* has no F16 file"):
        hub.resolve("org/o:F16", progress=False)  # in the repo, not in the cache
    with pytest.raises(
        ModelNotFoundError, match=r"offline \(HF_HUB_OFFLINE\) and org/none is not in"
    ):
        hub.resolve("org/none", progress=False)
    with pytest.raises(DownloadError, match="offline"):
        hub.pull("org/o", force=True, progress=False)
    assert len(fake.requests) == n


def test_token(fake, env, monkeypatch):
    data = _bytes(5000, 8)
    fake.add_repo("org/private", {"p-Q4_K_M.gguf": data}, token="hf_secret")
    with pytest.raises(ModelNotFoundError, match=r"no model repo org/private at .* needs HF_TOKEN"):
        hub.resolve("org/private", progress=False)
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    assert hub.resolve("org/private", progress=False).read_bytes() == data
    hub_reqs = [h for m, p, h in fake.requests if not p.startswith("/cdn/")]
    cdn_reqs = [h for m, p, h in fake.requests if p.startswith("/cdn/")]
    assert hub_reqs[-1]["authorization"] == "Bearer hf_secret"
    assert cdn_reqs and all("authorization" not in h for h in cdn_reqs)  # never sent off the hub


def test_unknown_repo_and_unreachable_hub(fake, env, monkeypatch):
    with pytest.raises(
        ModelNotFoundError,
        match=r"no model repo org/nope .* nor is org/nope "
        r"in the Ollama store",
    ):
        hub.resolve("org/nope", progress=False)
    with pytest.raises(ModelNotFoundError, match=r"no model repo org/nope") as ei:
        hub.resolve("hf.co/org/nope", progress=False)
    assert "Ollama" not in str(ei.value)
    fake.add_repo("org/c", {"c-Q8_0.gguf": _bytes(100, 9)})
    cached = hub.resolve("org/c", progress=False)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setenv("HF_ENDPOINT", dead)
    with pytest.raises(DownloadError, match=r"org/gone: cannot reach|org/gone: .*Error"):
        hub.resolve("org/gone", progress=False)
    with pytest.warns(UserWarning, match="using the cached c-Q8_0.gguf"):
        assert hub.pull("org/c", progress=False) == cached


def test_pull_follows_the_repo(fake, env):
    fake.add_repo("org/u", {"u-Q4_K_M.gguf": _bytes(1000, 10)})
    old = hub.pull("org/u", progress=False)
    new_data = _bytes(1200, 11)
    repo = fake.add_repo("org/u", {"u-Q4_K_M.gguf": new_data})  # a new commit
    assert hub.resolve("org/u", progress=False) == old  # cached: no request
    new = hub.pull("org/u", progress=False)  # pull asks the hub
    assert new != old and new.read_bytes() == new_data
    assert (env / "hf" / "models--org--u" / "refs" / "main").read_text() == repo.commit
    assert hub.resolve("org/u", progress=False) == new


def test_split_repo_and_model_load(fake, env, tiny, tmp_path):
    """A split GGUF in a repo subfolder: both parts are fetched, the model loads from the first,
    and its logits are the unsplit file's."""
    from fixtures.ggufsplit import split_gguf
    from goinfer.model import Model

    whole = tiny("llama")[1]
    parts = split_gguf(whole, tmp_path / "parts" / "tiny-F32.gguf", 7)
    assert len(parts) >= 2
    fake.add_repo("org/tiny-GGUF", {f"F32/{p.name}": p for p in parts} | {"README.md": b"x"})
    m = Model.load("hf.co/org/tiny-GGUF", threads=1, progress=False, layout_cache=False)
    assert m.source.kind == "hf" and m.name == "tiny-F32" and m.source.path.name == parts[0].name
    assert fake.count("GET", "/cdn/") == len(parts)
    ref = Model.load(whole, threads=1, progress=False, layout_cache=False)
    ids = [1, 5, 9, 3, 7]
    assert np.array_equal(m.logits(ids).view(np.uint32), ref.logits(ids).view(np.uint32))


def test_list_shows_the_hf_cache(fake, env, capsys):
    fake.add_repo("org/l", {"l-Q4_K_M.gguf": _bytes(3000, 12), "l-Q8_0.gguf": _bytes(10, 13)})
    p = hub.resolve("org/l", progress=False)
    ms = {m.name: m for m in hub.list_models()}
    m = ms["hf.co/org/l:Q4_K_M"]
    assert (m.source, m.pulled, m.path, m.size) == ("hf", True, p, 3000)
    from goinfer import cli

    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("hf.co/org/l:Q4_K_M"))
    assert " hf " in line and str(p) in line and "smollm2-135m*" in out
