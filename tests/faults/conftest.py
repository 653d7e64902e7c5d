"""Fault tests: real files, real SQLite, real small file systems (tmpfs, when the tests run as root)."""
import os
import subprocess

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402


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


@pytest.fixture(scope="session")
def tiny_snapshot(tmp_path_factory):
    """A 2-layer qwen3_moe HF snapshot (8 experts) with a tokenizer: every fault test starts from it."""
    from engine.tools.demo import build_hf_model
    return build_hf_model("qwen3_moe", tmp_path_factory.mktemp("snap") / "tiny", num_layers=2, num_experts=8,
                          num_experts_per_tok=2)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory, tiny_snapshot):
    """tiny_snapshot repacked (bf16); copy it before damaging it."""
    from engine.format.repack import repack
    return repack(tiny_snapshot, tmp_path_factory.mktemp("model") / "tiny")


@pytest.fixture
def cli(capsys):
    """cli(*args) -> (exit code, stderr) of the real `sluice` command line, in this process."""
    from engine.tools.cli import main

    def run(*args):
        code = main([str(a) for a in args])
        return code, capsys.readouterr().err
    return run
