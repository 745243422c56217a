"""Hugging Face models: ``hf.co/ORG/REPO[:QUANT]``, ``ORG/REPO[:QUANT]`` and
``hf.co/ORG/REPO/FILE.gguf``, fetched with huggingface_hub into its cache.

    ref = parse("hf.co/Qwen/Qwen3-4B-GGUF:Q4_K_M")       # HFRef, or None if not an HF name
    path = resolve(ref, download=True, progress=True)     # the GGUF (first part of a split one)
    for m in list_cached(): print(m.name, m.path)

Which file: a repo holds one GGUF per quantization (``Qwen3-4B-Q4_K_M.gguf``, a split one as
``...-Q4_K_M-00001-of-00002.gguf``...); the quantization tag ends the file name.  A tag asked
for picks the file whose tag it is (case-insensitive; else whose name holds it between
separators, as ``UD-Q4_K_XL``); no tag picks Q4_K_M, else the closest type goinfer runs (4 bits
first, then 5, 6, 8, 3, 2, 16, 32; within one width _K_M, _K_S, _0, the rest).  Projector and
importance-matrix files are not models.  No match, or two models for one tag, is a
ModelNotFoundError listing what the repo has.

Where: the Hugging Face cache (``HF_HUB_CACHE``, else ``HF_HOME``/hub, else
~/.cache/huggingface/hub), shared with every tool that uses huggingface_hub; ``HF_ENDPOINT``
names the hub, ``HF_TOKEN`` (or ``hf auth login``) authenticates.  The hub's listing gives each
file's LFS sha256; every file is checked against it after the download (and once, on first use,
if another tool put it in the cache), and a file that does not match is removed from the cache.
huggingface_hub resumes a broken connection with a range request.  With ``HF_HUB_OFFLINE=1`` no
request is made: the name resolves among the files already cached.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

from goinfer import gguf_split
from goinfer.errors import DownloadError, ModelNotFoundError, UnsupportedTensorTypeError
from goinfer.paths import goinfer_home

__all__ = [
    "HFRef",
    "RepoFile",
    "Candidate",
    "CachedModel",
    "parse",
    "is_explicit",
    "endpoint",
    "cache_dir",
    "offline",
    "quant_tag",
    "candidates",
    "choose",
    "resolve",
    "list_cached",
    "DEFAULT_QUANT",
]

DEFAULT_QUANT = "Q4_K_M"
DEFAULT_ENDPOINT = "https://huggingface.co"
_HOSTS = ("hf.co/", "huggingface.co/")
_ID = r"[A-Za-z0-9_][A-Za-z0-9._-]*"
_NAME_RE = re.compile(rf"^(?P<repo>{_ID}/{_ID})(?::(?P<quant>[A-Za-z0-9._-]+))?$")
_FILE_RE = re.compile(rf"^(?P<repo>{_ID}/{_ID})/(?P<file>[^:]+\.gguf)$", re.IGNORECASE)
_TAG_RE = re.compile(
    r"(?:^|[-._])((?:UD-)?(?:I?Q\d(?:_[A-Z0-9]+)*|TQ\d_\d|BF16|F16|F32|MXFP4(?:_MOE)?))$",
    re.IGNORECASE,
)
_NOT_MODELS = ("mmproj", "imatrix")
_HTTP_MODULES = ("httpx", "httpx2", "httpcore", "requests", "urllib3")  # huggingface_hub's clients
_CHUNK = 1 << 22


# ============================================================================ names


@dataclass(frozen=True)
class HFRef:
    repo: str  # "ORG/REPO"
    quant: str | None = None  # "Q4_K_M" as written
    filename: str | None = None  # a file of the repo ("dir/x-Q4_K_M.gguf")
    revision: str = "main"

    def __str__(self) -> str:
        if self.filename:
            return f"hf.co/{self.repo}/{self.filename}"
        return f"hf.co/{self.repo}" + (f":{self.quant}" if self.quant else "")


def _strip_scheme(s: str) -> str:
    for scheme in ("https://", "http://"):
        s = s.removeprefix(scheme)
    return s


def is_explicit(name: str) -> bool:
    """Does the name say it is a Hugging Face one (hf.co/..., huggingface.co/...)?"""
    return _strip_scheme(name.strip()).startswith(_HOSTS)


def parse(name: str, quant: str | None = None) -> HFRef | None:
    """An HF name -> HFRef; None if the string is not one.  ``hf.co/`` (or ``huggingface.co/``,
    with or without https://) may prefix ``ORG/REPO[:QUANT]`` and must prefix a file path."""
    s = _strip_scheme(name.strip())
    host = next((h for h in _HOSTS if s.startswith(h)), None)
    if host:
        s = s[len(host) :]
        m = _FILE_RE.match(s)
        if m and ".." not in m["file"].split("/"):
            if quant:
                raise ModelNotFoundError(f"{name}: a file is named, quant={quant!r} cannot apply")
            return HFRef(m["repo"], None, m["file"])
    m = _NAME_RE.match(s)
    if m is None or "--" in m["repo"] or ".." in m["repo"]:
        return None
    q = m["quant"]
    if q and quant and q.upper() != quant.upper():
        raise ModelNotFoundError(f"{name}: names quantization {q}, but quant={quant!r}")
    return HFRef(m["repo"], q or quant)


# ============================================================================ settings (read per call)


def _true(v: str | None) -> bool:
    return (v or "").strip().upper() in ("1", "ON", "YES", "TRUE")


def offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) set: no request is made."""
    return _true(os.environ.get("HF_HUB_OFFLINE")) or _true(os.environ.get("TRANSFORMERS_OFFLINE"))


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def cache_dir() -> Path:
    """HF_HUB_CACHE, else HUGGINGFACE_HUB_CACHE, else HF_HOME/hub, else
    $XDG_CACHE_HOME/huggingface/hub (~/.cache/huggingface/hub): where huggingface_hub keeps files."""
    d = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if d:
        return Path(os.path.expandvars(d)).expanduser()
    home = os.environ.get("HF_HOME")
    if not home:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
        home = os.path.join(xdg, "huggingface")
    return Path(os.path.expandvars(home)).expanduser() / "hub"


def _repo_dir(repo: str) -> Path:
    return cache_dir() / ("models--" + repo.replace("/", "--"))


# ============================================================================ choosing the file


@dataclass(frozen=True)
class RepoFile:
    path: str  # in the repo
    size: int | None = None
    sha256: str | None = None  # LFS sha256 (what the file's bytes hash to)
    blob_id: str | None = None  # git blob sha1 (files stored in git, not LFS)


def quant_tag(path: str) -> str:
    """The quantization tag that ends a GGUF file name ("Q4_K_M", "UD-Q4_K_XL", "F16"), or ""."""
    stem = gguf_split.model_stem(path.rsplit("/", 1)[-1])
    m = _TAG_RE.search(stem)
    return m[1].upper() if m else ""


def _base_type(tag: str) -> str | None:
    """The GGUF type a tag's weights mostly are ("Q4_K_M" -> "Q4_K"), None if unknown."""
    t = tag.upper().removeprefix("UD-")
    if m := re.fullmatch(r"Q(\d)_K(?:_[A-Z]+)?", t):
        return f"Q{m[1]}_K"
    if re.fullmatch(r"Q\d_[01]|BF16|F16|F32", t):
        return t
    if t.startswith("MXFP4"):
        return "MXFP4"
    return None if re.fullmatch(r"I?Q\d.*|TQ\d_\d", t) is None else t


