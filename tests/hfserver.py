"""A local HTTP server that answers the Hugging Face hub's requests huggingface_hub makes, for
tests (HF_ENDPOINT points at it; nothing goes to the internet).

What it speaks (as huggingface_hub's hf_api.py / file_download.py call it, and as the hub answers):

* ``GET /api/models/ORG/REPO/revision/REV?blobs=true`` -> JSON ``{"id", "sha": commit,
  "siblings": [{"rfilename", "size", "blobId", "lfs": {"size", "sha256", "pointerSize"}}]}``
  (``lfs`` for LFS files only: here every ``.gguf``);
* ``HEAD|GET /ORG/REPO/resolve/REV/PATH``: an LFS file answers 302 to the "CDN" (the same server
  under another host name, ``localhost`` for an endpoint at ``127.0.0.1``: another origin, as the
  hub's CDN is) with ``X-Repo-Commit``, ``X-Linked-Etag`` (the sha256), ``X-Linked-Size``; a file
  in git answers 200 with ``ETag`` (its git blob sha1), ``X-Repo-Commit``, the bytes;
* ``HEAD|GET /cdn/SHA256``: the file, ``Accept-Ranges: bytes``, ``Range: bytes=N-`` answered 206
  with ``Content-Range`` (how huggingface_hub resumes a broken download);
* errors with ``X-Error-Code`` (RepoNotFound, RevisionNotFound, EntryNotFound) as
  huggingface_hub's hf_raise_for_status reads them; a repo added with a token answers 401
  RepoNotFound without ``Authorization: Bearer <token>``.

Faults for tests: ``corrupt`` (paths served with one byte flipped, the listing's sha256 kept),
``drop_after`` (path -> bytes: the first GET of it closes the connection after that many).

    python tests/hfserver.py ORG/REPO=FILE.gguf[,FILE2.gguf...] ORG/REPO2=DIR ...  # until Ctrl-C
"""
from __future__ import annotations

import hashlib
import json
import re
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

_CHUNK = 1 << 20


@dataclass
class HubFile:
    data: bytes | Path
    size: int = 0
    sha256: str = ""
    git_sha1: str = ""  # blob id (of the LFS pointer for an LFS file)
    lfs: bool = True

    def read(self, start: int = 0, end: int | None = None) -> bytes:
        end = self.size if end is None else end
        if isinstance(self.data, bytes):
            return self.data[start:end]
        with open(self.data, "rb") as fh:
            fh.seek(start)
            return fh.read(end - start)


@dataclass
class Repo:
    commit: str
    files: dict[str, HubFile]
    token: str | None = None


