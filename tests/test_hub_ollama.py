"""Models in the Ollama store, on a fake store built in a temp dir in Ollama's format
(manifests/<host>/<namespace>/<model>/<tag> JSON, schemaVersion 2, layers by mediaType and
sha256 digest; blobs/sha256-<hex>): names resolve to the GGUF blob, read only; parameters,
template and system layers are read; broken stores give errors naming the file."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from goinfer import hub, hub_ollama
from goinfer.errors import ModelFormatError, ModelNotFoundError
from goinfer.hub_ollama import OllamaName

DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
T = "application/vnd.ollama.image."


def _blob(root: Path, data: bytes | Path, link: bool = False) -> dict:
    """Store a blob as Ollama does (blobs/sha256-<hex>); returns its digest and size."""
    raw = data.read_bytes() if isinstance(data, Path) else data
    hexd = hashlib.sha256(raw).hexdigest()
    dest = root / "blobs" / f"sha256-{hexd}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    if not dest.exists():
        if isinstance(data, Path) and link:
            dest.symlink_to(data)
        else:
            dest.write_bytes(raw)
    return {"digest": f"sha256:{hexd}", "size": len(raw)}


def make_store(
    root: Path,
    name: str,
    gguf: Path | bytes,
    *,
    params: dict | None = None,
    template: str | None = None,
    system: str | None = None,
    family: str = "llama",
    file_type: str = "F32",
    link: bool = False,
    extra: list[dict] | None = None,
) -> Path:
    """Write a manifest for ``name`` (Ollama's [host/][namespace/]model[:tag]); returns its path."""
    n = hub_ollama.parse(name)
    layers = [{"mediaType": T + "model", **_blob(root, gguf, link)}]
    if template is not None:
        layers.append({"mediaType": T + "template", **_blob(root, template.encode())})
    if system is not None:
        layers.append({"mediaType": T + "system", **_blob(root, system.encode())})
    if params is not None:
        layers.append({"mediaType": T + "params", **_blob(root, json.dumps(params).encode())})
    layers.append({"mediaType": T + "license", **_blob(root, b"Apache-2.0")})
    layers += extra or []
    config = {
        "model_format": "gguf",
        "model_family": family,
        "model_families": [family],
        "model_type": "tiny",
        "file_type": file_type,
        "architecture": "amd64",
        "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": [x["digest"] for x in layers]},
    }
    doc = {
        "schemaVersion": 2,
        "mediaType": DOCKER_MANIFEST,
        "config": {"mediaType": DOCKER_CONFIG, **_blob(root, json.dumps(config).encode())},
        "layers": layers,
    }
    path = root / "manifests" / Path(*n.parts())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture
