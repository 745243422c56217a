"""The docs name only what exists: every file path in README.md, CONTRIBUTING.md and docs/**/*.md
is a file (or directory) of the repository, every relative link resolves, and every section a
doc cites by its title ("Layout cache" in `docs/design/gguf.md`) is a heading of that doc.

What counts as a path:
  * a token inside `backticks` that ends in a source or doc extension (`goinfer/graph.py`,
    `src/attention_impl.c`, `test_graph.py`); a partial or bare one must be the tail of a file
    of the repository (`src/ssm.h` is goinfer/_kernels/src/ssm.h); `<name>`, `NAME` and `*`
    stand for any part (`goinfer/models/<family>.py`, `tests/test_kernels_*.py`);
  * a path in prose that starts at a top-level directory (goinfer/, tests/, benchmarks/, docs/,
    examples/, tools/, .github/, .ci/): it must exist from the repository's root;
  * the target of a markdown link [text](target) that is not a URL, from the doc's directory.
Fenced code blocks are not read (they hold commands and the user's own file names).
"""

from __future__ import annotations

import fnmatch
import os
import re
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").rglob("*.md")])
SKIP_DIRS = {".git", "build", "dist", "__pycache__", ".hypothesis", ".pytest_cache"}
EXT = r"(?:py|pyx|pxd|c|h|md|json|jinja|toml|yml|ipynb)"
TOP = ("goinfer/", "tests/", "benchmarks/", "docs/", "examples/", "tools/", ".github/", ".ci/")

# Files of other projects that the docs name (llama.cpp's converter and its chat templates):
# not in this repository by design.
ELSEWHERE = {
    "convert_hf_to_gguf.py",
    "models/templates/Qwen3.5-4B.jinja",
    "openai-gpt-oss-120b.jinja",
    "google-gemma-4-31B-it.jinja",
}
# Documents another change adds (the agents guide); each entry goes once its file is here.
PENDING = {"docs/agents.md"}


@lru_cache(maxsize=1)
def repo_files() -> tuple[str, ...]:
    """Every file and directory under the root, as POSIX paths relative to it."""
    out = []
    for d, dirs, files in os.walk(ROOT):
        dirs[:] = [x for x in dirs if x not in SKIP_DIRS and not x.startswith(".venv")]
        rel = Path(d).relative_to(ROOT).as_posix()
        base = "" if rel == "." else rel + "/"
        out += [base + x for x in dirs] + [base + f for f in files]
    return tuple(out)


PLACEHOLDERS = ("NAME", "FILE", "PATH", "MODEL", "DIR")  # as in `benchmarks/NAME.py`


def _pattern(token: str) -> str:
    """A token as an fnmatch pattern: <name>, a placeholder word and * stand for any part."""
    p = re.sub(r"<[^>/]*>", "*", token)
    alt = "|".join(PLACEHOLDERS)
    return re.sub(rf"(?<![A-Za-z0-9_])(?:{alt})(?![A-Za-z0-9_])", "*", p)


def exists_from_root(token: str) -> bool:
    token = token.rstrip("/")
    return any(fnmatch.fnmatchcase(f, _pattern(token)) for f in repo_files())


def exists_as_tail(token: str) -> bool:
    pat = _pattern(token.rstrip("/"))
    return any(
        fnmatch.fnmatchcase(f, pat) or fnmatch.fnmatchcase(f, "*/" + pat) for f in repo_files()
    )


def prose(path: Path) -> str:
    """The doc's text without its fenced code blocks."""
    return re.sub(r"^```.*?^```[^\n]*$", "", path.read_text(), flags=re.S | re.M)


def backticked_paths(text: str) -> list[str]:
    out = []
    for span in re.findall(r"`([^`\n]+)`", text):
        for tok in span.split():
            tok = tok.strip(",;:()[]'\"")
            if re.fullmatch(rf"[\w.<>*/+-]+\.{EXT}", tok) and not tok.startswith(("http", "-")):
                out.append(tok)
    return out


def prose_paths(text: str) -> list[str]:
    text = re.sub(r"`[^`\n]+`", " ", text)  # backticked spans are checked above
    text = re.sub(r"\]\([^)]*\)", "]", text)  # so are link targets
    alt = "|".join(re.escape(t) for t in TOP)
    pat = rf"(?<![\w/.<>-])((?:{alt})[\w.<>*/-]*[\w*>/])"
    return [m.rstrip(".") for m in re.findall(pat, text)]