@dataclass
class FakeHub:
    repos: dict[str, Repo] = field(default_factory=dict)
    corrupt: set[str] = field(default_factory=set)  # repo paths served with a flipped byte
    drop_after: dict[str, int] = field(default_factory=dict)  # repo path -> bytes before a drop
    requests: list[tuple[str, str, dict]] = field(default_factory=list)  # method, path, headers

    def add_repo(self, repo: str, files: dict[str, bytes | Path], *, token: str | None = None,
                 commit: str | None = None) -> Repo:
        hub_files = {}
        for path, data in files.items():
            f = HubFile(data, lfs=path.lower().endswith(".gguf"))
            h = hashlib.sha256()
            n = 0
            if isinstance(data, bytes):
                h.update(data)
                n = len(data)
            else:
                with open(data, "rb") as fh:
                    while chunk := fh.read(_CHUNK):
                        h.update(chunk)
                        n += len(chunk)
            f.size, f.sha256 = n, h.hexdigest()
            if f.lfs:
                pointer = (f"version https://git-lfs.github.com/spec/v1\noid sha256:{f.sha256}\n"
                           f"size {n}\n").encode()
                f.git_sha1 = hashlib.sha1(b"blob %d\0" % len(pointer) + pointer).hexdigest()
            else:
                f.git_sha1 = hashlib.sha1(b"blob %d\0" % n + f.read()).hexdigest()
            hub_files[path] = f
        commit = commit or hashlib.sha1(repr(sorted((p, f.sha256) for p, f in hub_files.items()))
                                        .encode()).hexdigest()
        self.repos[repo] = Repo(commit, hub_files, token)
        return self.repos[repo]

    def count(self, method: str | None = None, contains: str = "") -> int:
        return sum(1 for m, p, _ in self.requests if (method is None or m == method) and contains in p)

    # ------------------------------------------------------------------ serving

    def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        hub = self

        class Handler(_Handler):
            fake = hub

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.cdn = f"http://localhost:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self.url

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "FakeHub":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class _Handler(BaseHTTPRequestHandler):
    fake: FakeHub
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self._route(head=True)

    def do_GET(self) -> None:
        self._route(head=False)

    # ------------------------------------------------------------------ answers

    def _send(self, status: int, headers: dict | None = None, body: bytes = b"",
              head: bool = False) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, str(v))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head and body:
            self.wfile.write(body)

    def _error(self, status: int, code: str, message: str, head: bool, extra: dict | None = None) -> None:
        body = json.dumps({"error": message}).encode()
        self._send(status, {"X-Error-Code": code, "Content-Type": "application/json", **(extra or {})},
                   body, head)

    def _repo(self, name: str, head: bool) -> Repo | None:
        repo = self.fake.repos.get(name)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found", head)
            return None
        if repo.token and self.headers.get("Authorization") != f"Bearer {repo.token}":
            self._error(401, "RepoNotFound", "Invalid username or password.", head)
            return None
        return repo

    def _route(self, head: bool) -> None:
        url = urlsplit(self.path)
        path = unquote(url.path)
        self.fake.requests.append((self.command, path, {k.lower(): v for k, v in self.headers.items()}))
        if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path):
            return self._listing(m[1], m[2] or "main", head)
        if m := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path):
            return self._resolve(m[1], m[2], m[3], head)
        if m := re.fullmatch(r"/cdn/([0-9a-f]{64})", path):
            return self._cdn(m[1], head)
        self._error(404, "NotFound", f"no route {path}", head)

    def _listing(self, name: str, rev: str, head: bool) -> None:
        repo = self._repo(name, head)
        if repo is None:
            return
        if rev not in ("main", repo.commit):
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}", head)
        sib = []
        for p, f in repo.files.items():
            s = {"rfilename": p, "size": f.size, "blobId": f.git_sha1}
            if f.lfs:
                s["lfs"] = {"size": f.size, "sha256": f.sha256, "pointerSize": 134}
            sib.append(s)
        body = json.dumps({"_id": "0" * 24, "id": name, "modelId": name, "sha": repo.commit,
                           "private": bool(repo.token), "siblings": sib}).encode()
        self._send(200, {"Content-Type": "application/json"}, body, head)

    def _resolve(self, name: str, rev: str, path: str, head: bool) -> None:
        repo = self._repo(name, head)
        if repo is None:
            return
        if rev not in ("main", repo.commit):
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}", head)
        f = repo.files.get(path)
        commit = {"X-Repo-Commit": repo.commit}
        if f is None:
            return self._error(404, "EntryNotFound", f"{path} does not exist", head, commit)
        if f.lfs:
            loc = f"{self.fake.cdn}/cdn/{f.sha256}?repo_path={path}"
            return self._send(302, {**commit, "Location": loc, "ETag": f'"{f.git_sha1}"',
                                    "X-Linked-Etag": f'"{f.sha256}"', "X-Linked-Size": f.size},
                              b"", head)
        self._send(200, {**commit, "ETag": f'"{f.git_sha1}"'}, f.read(), head)

    def _cdn(self, sha: str, head: bool) -> None:
        hit = next(((p, f) for r in self.fake.repos.values() for p, f in r.files.items()
                    if f.sha256 == sha), None)
        if hit is None:
            return self._error(404, "EntryNotFound", "no such object", head)
        path, f = hit
        start = 0
        if rng := re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", "")):
            start = int(rng[1])
        status = 206 if start else 200
        headers = {"Accept-Ranges": "bytes", "ETag": f'"{f.sha256}"',
                   "Content-Type": "application/octet-stream"}
        if start:
            headers["Content-Range"] = f"bytes {start}-{f.size - 1}/{f.size}"
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(f.size - start))
        self.end_headers()
        if head:
            return
        stop = f.size
        if path in self.fake.drop_after and not start:
            stop = min(f.size, self.fake.drop_after.pop(path))
        pos = start
        while pos < stop:
            chunk = bytearray(f.read(pos, min(stop, pos + _CHUNK)))
            if path in self.fake.corrupt and pos <= f.size // 2 < pos + len(chunk):
                chunk[f.size // 2 - pos] ^= 0xFF
            self.wfile.write(chunk)
            pos += len(chunk)
        if stop < f.size:  # the connection breaks mid-body
            self.wfile.flush()
            self.close_connection = True
            self.connection.close()


if __name__ == "__main__":
    hub = FakeHub()
    for arg in sys.argv[1:]:
        repo, _, files = arg.partition("=")
        found: dict[str, bytes | Path] = {}
        for f in (Path(x) for x in files.split(",") if x):
            if f.is_dir():  # a directory: its files, by their paths in it
                found |= {p.relative_to(f).as_posix(): p for p in sorted(f.rglob("*")) if p.is_file()}
            else:
                found[f.name] = f
        hub.add_repo(repo, found)
    print(hub.start(), flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        hub.stop()
