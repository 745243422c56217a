"""Models pulled with Ollama, read in place (never written): ``llama3.2``, ``qwen3:4b``,
``user/model:tag``, ``hf.co/ORG/REPO:QUANT``.

    m = find("qwen3:4b")       # OllamaModel (the GGUF blob, its parameters), or None
    for m in list_models(): print(m.name, m.path)

The store (``OLLAMA_MODELS``, else ~/.ollama/models; the Linux service's
/usr/share/ollama/.ollama/models is looked at too) holds ``manifests/<host>/<namespace>/<model>/<tag>``,
one JSON manifest per name, and ``blobs/sha256-<hex>``, one file per layer.  A name is
``[host/][namespace/]model[:tag]`` with host registry.ollama.ai, namespace library and tag
latest when left out.  The manifest (schemaVersion 2) lists its layers by mediaType and digest:
``application/vnd.ollama.image.model`` is the GGUF; ``...image.params`` a JSON object of
parameters (stop, temperature, num_ctx, ...); ``...image.template`` a chat template in Go's
template language, ``...image.system`` a system message; its ``config`` blob says the model's
family and file type (the quantization).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from goinfer.errors import ModelFormatError, ModelNotFoundError

__all__ = ["OllamaName", "OllamaModel", "parse", "models_dirs", "find", "where", "list_models"]

DEFAULT_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"
MODEL = "application/vnd.ollama.image.model"
PARAMS = "application/vnd.ollama.image.params"
TEMPLATE = ("application/vnd.ollama.image.template", "application/vnd.ollama.image.prompt")
SYSTEM = "application/vnd.ollama.image.system"
_SERVICE_DIR = Path("/usr/share/ollama/.ollama/models")

_HOST_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._:-]*")
_NS_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")
_PART_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
_DIGEST_RE = re.compile(r"sha256[:-]([0-9a-fA-F]{64})")


@dataclass(frozen=True)
class OllamaName:
    host: str
    namespace: str
    model: str
    tag: str

    def parts(self) -> tuple[str, str, str, str]:
        return (self.host, self.namespace, self.model, self.tag)

    def __str__(self) -> str:
        """Ollama's shortest form: ``model:tag``, ``namespace/model:tag`` or the whole name."""
        if self.host.lower() != DEFAULT_HOST:
            return f"{self.host}/{self.namespace}/{self.model}:{self.tag}"
        if self.namespace.lower() != DEFAULT_NAMESPACE:
            return f"{self.namespace}/{self.model}:{self.tag}"
        return f"{self.model}:{self.tag}"


def parse(name: str) -> OllamaName | None:
    """``[host/][namespace/]model[:tag]`` -> OllamaName with the defaults filled; None if the
    string cannot be an Ollama name."""
    s = name.strip()
    for scheme in ("https://", "http://"):
        s = s.removeprefix(scheme)
    tag = DEFAULT_TAG
    if s.rfind(":") > s.rfind("/"):
        s, tag = s.rsplit(":", 1)
    parts = s.split("/")
    if not 1 <= len(parts) <= 3:
        return None
    host, ns = DEFAULT_HOST, DEFAULT_NAMESPACE
    if len(parts) == 3:
        host, ns, model = parts
    elif len(parts) == 2:
        ns, model = parts
    else:
        (model,) = parts
    ok = (
        _HOST_RE.fullmatch(host)
        and _NS_RE.fullmatch(ns)
        and _PART_RE.fullmatch(model)
        and _PART_RE.fullmatch(tag)
    )
    return OllamaName(host, ns, model, tag) if ok else None


def models_dirs() -> list[Path]:
    """OLLAMA_MODELS if set, else ~/.ollama/models and the Linux service's store (the existing ones)."""
    env = os.environ.get("OLLAMA_MODELS")
    if env:
        return [Path(env).expanduser()]
    dirs = [Path("~/.ollama/models").expanduser(), _SERVICE_DIR]
    return [d for d in dirs if (d / "manifests").is_dir()]


@dataclass(frozen=True)
class OllamaModel:
    name: str  # Ollama's shortest form ("llama3.2:latest")
    path: Path  # the GGUF blob
    size: int
    manifest: Path
    params: dict = field(default_factory=dict)  # the params layer (stop, temperature, ...)
    template: str | None = None  # the template layer (Go template syntax)
    system: str | None = None  # the system layer
    family: str | None = None  # from the config blob
    file_type: str | None = None  # the quantization, from the config blob ("Q4_K_M")