def links(text: str) -> list[str]:
    return [
        t.split("#")[0]
        for t in re.findall(r"\]\(([^)\s]+)\)", text)
        if not re.match(r"[a-z]+:", t) and not t.startswith("#")
    ]


def headings(doc: Path) -> set[str]:
    return {_plain(m) for m in re.findall(r"^#+\s+(.*?)\s*$", doc.read_text(), flags=re.M)}


def _plain(s: str) -> str:
    return " ".join(s.replace("`", "").split())


def cited_sections(text: str) -> list[tuple[str, str]]:
    """(doc, title) for each `doc.md`, "Title" and "Title" in `doc.md` of the text."""
    flat = " ".join(text.split())
    doc = r"`?([\w./-]+\.md)`?"
    out = re.findall(doc + r",? \(?\"([^\"]+)\"", flat)
    out += [(d, t) for t, d in re.findall(r"\"([^\"]+)\" (?:in|of) " + doc, flat)]
    return out


def _resolve_doc(name: str) -> Path | None:
    hits = [f for f in repo_files() if f == name or f.endswith("/" + name)]
    return ROOT / hits[0] if len(hits) == 1 else None


def _rel(doc: Path) -> str:
    return doc.relative_to(ROOT).as_posix()


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_every_named_file_exists(doc):
    text = prose(doc)
    missing = [
        t for t in backticked_paths(text) if t not in ELSEWHERE | PENDING and not exists_as_tail(t)
    ]
    missing += [t for t in prose_paths(text) if t not in PENDING and not exists_from_root(t)]
    for t in links(text):
        target = (doc.parent / t).resolve()
        if target.relative_to(ROOT).as_posix() not in PENDING and not target.exists():
            missing.append(t)
    assert not missing, f"{_rel(doc)} names files that do not exist: {sorted(set(missing))}"


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_every_cited_section_exists(doc):
    bad = []
    for name, title in cited_sections(prose(doc)):
        target = _resolve_doc(name)
        if target is None and name.endswith(".md") and (doc.parent / name).exists():
            target = doc.parent / name
        if target is None or _plain(title) not in headings(target):
            bad.append(f"{name}: {title!r}")
    assert not bad, f"{_rel(doc)} cites sections that do not exist: {bad}"


# ============================================================================ the checker itself


def test_the_checker_finds_what_is_missing():
    text = (
        "See `goinfer/graph.py`, `src/attention_impl.c`, `tests/test_kernels_*.py`, "
        "`goinfer/models/<family>.py` and goinfer/nothing_here.py, `no_such_file.py`, "
        '`docs/design/kernels.md`, "Exact contracts" and "No such section" in '
        "`docs/design/kernels.md`."
    )
    assert backticked_paths(text) == [
        "goinfer/graph.py",
        "src/attention_impl.c",
        "tests/test_kernels_*.py",
        "goinfer/models/<family>.py",
        "no_such_file.py",
        "docs/design/kernels.md",
        "docs/design/kernels.md",
    ]
    assert [t for t in backticked_paths(text) if not exists_as_tail(t)] == ["no_such_file.py"]
    assert prose_paths(text) == ["goinfer/nothing_here.py"]
    assert not exists_from_root("goinfer/nothing_here.py")
    assert exists_from_root("goinfer/_kernels/src/") and exists_from_root("docs/design")
    assert exists_as_tail("benchmarks/NAME.py") and not exists_as_tail("NOTICE.md")
    cited = cited_sections(text)
    assert cited == [
        ("docs/design/kernels.md", "Exact contracts"),
        ("docs/design/kernels.md", "No such section"),
    ]
    kernels = ROOT / "docs" / "design" / "kernels.md"
    assert [_plain(t) in headings(kernels) for _, t in cited] == [True, False]


def test_every_environment_variable_is_in_the_table():
    """Every GOINFER_* variable the package, the tests, the benchmarks or the Makefile read is
    listed in docs/configuration.md."""
    import re

    doc = (ROOT / "docs" / "configuration.md").read_text()
    files = [
        p
        for d in ("goinfer", "tests", "benchmarks")
        for p in (ROOT / d).rglob("*")
        if p.suffix in (".py", ".pyx", ".c", ".h") and ".venv" not in p.parts
    ]
    files.append(ROOT / "Makefile")
    used = {v for p in files for v in re.findall(r"GOINFER_[A-Z][A-Z_]*[A-Z]", p.read_text())}
    missing = sorted(v for v in used if f"`{v}`" not in doc)
    assert not missing, f"docs/configuration.md does not list {missing}"