def _runnable(tag: str) -> bool | None:
    """Can goinfer run a file with this tag?  None: the tag says nothing."""
    from goinfer.gguf import NATIVE_TARGET

    if not tag:
        return None
    return _base_type(tag) in NATIVE_TARGET


def _rank(tag: str) -> tuple:
    """Closeness to Q4_K_M among types goinfer runs (smaller is closer)."""
    base = _base_type(tag)
    if not tag or base is None:
        return (99,)
    bits = {"BF16": 16, "F16": 16, "F32": 32, "MXFP4": 4}.get(base) or int(
        re.search(r"\d", base)[0]
    )
    suffix = tag.upper().removeprefix("UD-")[len(base) :].lstrip("_")
    order = {"M": 0, "S": 1, "": 2, "L": 3, "XL": 3}
    return (abs(bits - 4), -bits, order.get(suffix, 4), tag)


@dataclass(frozen=True)
class Candidate:
    """One model in a repo: a GGUF file, or every part of a split one (in part order)."""

    files: tuple[RepoFile, ...]
    tag: str
    count: int  # parts the name announces (1: not split)

    @property
    def path(self) -> str:
        return self.files[0].path

    @property
    def complete(self) -> bool:
        return len(self.files) == self.count

    @property
    def size(self) -> int:
        return sum(f.size or 0 for f in self.files)

    def label(self) -> str:
        parts = f" ({self.count} parts)" if self.count > 1 else ""
        return f"{self.path}{parts}"


