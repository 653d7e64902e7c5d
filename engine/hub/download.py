"""Download a hub snapshot into a folder, resuming across process restarts.

huggingface_hub 2.4 cannot resume after the process ends (ENVIRONMENT.md section 4), so this is
our own small downloader:
  * each file streams into `<dst>/.sluice-download/<path>.part`; a restart asks for
    `Range: bytes=<part size>-` and appends, so only the missing bytes cross the network;
  * every file is checked against the hash the hub lists (sha256 for LFS files, the git blob
    sha1 otherwise) before it is moved into place; a corrupt file is fetched again;
  * `manifest.json` beside the parts records the content hash each part and each finished file
    belongs to, so a rerun does not re-hash finished files, and a new revision keeps files whose
    content did not change but never appends to a part of other content;
  * free disk space is checked before the first byte, against what is still missing.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from engine.errors import SluiceError, fs_errors_as_sentences
from engine.hub.search import HubFile, RepoInfo, endpoint
from engine.sizes import format_size

STATE_DIR = ".sluice-download"
CHUNK_BYTES = 1 << 20
MAX_NETWORK_RETRIES = 3          # consecutive failures without progress before giving up
MAX_CORRUPT_REFETCHES = 2
PROGRESS_INTERVAL_S = 0.1
SPEED_WINDOW_S = 3.0


@dataclass
class DownloadProgress:
    bytes_done: int              # verified + partial bytes on disk, over all files
    bytes_total: int
    speed_bps: float             # over the last few seconds of this run
    eta_s: float | None          # None until a speed is known
    current_file: str
    bytes_transferred: int       # bytes received from the network in this run only


class DownloadStopped(Exception):
    """The stop event was set (pause or cancel); finished files and partial bytes are kept."""


def free_disk_bytes(path: Path) -> int:
    path = Path(path)
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def missing_bytes(info: RepoInfo, dst_dir: Path, files: list[HubFile] | None = None) -> int:
    """Bytes still to fetch into dst_dir (counts finished files and partial parts already there)."""
    job = _Job(info, Path(dst_dir), files or info.model_files())
    return job.bytes_total - job.bytes_on_disk()


def download(info: RepoInfo, dst_dir: str | Path, files: list[HubFile] | None = None, token: str | None = None,
             progress: Callable[[DownloadProgress], None] | None = None, stop_event: threading.Event | None = None,
             extra_bytes_needed: int = 0, free_bytes: Callable[[Path], int] = free_disk_bytes) -> Path:
    """Fetch `files` (default: what a repack needs) of `info` into dst_dir; returns dst_dir.

    Refuses unsupported families and too little disk space (missing bytes + extra_bytes_needed,
    e.g. the repacked copy) before any request. Raises SluiceError on network loss (finished and
    partial bytes are kept: calling again resumes) and DownloadStopped when stop_event is set."""
    from huggingface_hub import constants
    if not info.is_supported:
        raise SluiceError(f"{info.repo_id} is a '{info.family}' model, which Sluice cannot run; nothing was downloaded.")
    if constants.is_offline_mode():
        raise SluiceError("Hub access is switched off (HF_HUB_OFFLINE is set): unset it to download models.")
    dst = Path(dst_dir)
    files = files or info.model_files()
    for f in files:
        check_relative_path(f.path, info.repo_id)
    with fs_errors_as_sentences(dst, then="then download again: it continues where it stopped"):
        job = _Job(info, dst, files, token, progress, stop_event)
        needed = job.bytes_total - job.bytes_on_disk() + extra_bytes_needed
        free = free_bytes(dst)
        if needed > free:
            raise SluiceError(f"Not enough disk space in {dst}: {format_size(needed)} is needed but only "
                              f"{format_size(free)} is free; free some space or choose another folder.")
        job.run()
    return dst


def check_relative_path(path: str, repo_id: str) -> None:
    """A listed file must land inside the destination: no absolute path, no '..', no backslash or drive."""
    parts = path.split("/")
    if not path or path.startswith("/") or "\\" in path or ":" in parts[0] or any(p in ("", ".", "..") for p in parts):
        raise SluiceError(f"The hub lists a file '{path}' in {repo_id} that would be written outside the download "
                          "folder; nothing was downloaded. The listing is damaged or hostile: do not use this model.")


class _Job:
    def __init__(self, info: RepoInfo, dst: Path, files: list[HubFile], token=None, progress=None, stop_event=None):
        self.info, self.dst, self.files = info, dst, files
        self.token, self.progress, self.stop_event = token, progress, stop_event or threading.Event()
        self.state_dir = dst / STATE_DIR
        self.manifest = self._read_manifest()
        self.bytes_total = sum(f.size for f in files)
        self.bytes_transferred = 0
        self._samples: deque[tuple[float, int]] = deque()
        self._last_report = 0.0

    # --- bookkeeping -----------------------------------------------------------------------------
    def _read_manifest(self) -> dict:
        try:
            manifest = json.loads((self.state_dir / "manifest.json").read_text())
        except (OSError, ValueError):
            manifest = {}
        manifest.update(repo_id=self.info.repo_id, revision=self.info.revision)
        manifest.setdefault("verified", {})      # path -> content hash of the finished file
        manifest.setdefault("parts", {})         # path -> content hash the partial bytes belong to
        return manifest

    def _save_manifest(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_dir / "manifest.json.tmp"
        tmp.write_text(json.dumps(self.manifest, indent=1))
        os.replace(tmp, self.state_dir / "manifest.json")

    def _is_verified(self, f: HubFile) -> bool:
        target = self.dst / f.path
        return (self.manifest["verified"].get(f.path) == _expected_hash(f)
                and target.is_file() and target.stat().st_size == f.size)

    def _part(self, f: HubFile) -> Path:
        return self.state_dir / (f.path + ".part")

    def _part_matches(self, f: HubFile) -> bool:
        return self.manifest["parts"].get(f.path) == _expected_hash(f) and self._part(f).is_file()

    def bytes_on_disk(self) -> int:
        done = 0
        for f in self.files:
            if self._is_verified(f):
                done += f.size
            elif self._part_matches(f):
                done += min(self._part(f).stat().st_size, f.size)
        return done

    # --- transfer --------------------------------------------------------------------------------
    def run(self) -> None:
        self._bytes_done = self.bytes_on_disk()
        for f in self.files:
            if not self._is_verified(f):
                self._fetch_verified(f)
        self._report("", force=True)

    def _fetch_verified(self, f: HubFile) -> None:
        for _ in range(MAX_CORRUPT_REFETCHES + 1):
            self._fetch(f)
            if _file_hash(self._part(f), f) == _expected_hash(f):
                target = self.dst / f.path
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(self._part(f), target)
                self.manifest["verified"][f.path] = _expected_hash(f)
                self.manifest["parts"].pop(f.path, None)
                self._save_manifest()
                return
            self._bytes_done -= f.size            # corrupt: throw it away, fetch again from 0
            self._part(f).unlink()
        raise SluiceError(f"{f.path} from {self.info.repo_id} failed its checksum {MAX_CORRUPT_REFETCHES + 1} times: "
                          "the hub or a proxy is serving damaged data; try again later.")

    def _fetch(self, f: HubFile) -> None:
        """Bring the part file to f.size bytes, resuming from what is there; retries network drops."""
        import httpx2
        part = self._part(f)
        part.parent.mkdir(parents=True, exist_ok=True)
        if not self._part_matches(f):             # bytes of other content (an older revision): drop them
            part.unlink(missing_ok=True)
            self.manifest["parts"][f.path] = _expected_hash(f)
            self._save_manifest()
        failures = 0                               # consecutive attempts that brought no new bytes
        while True:
            have = part.stat().st_size if part.exists() else 0
            if have == f.size:
                return
            if have > f.size:                      # stale or foreign part: start over
                self._bytes_done -= f.size         # bytes_on_disk counted at most f.size of it
                part.unlink()
                continue
            error = None
            try:
                self._stream(f, part, have)
            except httpx2.TransportError as exc:
                error = exc
            now_have = part.stat().st_size if part.exists() else 0
            failures = 0 if now_have > have else failures + 1
            if failures >= MAX_NETWORK_RETRIES:
                raise SluiceError(
                    f"The connection to the model hub was lost while downloading {f.path} "
                    f"({format_size(now_have)} of {format_size(f.size)}): check your network and press Retry; "
                    "the bytes already downloaded are kept.") from error
            if failures:
                time.sleep(0.2 * 2 ** failures)

    def _stream(self, f: HubFile, part: Path, have: int) -> None:
        from huggingface_hub import get_session, hf_hub_url
        from huggingface_hub.utils import build_hf_headers
        import httpx2
        url = hf_hub_url(self.info.repo_id, f.path, revision=self.info.revision, endpoint=endpoint())
        headers = build_hf_headers(token=self.token)
        if have:
            headers["Range"] = f"bytes={have}-"
        timeout = httpx2.Timeout(30.0, read=60.0)
        with get_session().stream("GET", url, headers=headers, follow_redirects=True, timeout=timeout) as response:
            if response.status_code == 416:          # the part is already complete or wrong: restart
                self._bytes_done -= have
                part.unlink()
                return
            _raise_for_status(response, self.info.repo_id, f.path)
            if have and response.status_code != 206:   # server ignored the range: start from 0
                self._bytes_done -= have
                have = 0
            with open(part, "r+b" if have else "wb") as out:
                out.seek(have)
                out.truncate()
                for chunk in response.iter_bytes():       # as received, so a drop loses nothing
                    out.write(chunk)
                    self.bytes_transferred += len(chunk)
                    self._bytes_done += len(chunk)
                    self._report(f.path)
                    if self.stop_event.is_set():
                        out.flush()
                        raise DownloadStopped()

    def _report(self, current: str, force: bool = False) -> None:
        now = time.monotonic()
        if self.progress is None or (not force and now - self._last_report < PROGRESS_INTERVAL_S):
            return
        self._last_report = now
        self._samples.append((now, self.bytes_transferred))
        while len(self._samples) > 2 and now - self._samples[0][0] > SPEED_WINDOW_S:
            self._samples.popleft()
        t0, b0 = self._samples[0]
        speed = (self.bytes_transferred - b0) / (now - t0) if now > t0 else 0.0
        remaining = self.bytes_total - self._bytes_done
        eta = remaining / speed if speed > 0 else (0.0 if remaining <= 0 else None)
        self.progress(DownloadProgress(self._bytes_done, self.bytes_total, speed, eta, current, self.bytes_transferred))


def _raise_for_status(response, repo_id: str, path: str) -> None:
    code = response.status_code
    if code < 400:
        return
    if code in (401, 403):
        raise SluiceError(f"The hub refused {path} of {repo_id} (access denied): accept the model's license on "
                          "its web page and enter an access token in the setup window.")
    if code == 404:
        raise SluiceError(f"{path} is no longer in {repo_id} at this revision: search the model again.")
    import httpx2
    # 5xx and the like are treated like a dropped connection: retried, then reported
    raise httpx2.RemoteProtocolError(f"hub answered HTTP {code} for {path}")


def _expected_hash(f: HubFile) -> str:
    return f"sha256:{f.sha256}" if f.sha256 else f"gitsha1:{f.git_sha1}"


def _file_hash(path: Path, f: HubFile) -> str:
    if f.sha256:
        hasher = hashlib.sha256()
        prefix = "sha256:"
    else:
        hasher = hashlib.sha1(b"blob %d\0" % path.stat().st_size)
        prefix = "gitsha1:"
    with open(path, "rb") as fh:
        while block := fh.read(8 * CHUNK_BYTES):
            hasher.update(block)
    return prefix + hasher.hexdigest()