def _manifest_path(root: Path, n: OllamaName) -> Path | None:
    """The manifest of a name: the exact path, else one whose parts match ignoring case."""
    exact = root / "manifests" / Path(*n.parts())
    if exact.is_file():
        return exact
    d = root / "manifests"
    for part in n.parts():
        if not d.is_dir():
            return None
        match = [p for p in d.iterdir() if p.name.lower() == part.lower()]
        if not match:
            return None
        d = match[0]
    return d if d.is_file() else None


def _blob(root: Path, digest: object, manifest: Path) -> Path:
    m = _DIGEST_RE.fullmatch(digest) if isinstance(digest, str) else None
    if m is None:
        raise ModelFormatError(f"{manifest}: a layer has digest {digest!r}, not sha256:<64 hex>")
    return root / "blobs" / f"sha256-{m[1].lower()}"


def _read(root: Path, manifest: Path, name: OllamaName) -> OllamaModel:
    try:
        doc = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ModelFormatError(f"{manifest}: not a readable Ollama manifest: {e}") from None
    layers = doc.get("layers") if isinstance(doc, dict) else None
    if not isinstance(layers, list) or not all(isinstance(x, dict) for x in layers):
        raise ModelFormatError(f"{manifest}: an Ollama manifest needs a list of layers")
    by_type: dict[str, dict] = {}
    for layer in layers:
        by_type.setdefault(str(layer.get("mediaType", "")).split(";")[0].strip(), layer)
    model = by_type.get(MODEL)
    if model is None:
        kinds = ", ".join(sorted(by_type)) or "none"
        raise ModelNotFoundError(
            f"{name} in the Ollama store ({manifest}) has no GGUF model "
            f"layer ({MODEL}); its layers: {kinds}"
        )
    path = _blob(root, model.get("digest"), manifest)
    if not path.is_file():
        raise ModelNotFoundError(
            f"{name}: the Ollama store's manifest {manifest} names the "
            f"blob {path}, which is missing"
        )
    size = path.stat().st_size
    if isinstance(model.get("size"), int) and model["size"] != size:
        raise ModelFormatError(
            f"{path}: {size} bytes, the manifest {manifest} says {model['size']}"
        )

    def text(layer: dict | None) -> str | None:
        if layer is None:
            return None
        try:
            return _blob(root, layer.get("digest"), manifest).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None

    params = {}
    if (raw := text(by_type.get(PARAMS))) is not None:
        try:
            params = json.loads(raw)
        except ValueError:
            raise ModelFormatError(f"{manifest}: its params layer is not JSON") from None
        if not isinstance(params, dict):
            raise ModelFormatError(f"{manifest}: its params layer is not a JSON object")
    template = next((t for mt in TEMPLATE if (t := text(by_type.get(mt))) is not None), None)
    config = {}
    cfg = doc.get("config")
    if isinstance(cfg, dict) and cfg.get("digest"):
        try:
            config = json.loads(text(cfg) or "{}")
        except ValueError:
            config = {}
    config = config if isinstance(config, dict) else {}
    return OllamaModel(
        str(name),
        path,
        size,
        manifest,
        params,
        template,
        text(by_type.get(SYSTEM)),
        config.get("model_family"),
        config.get("file_type"),
    )


def find(name: str) -> OllamaModel | None:
    """The model an Ollama name refers to, if a store has its manifest (else None)."""
    n = parse(name)
    if n is None:
        return None
    for root in models_dirs():
        manifest = _manifest_path(root, n)
        if manifest is not None:
            return _read(root, manifest, n)
    return None


def where(name: str) -> str:
    """Where find() looked for a name's manifest (for error messages)."""
    n = parse(name)
    roots = models_dirs() or [Path("~/.ollama/models").expanduser()]
    if n is None:
        return "not an Ollama name"
    return " or ".join(str(r / "manifests" / Path(*n.parts())) for r in roots)


def list_models() -> list[OllamaModel]:
    """Every GGUF model in the stores (manifests that cannot be read are left out)."""
    out = []
    for root in models_dirs():
        base = root / "manifests"
        for manifest in sorted(base.glob("*/*/*/*")):
            if not manifest.is_file():
                continue
            n = OllamaName(*manifest.relative_to(base).parts)
            try:
                out.append(_read(root, manifest, n))
            except (ModelFormatError, ModelNotFoundError):
                continue
    return out