def candidates(files: list[RepoFile]) -> list[Candidate]:
    """The models among a repo's files (GGUFs, split parts grouped, projectors left out)."""
    groups: dict[tuple[str, int], dict[int, RepoFile]] = {}
    for f in files:
        base = f.path.rsplit("/", 1)[-1]
        if not base.lower().endswith(".gguf") or any(w in base.lower() for w in _NOT_MODELS):
            continue
        parsed = gguf_split.parse_part_name(base)
        d = f.path[: len(f.path) - len(base)]
        if parsed is None:
            groups[(f.path, 1)] = {1: f}
        else:
            groups.setdefault((d + parsed[0], parsed[2]), {})[parsed[1]] = f
    out = []
    for (_key, count), parts in groups.items():
        ordered = tuple(parts[i] for i in sorted(parts))
        out.append(Candidate(ordered, quant_tag(ordered[0].path), count))
    return sorted(out, key=lambda c: c.path)


def _listing(cands: list[Candidate]) -> str:
    return "; ".join(f"{c.tag or '?'}: {c.label()}" for c in cands) or "no GGUF model files"


def choose(cands: list[Candidate], ref: HFRef, where: str) -> Candidate:
    """The model a reference names among a repo's candidates (``where`` says which listing)."""
    if not cands:
        raise ModelNotFoundError(f"{ref}: {where} has no GGUF model file")
    if ref.filename:
        want = ref.filename.lower()
        hits = [c for c in cands if any(f.path.lower() == want for f in c.files)]
        if not hits:
            raise ModelNotFoundError(
                f"{ref}: {where} has no file {ref.filename}; its models: {_listing(cands)}"
            )
        return hits[0]
    if ref.quant:
        want = ref.quant.upper()
        hits = [c for c in cands if c.tag == want]
        if not hits:
            pat = re.compile(rf"(?:^|[-._/]){re.escape(want)}(?:[-._/]|$)", re.IGNORECASE)
            hits = [c for c in cands if pat.search(c.path)]
        if not hits:
            raise ModelNotFoundError(
                f"{ref}: {where} has no {ref.quant} file; its models: {_listing(cands)}"
            )
        best = hits
    else:
        best = [c for c in cands if c.tag == DEFAULT_QUANT]
        if not best:
            usable = [c for c in cands if _runnable(c.tag) is not False]
            if not usable:
                raise UnsupportedTensorTypeError(
                    f"{ref}: goinfer runs none of the quantizations in {where} "
                    f"({_listing(cands)}); see docs/models.md for the types it runs"
                )
            top = min(_rank(c.tag) for c in usable)
            best = [c for c in usable if _rank(c.tag) == top]
    if len(best) > 1:
        raise ModelNotFoundError(
            f"{ref}: {len(best)} models in {where} match: "
            f"{'; '.join(c.label() for c in best)}; name one as "
            f"hf.co/{ref.repo}/FILE"
        )
    c = best[0]
    if _runnable(c.tag) is False:
        raise UnsupportedTensorTypeError(
            f"{ref}: {c.path} is {c.tag}, a type goinfer cannot run (docs/models.md); "
            f"{where} has: {_listing(cands)}"
        )
    return c


