"""Fault tests: real files, real SQLite, real small file systems (tmpfs, when the tests run as root)."""
import os
import subprocess

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    path = tmp_path / "data"
    monkeypatch.setenv("SLUICE_DATA_DIR", str(path))
    return path


@pytest.fixture
def small_fs():
    """mount(path, size) -> a fresh tmpfs of `size` at `path` (really full, really read-only after
    read_only(path)); skipped where mounting is not allowed. Unmounted at the end."""
    mounted = []

    def mount(path, size="4m"):
        if os.geteuid() != 0:
            pytest.skip("mounting a small file system needs root")
        path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                              capture_output=True, text=True)
        if done.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(path)
        return path

    def read_only(path):
        subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)

    mount.read_only = read_only
    yield mount
    for path in reversed(mounted):
        subprocess.run(["umount", "-l", str(path)], check=False)
