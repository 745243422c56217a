"""The import graph of goinfer/ has no cycles: each layer imports only the layers below it.
And the kernel tests run without torch: neither the suite's conftest nor their fixtures import it.

Every import counts, at module level or inside a function (an import deferred into a function
still ties the two modules together).  ``from a import b`` is an edge to ``a.b`` when that is a
module, else to ``a``; a package's ``__init__`` is not implied by importing one of its modules.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "goinfer"


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """{module: the goinfer modules it imports}, from the source of every .py under root."""
    files = {module_name(p, root): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")
                    up = up[: len(up) - (node.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names
                ]
            else:
                continue
            for t in targets:
                while t and t not in files:  # `import goinfer.x.y` names a module or a package
                    t = t.rpartition(".")[0]
                if t and t != mod:
                    edges.add(t)
        graph[mod] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def test_cycle_finder_sees_a_cycle():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(g) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_graph_reads_imports_inside_functions(tmp_path):
    pkg = tmp_path / "goinfer"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from goinfer.sub import b\n")
    (pkg / "sub" / "b.py").write_text("from .. import a\n")
    g = import_graph(pkg)
    assert g["goinfer.a"] == {"goinfer.sub.b"}
    assert g["goinfer.sub.b"] == {"goinfer.a"}
    assert cycles(g) == [["goinfer.a", "goinfer.sub.b"]]


def test_goinfer_has_no_import_cycles():
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        m = todo.pop()
        for n in graph.get(m, ()):
            if n not in seen:
                seen.add(n)
                todo.append(n)
    return seen


def test_the_session_knows_no_messages():
    """The session knows tokens, the chat layer messages: nothing the session imports, at any
    depth, is part of goinfer.chat (the chat layer imports the session, not the reverse)."""
    g = import_graph()
    below = reachable(g, "goinfer.session")
    assert {"goinfer.blocks", "goinfer.generation", "goinfer.state_track"} <= below
    assert not {m for m in below if m == "goinfer.chat" or m.startswith("goinfer.chat.")}
    assert "goinfer.session" in reachable(g, "goinfer.chat.session")


# ============================================================================ the suite's own imports


def test_kernel_tests_import_no_torch():
    """Collecting the kernel tests (conftest, their fixtures, the modules themselves) in a fresh
    interpreter leaves torch and transformers unimported."""
    tests = Path(__file__).resolve().parent
    files = sorted(p.name for p in tests.glob("test_kernels_*.py"))
    assert "test_kernels_ops.py" in files and "test_kernels_ssm.py" in files
    code = (
        "import sys, pytest\n"
        f"rc = pytest.main(['-q', '-p', 'no:cacheprovider', '--collect-only', *{files!r}])\n"
        "print('heavy imports:', sorted({'torch', 'transformers'} & set(sys.modules)))\n"
        "sys.exit(rc)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=tests, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "heavy imports: []" in r.stdout, r.stdout[-2000:]


def test_import_goinfer_loads_no_jinja_or_llguidance():
    """``import goinfer`` leaves Jinja2 and llguidance unloaded (about 5 MB of a process's
    resident memory between them); the first template rendered brings Jinja2, the first grammar
    llguidance."""
    code = (
        "import sys, goinfer\n"
        "print('at import:', sorted({'jinja2', 'llguidance'} & set(sys.modules)))\n"
        "from goinfer.chat_template import GEMMA_TEMPLATE, render_chat_template\n"
        "render_chat_template(GEMMA_TEMPLATE, [{'role': 'user', 'content': 'hi'}])\n"
        "from goinfer.constrained import schema_error\n"
        "assert schema_error('{\"type\": \"object\"}') == ''\n"
        "print('after use:', sorted({'jinja2', 'llguidance'} & set(sys.modules)))\n"
    )
    import goinfer  # the goinfer under test: installed, or an in-tree build

    env = {**os.environ, "PYTHONPATH": str(Path(goinfer.__file__).resolve().parent.parent)}
    r = subprocess.run(
        [sys.executable, "-c", code], cwd="/", env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "at import: []" in r.stdout, r.stdout
    assert "after use: ['jinja2', 'llguidance']" in r.stdout, r.stdout