# ============================================================================ the cache


def _cached(repo: str, revision: str) -> tuple[str | None, list[RepoFile], dict[str, Path]]:
    """(commit, files, repo path -> local path) of the snapshot ``revision`` points to in the
    cache (else the newest snapshot); nothing if the repo is not cached."""
    d = _repo_dir(repo)
    commit = None
    ref = d / "refs" / revision
    if ref.is_file():
        commit = ref.read_text().strip()
    elif (d / "snapshots" / revision).is_dir():
        commit = revision
    elif (d / "snapshots").is_dir():
        snaps = sorted(
            (p for p in (d / "snapshots").iterdir() if p.is_dir()),
            key=lambda p: p.stat().st_mtime,
            reverse=True,
        )
        commit = snaps[0].name if snaps else None
    if not commit or not (d / "snapshots" / commit).is_dir():
        return None, [], {}
    snap = d / "snapshots" / commit
    files, local = [], {}
    for p in sorted(snap.rglob("*")):
        if p.is_dir() or not p.exists():  # a dangling link: the blob is gone
            continue
        rel = p.relative_to(snap).as_posix()
        blob = Path(os.path.realpath(p)).name
        files.append(
            RepoFile(
                rel,
                p.stat().st_size,
                blob if re.fullmatch(r"[0-9a-f]{64}", blob) else None,
                blob if re.fullmatch(r"[0-9a-f]{40}", blob) else None,
            )
        )
        local[rel] = p
    return commit, files, local


def _from_cache(ref: HFRef, *, strict: bool) -> tuple[Candidate, dict[str, Path]] | None:
    """The cached model ``ref`` names.  strict: only a file with exactly the asked tag (or
    Q4_K_M when none is asked), and nothing on ambiguity; else ``choose``'s rules, raising."""
    _commit, files, local = _cached(ref.repo, ref.revision)
    cands = [c for c in candidates(files) if c.complete]
    if strict:
        if ref.filename:
            want = ref.filename.lower()
            hits = [c for c in cands if any(f.path.lower() == want for f in c.files)]
        else:
            want = ref.quant.upper() if ref.quant else DEFAULT_QUANT
            hits = [c for c in cands if c.tag == want]
        return (hits[0], local) if len(hits) == 1 else None
    if not cands:
        return None
    return choose(cands, ref, f"the Hugging Face cache ({_repo_dir(ref.repo)})"), local


def _write_ref(repo: str, revision: str, commit: str) -> None:
    """refs/<revision> -> commit, as huggingface_hub records which snapshot a branch is at."""
    ref = _repo_dir(repo) / "refs" / revision
    if ref.is_file() and ref.read_text().strip() == commit:
        return
    ref.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".ref-", dir=ref.parent)
    with os.fdopen(fd, "w") as fh:
        fh.write(commit)
    os.replace(tmp, ref)


# ============================================================================ checksums


def _stamp_path(digest: str) -> Path:
    return goinfer_home() / "verified" / f"{digest}.json"


def _stat_key(p: Path) -> dict:
    st = os.stat(p)
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino, "dev": st.st_dev}


