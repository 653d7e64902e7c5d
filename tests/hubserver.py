"""A local stand-in for the Hugging Face hub: serves folders as model repos over HTTP on 127.0.0.1.

Speaks what huggingface_hub 2.4.0 and Sluice's downloader use (ENVIRONMENT.md section 4):
  GET  /api/models?search=&sort=downloads&limit=&config=True   search, with downloads/likes/config
  GET  /api/models/{repo}[/revision/{rev}]                    model info: id, sha, siblings, config
  GET  /api/models/{repo}/tree/{rev}[/{sub}]?recursive=true   file list: type, path, size, oid, lfs
  HEAD /{repo}/resolve/{rev}/{file}                           X-Repo-Commit, ETag, Content-Length
  GET  /{repo}/resolve/{rev}/{file}                           body; `Range: bytes=a-[b]` -> 206

Switches for tests (thread-safe, set any time):
  corrupt[path] = n      the next n GETs of that file serve wrong bytes (same length)
  drop_after[path] = b   the next GET of that file closes the connection after b body bytes
  throttle_bps = x       body bytes per second per connection (None = as fast as possible)
  gated[repo] = token    that repo answers 401 GatedRepo unless `Authorization: Bearer <token>` is sent
Counters: body_bytes_sent (total), bytes_sent_by_path, requests [(method, path, range header)].
"""
from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

_LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
_CHUNK = 64 * 1024


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Repo:
    """One served folder. File hashes are computed once at start (test models are small)."""

    def __init__(self, repo_id: str, folder: Path, downloads: int = 0, likes: int = 0):
        self.repo_id, self.folder = repo_id, Path(folder)
        self.downloads, self.likes = downloads, likes
        self.files: dict[str, dict] = {}
        for p in sorted(self.folder.rglob("*")):
            if p.is_file():
                data = p.read_bytes()
                rel = p.relative_to(self.folder).as_posix()
                self.files[rel] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                                   "git_sha1": git_blob_sha1(data), "lfs": rel.endswith(_LFS_SUFFIXES)}
        digest = hashlib.sha1(json.dumps(sorted((k, v["sha256"]) for k, v in self.files.items())).encode())
        self.sha = digest.hexdigest()

    def config(self) -> dict:
        path = self.folder / "config.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def tree_entry(self, rel: str) -> dict:
        f = self.files[rel]
        entry = {"type": "file", "path": rel, "size": f["size"], "oid": f["git_sha1"]}
        if f["lfs"]:
            entry["lfs"] = {"oid": f["sha256"], "size": f["size"], "pointerSize": 134}
        return entry


