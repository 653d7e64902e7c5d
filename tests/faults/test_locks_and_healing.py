"""Two processes on one destination: the second waits, says why, then uses the result. A partial
repack whose finished work no longer reads back has that work redone."""
import json
import subprocess
import sys
import threading
import time

import pytest

from engine.format import locks
from engine.format.repack import RepackCancelled, repack

WAIT_S = 120


def start_cli(stderr_path, *args, env=None):
    return subprocess.Popen([sys.executable, "-m", "engine.tools.cli", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=open(stderr_path, "w"), text=True, env=env)


def wait_until_all_wait(processes, stderr_paths):
    """Hold the lock until every process said it is waiting for it, then let them race."""
    deadline = time.time() + WAIT_S
    while time.time() < deadline:
        if any(p.poll() is not None for p in processes):
            raise AssertionError("a process ended before reaching the lock: "
                                 + " | ".join(path.read_text() for path in stderr_paths))
        if all("waiting for it to finish" in path.read_text() for path in stderr_paths):
            return
        time.sleep(0.2)
    raise AssertionError("the processes did not reach the lock")


def finish(processes, stderr_paths):
    outs = [p.communicate(timeout=WAIT_S)[0] for p in processes]
    return outs, [path.read_text() for path in stderr_paths]


def test_two_repacks_into_one_destination(tiny_snapshot, tiny_model, tmp_path):
    dst = tmp_path / "out"
    logs = [tmp_path / f"err{i}.txt" for i in range(2)]
    with locks.exclusive(dst, "holding the lock for the test"):
        procs = [start_cli(log, "repack", tiny_snapshot, dst) for log in logs]
        wait_until_all_wait(procs, logs)
    _, errs = finish(procs, logs)
    assert [p.returncode for p in procs] == [0, 0], errs
    assert all(f"Another Sluice process is repacking into '{dst}'" in err for err in errs)
    assert (dst / "experts.bin").read_bytes() == (tiny_model / "experts.bin").read_bytes()


def test_two_generates_share_one_auto_repack(tiny_snapshot, tmp_path, monkeypatch):
    import os
    from engine.format.resolve import cached_repack_dir
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    target = cached_repack_dir(tiny_snapshot)
    target.parent.mkdir(parents=True)
    args = ("generate", tiny_snapshot, "--prompt-ids", "1,2,3", "--max-new-tokens", "3", "--json")
    logs = [tmp_path / f"err{i}.txt" for i in range(2)]
    with locks.exclusive(target, "holding the lock for the test"):
        procs = [start_cli(log, *args, env=env) for log in logs]
        wait_until_all_wait(procs, logs)
    outs, errs = finish(procs, logs)
    assert [p.returncode for p in procs] == [0, 0], errs
    assert [json.loads(out)["token_ids"] for out in outs][0] == [json.loads(out)["token_ids"] for out in outs][1]
    assert all("into the cache at" in err for err in errs)


def cancelled_after_first_layer(src, dst):
    stop = threading.Event()
    with pytest.raises(RepackCancelled):
        repack(src, dst, progress=lambda d, t, m: stop.set() if "layer" in m else None, cancel_event=stop)


def test_partial_whose_finished_layer_fails_read_back_redoes_it(tiny_snapshot, tiny_model, tmp_path, caplog):
    cancelled_after_first_layer(tiny_snapshot, tmp_path / "out")
    experts = tmp_path / "out.partial" / "experts.bin"
    with open(experts, "r+b") as f:                          # layer 0 was finished and recorded: damage it
        f.seek(1000)
        f.write(b"\xff\xfe")
    repack(tiny_snapshot, tmp_path / "out")
    assert any("layer 0 of the unfinished repack" in r.getMessage() and "repacking it again" in r.getMessage()
               for r in caplog.records)
    assert (tmp_path / "out" / "experts.bin").read_bytes() == (tiny_model / "experts.bin").read_bytes()


def test_partial_whose_dense_weights_changed_rewrites_them(tiny_snapshot, tiny_model, tmp_path, caplog):
    cancelled_after_first_layer(tiny_snapshot, tmp_path / "out")
    dense = tmp_path / "out.partial" / "dense.safetensors"
    dense.write_bytes(dense.read_bytes()[:-10])
    repack(tiny_snapshot, tmp_path / "out")
    assert any("dense weights of the unfinished repack" in r.getMessage() for r in caplog.records)
    for name in ("dense.safetensors", "experts.bin", "checksums.json"):
        assert (tmp_path / "out" / name).read_bytes() == (tiny_model / name).read_bytes()