def _verify(local: Path, f: RepoFile, progress: bool) -> None:
    """Check a cached file against the hub's checksum (LFS sha256, else git blob sha1), once:
    a stamp under GOINFER_HOME/verified records the file it was checked as.  A mismatch removes
    the file from the cache and raises DownloadError."""
    digest, kind = (f.sha256, "sha256") if f.sha256 else (f.blob_id, "git-sha1")
    if not digest:
        return  # the cache keeps no checksum for it (a copy, not a link to a named blob)
    real = Path(os.path.realpath(local))
    stamp = _stamp_path(digest)
    key = _stat_key(real)
    with contextlib.suppress(OSError, ValueError):
        if json.loads(stamp.read_text()) == key:
            return
    if f.size is not None and key["size"] != f.size:
        got = f"{key['size']} bytes, the hub lists {f.size}"
    else:
        h = hashlib.sha256() if kind == "sha256" else hashlib.sha1(b"blob %d\0" % key["size"])
        from tqdm.auto import tqdm

        with (
            open(real, "rb") as fh,
            tqdm(
                total=key["size"],
                unit="B",
                unit_scale=True,
                desc=f"checking {f.path.rsplit('/', 1)[-1]}",
                leave=False,
                disable=None if progress else True,
            ) as bar,
        ):
            while chunk := fh.read(_CHUNK):
                h.update(chunk)
                bar.update(len(chunk))
        if h.hexdigest() == digest:
            stamp.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".stamp-", dir=stamp.parent)
            with os.fdopen(fd, "w") as out:
                json.dump(key, out)
            os.replace(tmp, stamp)
            return
        got = f"{kind} {h.hexdigest()}, the hub lists {digest}"
    for p in {real, Path(local)}:  # the blob, and the snapshot's link to it
        with contextlib.suppress(OSError):
            p.unlink()
    raise DownloadError(
        f"{f.path}: the downloaded file has {got}; it was removed from the "
        f"cache ({real.parent}), pull again"
    )


# ============================================================================ the hub


@contextlib.contextmanager
def _hub_errors(ref: HFRef):
    """huggingface_hub's exceptions -> goinfer's."""
    from huggingface_hub.utils import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        yield
    except GatedRepoError as e:
        raise DownloadError(
            f"{ref}: {ref.repo} is gated: accept its terms on the hub and set "
            f"HF_TOKEN ({_first_line(e)})"
        ) from None
    except RepositoryNotFoundError:
        raise ModelNotFoundError(
            f"{ref}: no model repo {ref.repo} at {endpoint()} (a private one needs HF_TOKEN)"
        ) from None
    except RevisionNotFoundError:
        raise ModelNotFoundError(f"{ref}: {ref.repo} has no revision {ref.revision!r}") from None
    except EntryNotFoundError as e:
        raise ModelNotFoundError(f"{ref}: {_first_line(e)}") from None
    except OfflineModeIsEnabled:
        raise ModelNotFoundError(f"{ref}: huggingface_hub is in offline mode") from None
    except HfHubHTTPError as e:
        raise DownloadError(f"{ref}: {endpoint()} answered: {_first_line(e)}") from None
    except (OSError, ValueError) as e:  # connection, consistency check, disk
        raise DownloadError(f"{ref}: {type(e).__name__}: {_first_line(e)}") from None
    except Exception as e:  # the HTTP client's transport errors (not OSError subclasses)
        if type(e).__module__.split(".")[0] not in _HTTP_MODULES:
            raise
        raise DownloadError(
            f"{ref}: cannot reach {endpoint()}: {type(e).__name__}: {_first_line(e)}"
        ) from None


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


@contextlib.contextmanager
def _bars(progress: bool):
    """huggingface_hub's download bars off when not progress (restored after)."""
    if progress:
        yield
        return
    from huggingface_hub.utils import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )

    was = are_progress_bars_disabled()
    disable_progress_bars()
    try:
        yield
    finally:
        if not was:
            enable_progress_bars()


def _list_repo(ref: HFRef) -> tuple[str, list[RepoFile]]:
    """(commit, files) of the repo at ref.revision, from the hub (one request)."""
    from huggingface_hub import HfApi

    with _hub_errors(ref):
        info = HfApi(endpoint=endpoint()).model_info(
            ref.repo, revision=ref.revision, files_metadata=True
        )
    files = [
        RepoFile(s.rfilename, s.size, s.lfs.sha256 if s.lfs else None, s.blob_id)
        for s in info.siblings or []
    ]
    if not info.sha:
        raise DownloadError(f"{ref}: {endpoint()} gave no commit for {ref.repo}")
    return info.sha, files