class HubServer:
    def __init__(self):
        self.repos: dict[str, Repo] = {}
        self.corrupt: dict[str, int] = {}
        self.drop_after: dict[str, int] = {}
        self.throttle_bps: float | None = None
        self.gated: dict[str, str] = {}
        self.body_bytes_sent = 0
        self.bytes_sent_by_path: dict[str, int] = {}
        self.requests: list[tuple[str, str, str | None]] = []
        self.lock = threading.Lock()
        self._open_sockets: set = set()
        self._bodies_in_flight = 0
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    def add_repo(self, repo_id: str, folder: Path, downloads: int = 0, likes: int = 0) -> Repo:
        repo = Repo(repo_id, folder, downloads, likes)
        self.repos[repo_id] = repo
        return repo

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "HubServer":
        handler = type("Handler", (_Handler,), {"hub": self})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", self.port), handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), name="hubserver", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and cut open connections (clients then see the network gone); start() again
        reuses the port."""
        self._cut_connections()           # first, so no in-flight body finishes while shutting down
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._thread.join()
            self._httpd = None
        self._cut_connections()

    def _cut_connections(self) -> None:
        with self.lock:
            for sock in self._open_sockets:
                try:
                    sock.shutdown(2)
                except OSError:
                    pass
            self._open_sockets.clear()

    def reset_counters(self) -> None:
        """Zero the counters once bodies still being written (to a client that went away) have ended."""
        deadline = time.monotonic() + 5
        while self._bodies_in_flight and time.monotonic() < deadline:
            time.sleep(0.01)
        with self.lock:
            self.body_bytes_sent = 0
            self.bytes_sent_by_path.clear()
            self.requests.clear()

    def weight_requests(self) -> list[str]:
        """Paths of weight files that were GET (used to check 'refused before any weight download')."""
        return [p for m, p, _ in self.requests if m == "GET" and "/resolve/" in p and p.endswith(_LFS_SUFFIXES)]


class _Handler(BaseHTTPRequestHandler):
    hub: HubServer
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        with self.hub.lock:
            self.hub._open_sockets.add(self.connection)

    def finish(self):
        with self.hub.lock:
            self.hub._open_sockets.discard(self.connection)
        super().finish()

    def log_message(self, *args):   # keep test output quiet
        pass

    def do_HEAD(self):
        self._route(head=True)

    def do_GET(self):
        self._route(head=False)

    def _route(self, head: bool):
        url = urlparse(self.path)
        path, query = unquote(url.path), parse_qs(url.query)
        with self.hub.lock:
            self.hub.requests.append((self.command, path, self.headers.get("Range")))
        if path == "/api/models":
            return self._json(self._search(query))
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?", path)
        if m:
            return self._tree(m.group(1), m.group(2), m.group(3) or "")
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path)
        if m:
            return self._info(m.group(1), m.group(2) or "main")
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if m:
            return self._resolve(m.group(1), m.group(2), m.group(3), head)
        self._error(404, "EntryNotFound", None)

    # --- API -------------------------------------------------------------------------------------
    def _repo(self, repo_id: str, rev: str) -> Repo | None:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", None)
            return None
        token = self.hub.gated.get(repo_id)
        if token is not None and self.headers.get("Authorization") != f"Bearer {token}":
            self._error(401, "GatedRepo", repo.sha)
            return None
        if rev not in ("main", repo.sha):
            self._error(404, "RevisionNotFound", repo.sha)
            return None
        return repo

    def _summary(self, repo: Repo) -> dict:
        cfg = repo.config()
        return {"id": repo.repo_id, "modelId": repo.repo_id, "sha": repo.sha, "downloads": repo.downloads,
                "likes": repo.likes, "private": False, "gated": False, "tags": [cfg.get("model_type", "")],
                "config": {k: cfg[k] for k in ("model_type", "architectures") if k in cfg},
                "lastModified": "2026-11-01T00:00:00.000Z"}

    def _search(self, query: dict) -> list[dict]:
        text = query.get("search", [""])[0].lower()
        hits = [r for r in self.hub.repos.values() if text in r.repo_id.lower()]
        key = query.get("sort", ["downloads"])[0]
        hits.sort(key=lambda r: r.likes if key == "likes" else r.downloads, reverse=True)
        limit = int(query.get("limit", ["1000"])[0])
        return [self._summary(r) for r in hits[:limit]]

    def _info(self, repo_id: str, rev: str):
        repo = self._repo(repo_id, rev)
        if repo:
            info = self._summary(repo)
            info["siblings"] = [{"rfilename": p} for p in repo.files]
            self._json(info)

    def _tree(self, repo_id: str, rev: str, sub: str):
        repo = self._repo(repo_id, rev)
        if repo is None:
            return
        prefix = sub.rstrip("/") + "/" if sub else ""
        entries = [repo.tree_entry(p) for p in repo.files if p.startswith(prefix)]
        if sub and not entries:
            return self._error(404, "EntryNotFound", repo.sha)
        self._json(entries)

    # --- files -----------------------------------------------------------------------------------
    def _resolve(self, repo_id: str, rev: str, rel: str, head: bool):
        repo = self._repo(repo_id, rev)
        if repo is None:
            return
        meta = repo.files.get(rel)
        if meta is None:
            return self._error(404, "EntryNotFound", repo.sha)
        size = meta["size"]
        start, end = 0, size - 1
        rng = self.headers.get("Range")
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng or "")
        if m:
            start, end = int(m.group(1)), min(int(m.group(2)) if m.group(2) else size - 1, size - 1)
            if start >= size:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
        self.send_response(206 if m else 200)
        self.send_header("X-Repo-Commit", repo.sha)
        etag = meta["sha256"] if meta["lfs"] else meta["git_sha1"]
        self.send_header("ETag", f'"{etag}"')
        if meta["lfs"]:
            self.send_header("X-Linked-Etag", f'"{meta["sha256"]}"')
            self.send_header("X-Linked-Size", str(size))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start + 1))
        if m:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.end_headers()
        if not head:
            self._send_body(repo, rel, start, end)

    def _send_body(self, repo: Repo, rel: str, start: int, end: int):
        hub = self.hub
        with hub.lock:
            corrupt = hub.corrupt.get(rel, 0) > 0
            if corrupt:
                hub.corrupt[rel] -= 1
            drop_at = hub.drop_after.pop(rel, None)
        with hub.lock:
            hub._bodies_in_flight += 1
        try:
            self._write_body(rel, (repo.folder / rel).read_bytes()[start:end + 1], corrupt, drop_at)
        finally:
            with hub.lock:
                hub._bodies_in_flight -= 1

    def _write_body(self, rel: str, data: bytes, corrupt: bool, drop_at: int | None):
        hub = self.hub
        if corrupt:   # same length, different bytes: only a hash check can tell
            data = bytes(b ^ 0x5A for b in data)
        sent = 0
        began = time.monotonic()
        while sent < len(data):
            chunk = data[sent:sent + _CHUNK]
            if drop_at is not None and sent + len(chunk) > drop_at:
                chunk = chunk[:max(0, drop_at - sent)]
            try:
                self.wfile.write(chunk)
                self.wfile.flush()
            except OSError:          # the client went away or stop() cut the connection
                return
            sent += len(chunk)
            with hub.lock:
                hub.body_bytes_sent += len(chunk)
                hub.bytes_sent_by_path[rel] = hub.bytes_sent_by_path.get(rel, 0) + len(chunk)
            if drop_at is not None and sent >= drop_at:
                self.close_connection = True
                self.connection.shutdown(2)   # SHUT_RDWR: the client sees the body end early
                return
            bps = hub.throttle_bps
            if bps:
                ahead_s = sent / bps - (time.monotonic() - began)
                if ahead_s > 0:
                    time.sleep(ahead_s)

    def _json(self, obj):
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, code: int, error_code: str, sha: str | None):
        body = json.dumps({"error": error_code}).encode()
        self.send_response(code)
        self.send_header("X-Error-Code", error_code)
        self.send_header("X-Error-Message", error_code)
        if sha:
            self.send_header("X-Repo-Commit", sha)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


def main() -> None:
    """`python tests/hubserver.py PORT OWNER/NAME=FOLDER ...`: serve folders by hand (screenshots, demos)."""
    import sys
    hub = HubServer()
    hub.port = int(sys.argv[1])
    for arg in sys.argv[2:]:
        repo_id, folder = arg.split("=", 1)
        hub.add_repo(repo_id, Path(folder))
    hub.start()
    print(hub.url, flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