def store(tmp_path, monkeypatch):
    root = tmp_path / "ollama"
    root.mkdir()
    monkeypatch.setenv("OLLAMA_MODELS", str(root))
    monkeypatch.setenv("GOINFER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: no hub
    return root


GO_TEMPLATE = "{{ if .System }}<|system|>{{ .System }}{{ end }}<|user|>{{ .Prompt }}<|assistant|>"


def _tree(root: Path) -> dict:
    return {
        p.relative_to(root).as_posix(): (p.lstat().st_size, p.lstat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
    }


# ============================================================================ names


@pytest.mark.parametrize(
    "name, parts",
    [
        ("llama3.2", ("registry.ollama.ai", "library", "llama3.2", "latest")),
        ("qwen3:4b", ("registry.ollama.ai", "library", "qwen3", "4b")),
        ("user/model:q4", ("registry.ollama.ai", "user", "model", "q4")),
        (
            "hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M",
            ("hf.co", "bartowski", "Llama-3.2-1B-Instruct-GGUF", "Q4_K_M"),
        ),
        ("localhost:11434/ns/m:v1", ("localhost:11434", "ns", "m", "v1")),
    ],
)
def test_parse(name, parts):
    assert hub_ollama.parse(name).parts() == parts


def test_parse_rejects_and_displays():
    for bad in ("", "a/b/c/d", "bad name", "m:", "ns.x/m", "/abs"):
        assert hub_ollama.parse(bad) is None, bad
    assert (
        str(OllamaName("registry.ollama.ai", "library", "llama3.2", "latest")) == "llama3.2:latest"
    )
    assert str(OllamaName("registry.ollama.ai", "user", "m", "t")) == "user/m:t"
    assert str(OllamaName("hf.co", "o", "r", "Q4_K_M")) == "hf.co/o/r:Q4_K_M"


# ============================================================================ the store


def test_find_reads_the_layers(store, tiny):
    gguf = tiny("llama")[1]
    params = {"stop": ["<|user|>"], "temperature": 0.6, "num_ctx": 4096}
    make_store(
        store,
        "qwen3:4b",
        gguf,
        params=params,
        template=GO_TEMPLATE,
        system="Be brief.",
        file_type="Q4_K_M",
    )
    m = hub_ollama.find("qwen3:4b")
    assert m.name == "qwen3:4b" and m.path.read_bytes() == gguf.read_bytes()
    assert m.path.parent == store / "blobs" and m.path.name.startswith("sha256-")
    assert (m.params, m.template, m.system) == (params, GO_TEMPLATE, "Be brief.")
    assert (m.family, m.file_type, m.size) == ("llama", "Q4_K_M", gguf.stat().st_size)
    assert hub_ollama.find("Qwen3:4B").path == m.path  # names match ignoring case, as Ollama's
    assert hub_ollama.find("qwen3") is None  # tag latest: not pulled
    assert hub_ollama.find("a/b/c/d") is None


def test_locate_and_load_read_only(store, tiny):
    from goinfer.model import Model

    gguf = tiny("llama")[1]
    make_store(store, "tinyllama", gguf, params={"stop": ["</s>"]}, template=GO_TEMPLATE)
    before = _tree(store)
    src = hub.locate("tinyllama")
    assert (src.kind, src.name, src.params, src.template) == (
        "ollama",
        "tinyllama:latest",
        {"stop": ["</s>"]},
        GO_TEMPLATE,
    )
    m = Model.load("tinyllama", threads=1, progress=False)
    assert m.name == "tinyllama:latest" and m.source.kind == "ollama"
    ref = Model.load(gguf, threads=1, progress=False, layout_cache=False)
    ids = [1, 4, 2, 8]
    assert np.array_equal(m.logits(ids), ref.logits(ids))
    assert hub.pull("tinyllama") == src.path  # nothing to pull: the store's file
    assert _tree(store) == before  # nothing written in the store


def test_params_and_system_are_the_models_defaults(store, tiny):
    """An Ollama model's params layer sets the sampling and stop strings a request leaves out
    (what the request gives wins); its system layer is the system message of a chat that has
    none; params goinfer does not apply are listed."""
    from goinfer.chat import prepare_chat
    from goinfer.model import Model
    from goinfer.sampling import SamplingParams

    gguf = tiny("llama")[1]
    plain = Model.load(gguf, threads=1, progress=False, layout_cache=False)
    prompt = [1, 4, 2, 8]
    greedy = plain.session().generate(prompt, max_tokens=24)
    stop = greedy.text[6:9]
    assert len(stop) == 3 and greedy.text.find(stop) == 6
    params = {"temperature": 1.5, "seed": 7, "top_k": 50, "num_ctx": 4096, "num_predict": 8}
    make_store(store, "tiny-sampled", gguf, params=params, system="Be brief.")
    make_store(store, "tiny-stop", gguf, params={"stop": [stop]})

    m = Model.load("tiny-sampled", threads=1, progress=False, layout_cache=False)
    assert m.sampling_defaults == SamplingParams(temperature=1.5, seed=7, top_k=50)
    assert m.defaults.ignored == ["num_ctx", "num_predict"] and m.defaults.stop == []
    own = m.session().generate(prompt, max_tokens=24).tokens
    explicit = SamplingParams(temperature=1.5, seed=7, top_k=50)
    assert own == plain.session().generate(prompt, explicit, max_tokens=24).tokens
    assert own != plain.session().generate(prompt, explicit, max_tokens=24, seed=8).tokens
    assert m.session().generate(prompt, max_tokens=24, seed=8).tokens != own  # keyword wins
    assert (
        m.session().generate(prompt, SamplingParams(), max_tokens=24).tokens == greedy.tokens
    )  # params given: the model's defaults do not apply

    user = [{"role": "user", "content": "hi"}]
    assert "Be brief." in prepare_chat(m, user).prompt
    assert "Be brief." not in prepare_chat(plain, user).prompt
    own_system = prepare_chat(m, [{"role": "system", "content": "Be long."}, *user]).prompt
    assert "Be long." in own_system and "Be brief." not in own_system

    m = Model.load("tiny-stop", threads=1, progress=False, layout_cache=False)
    r = m.session().generate(prompt, max_tokens=24)
    assert (r.text, r.finish_reason) == (greedy.text[:6], "stop")
    assert m.session().generate(prompt, max_tokens=24, stop=[]).text == greedy.text


def test_unusable_params_are_a_clear_error(store, tiny):
    from goinfer.model import Model

    make_store(store, "tiny-bad", tiny("llama")[1], params={"temperature": -1})
    with pytest.raises(ModelFormatError, match="tiny-bad:latest: its parameters .*temperature"):
        Model.load("tiny-bad", threads=1, progress=False, layout_cache=False)


def test_namespace_name_prefers_the_store_over_the_hub(store, tiny):
    make_store(store, "someone/tinyllama:v2", tiny("llama")[1])
    src = hub.locate("someone/tinyllama:v2")  # also an HF-shaped name: the store answers first
    assert src.kind == "ollama" and src.name == "someone/tinyllama:v2"


def test_hf_name_pulled_by_ollama(store, tiny):
    make_store(store, "hf.co/org/tiny-GGUF:F32", tiny("llama")[1])
    assert hub.locate("hf.co/org/tiny-GGUF:F32").kind == "ollama"
    assert hub.locate("org/tiny-GGUF", quant="F32").kind == "ollama"


def test_unknown_name_says_where_it_looked(store):
    with pytest.raises(ModelNotFoundError) as ei:
        hub.resolve("llama3.2")
    msg = str(ei.value)
    assert "smollm2-135m" in msg and "gemma3-270m" in msg
    assert (
        str(store / "manifests" / "registry.ollama.ai" / "library" / "llama3.2" / "latest") in msg
    )
    assert "ORG/REPO[:QUANT]" in msg


def test_broken_stores(store, tiny):
    gguf = tiny("llama")[1]
    man = make_store(store, "gone", gguf)
    blob = store / "blobs" / f"sha256-{hashlib.sha256(gguf.read_bytes()).hexdigest()}"
    blob.rename(blob.with_name("moved"))
    with pytest.raises(
        ModelNotFoundError, match=r"names the blob .*sha256-[0-9a-f]{64}, which is missing"
    ):
        hub.resolve("gone")
    blob.with_name("moved").rename(blob)
    doc = json.loads(man.read_text())
    doc["layers"][0]["size"] += 1
    man.write_text(json.dumps(doc))
    with pytest.raises(ModelFormatError, match=r"bytes, the manifest .* says"):
        hub.resolve("gone")
    make_store(store, "adapteronly", b"x", extra=[])
    m2 = store / "manifests" / "registry.ollama.ai" / "library" / "adapteronly" / "latest"
    doc = json.loads(m2.read_text())
    doc["layers"][0]["mediaType"] = T + "tensor; name=w; dtype=F16; shape=2,2"
    m2.write_text(json.dumps(doc))
    with pytest.raises(ModelNotFoundError, match=r"has no GGUF model layer .* its layers: "):
        hub.resolve("adapteronly")
    m2.write_text("{not json")
    with pytest.raises(ModelFormatError, match="not a readable Ollama manifest"):
        hub.resolve("adapteronly")
    doc = {"schemaVersion": 2, "layers": [{"mediaType": T + "model", "digest": "md5:abc"}]}
    m2.write_text(json.dumps(doc))
    with pytest.raises(ModelFormatError, match=r"not sha256:<64 hex>"):
        hub.resolve("adapteronly")


def test_list_shows_the_store(store, tiny, capsys):
    make_store(store, "qwen3:4b", tiny("llama")[1], file_type="Q4_K_M")
    make_store(store, "hf.co/o/r:Q8_0", tiny("llama")[1])
    broken = make_store(store, "broken", b"x")
    broken.write_text("{")
    ms = {m.name: m for m in hub.list_models() if m.source == "ollama"}
    assert set(ms) == {"qwen3:4b", "hf.co/o/r:Q8_0"}  # unreadable manifests left out
    assert ms["qwen3:4b"].description == "Ollama store, llama Q4_K_M" and ms["qwen3:4b"].pulled
    from goinfer import cli

    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert any(x.startswith("qwen3:4b ") and " ollama " in x for x in out.splitlines())
    assert f"Ollama store {store}" in out


def test_default_store_locations(tmp_path, monkeypatch):
    monkeypatch.delenv("OLLAMA_MODELS", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert hub_ollama.models_dirs() == [] or hub_ollama.models_dirs() == [hub_ollama._SERVICE_DIR]
    (tmp_path / ".ollama" / "models" / "manifests").mkdir(parents=True)
    assert hub_ollama.models_dirs()[0] == tmp_path / ".ollama" / "models"
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "x"))
    assert hub_ollama.models_dirs() == [tmp_path / "x"]
    shutil.rmtree(tmp_path / ".ollama")


def test_server_applies_the_models_stop_and_system(store, tiny):
    """`goinfer serve` on an Ollama model: a request without `stop` ends at the model's stop
    strings, one with its own stops does not; a request without `temperature` samples at the
    model's (0 here, where OpenAI's default is 1; one that sets it samples at its own); a chat
    without a system message gets the model's (its prompt is as long as with that system
    message given)."""
    from starlette.testclient import TestClient

    from goinfer import KVCache
    from goinfer.chat import prepare_chat
    from goinfer.model import Model
    from goinfer.server.app import create_app

    gguf = tiny("llama")[1]
    plain = Model.load(gguf, threads=1, progress=False, layout_cache=False)
    greedy = plain.session().generate("Hello", max_tokens=24).text
    stop = greedy[6:9]
    assert greedy.find(stop) == 6
    make_store(
        store, "tiny-served", gguf, params={"stop": [stop], "temperature": 0}, system="Be brief."
    )
    m = Model.load("tiny-served", threads=1, progress=False, layout_cache=False)
    body = {"model": "tiny-served", "prompt": "Hello", "max_tokens": 24}  # temperature: the model's
    with TestClient(create_app(m, KVCache(m, max_tokens=512), model_id="tiny-served")) as c:
        r = c.post("/v1/completions", json=body).json()["choices"][0]
        assert (r["text"], r["finish_reason"]) == (greedy[:6], "stop")
        r = c.post("/v1/completions", json={**body, "stop": ["\x00"]}).json()["choices"][0]
        assert r["text"] == greedy
        hot = {**body, "stop": ["\x00"], "temperature": 1.5, "seed": 3}
        assert c.post("/v1/completions", json=hot).json()["choices"][0]["text"] != greedy
        user = [{"role": "user", "content": "hi"}]

        def prompt_tokens(messages):
            chat = {"model": "tiny-served", "max_tokens": 1, "messages": messages}
            return c.post("/v1/chat/completions", json=chat).json()["usage"]["prompt_tokens"]

        brief = m.tokenize_chat(prepare_chat(m, user).prompt)
        assert (
            prompt_tokens(user)
            == len(brief)
            == prompt_tokens([{"role": "system", "content": "Be brief."}, *user])
        )
        assert prompt_tokens([{"role": "system", "content": "Hi."}, *user]) != len(brief)