def _download(ref: HFRef, commit: str, cand: Candidate, *, force: bool, progress: bool) -> Path:
    from huggingface_hub import hf_hub_download

    if not cand.complete:
        have = ", ".join(f.path for f in cand.files)
        raise ModelNotFoundError(
            f"{ref}: {cand.path} is one of {cand.count} parts, the repo lists only {have}"
        )
    paths = []
    for f in cand.files:
        with _hub_errors(ref), _bars(progress):
            p = hf_hub_download(
                ref.repo,
                f.path,
                revision=commit,
                cache_dir=str(cache_dir()),
                endpoint=endpoint(),
                force_download=force,
            )
        _verify(Path(p), f, progress)
        paths.append(Path(p))
    if ref.revision != commit:
        _write_ref(ref.repo, ref.revision, commit)
    return paths[0]


def _check_local(cand: Candidate, local: dict[str, Path], progress: bool) -> Path:
    for f in cand.files:
        _verify(local[f.path], f, progress)
    return local[cand.path]


def resolve(
    ref: HFRef,
    *,
    download: bool = True,
    progress: bool = True,
    refresh: bool = False,
    force: bool = False,
) -> Path:
    """The local path of the GGUF ``ref`` names (the first part of a split model).

    A file with the asked tag already cached is used without a request, unless refresh (what
    ``pull`` does: ask the hub for its current files); force downloads again.  Offline
    (HF_HUB_OFFLINE): the choice is made among the cached files.  A hub that cannot be reached
    falls back to the cache with a warning."""
    if not (refresh or force) and (hit := _from_cache(ref, strict=True)):
        return _check_local(hit[0], hit[1], progress)
    if offline():
        if force:
            raise DownloadError(f"{ref}: cannot download again in offline mode (HF_HUB_OFFLINE)")
        hit = _from_cache(ref, strict=False)
        if hit is None:
            raise ModelNotFoundError(
                f"{ref}: offline (HF_HUB_OFFLINE) and {ref.repo} is not in "
                f"the Hugging Face cache ({cache_dir()})"
            )
        return _check_local(hit[0], hit[1], progress)
    if not download:
        raise ModelNotFoundError(
            f"{ref} is not in the Hugging Face cache ({cache_dir()}); run `goinfer pull {ref}`"
        )
    try:
        commit, files = _list_repo(ref)
    except DownloadError as e:
        hit = None if force else _from_cache(ref, strict=False)
        if hit is None:
            raise
        warnings.warn(f"goinfer: {e}; using the cached {hit[0].path}", stacklevel=3)
        return _check_local(hit[0], hit[1], progress)
    cand = choose(candidates(files), ref, f"{ref.repo} at {endpoint()}")
    return _download(ref, commit, cand, force=force, progress=progress)


# ============================================================================ listing


@dataclass(frozen=True)
class CachedModel:
    name: str  # "hf.co/ORG/REPO:Q4_K_M"
    path: Path
    size: int


def list_cached() -> list[CachedModel]:
    """The GGUF models in the Hugging Face cache (the snapshot main points to, else the newest)."""
    root = cache_dir()
    out = []
    if not root.is_dir():
        return out
    for d in sorted(root.glob("models--*--*")):
        repo = d.name[len("models--") :].replace("--", "/", 1)
        _commit, files, local = _cached(repo, "main")
        cands = [c for c in candidates(files) if c.complete]
        tags = [c.tag for c in cands]
        for c in cands:
            unique = c.tag and tags.count(c.tag) == 1
            name = f"hf.co/{repo}:{c.tag}" if unique else f"hf.co/{repo}/{c.path}"
            out.append(CachedModel(name, local[c.path], c.size))
    return out
