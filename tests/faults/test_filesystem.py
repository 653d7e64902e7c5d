"""A full or read-only disk, a file where a folder should be, a folder where a file should be: one
sentence naming the path (CLI exit code 2), and a rerun continues where it stopped."""
import shutil

import pytest

from engine.errors import SluiceError
from engine.format.repack import repack


def test_disk_full_mid_repack_names_the_path_and_resumes(cli, tiny_snapshot, tiny_model, tmp_path, small_fs,
                                                          monkeypatch):
    import engine.format.repack as repack_module
    drive = small_fs(tmp_path / "drive", size="300k")          # dense weights fit, the experts do not
    monkeypatch.setattr(repack_module, "free_bytes", lambda path: 1 << 40)   # the up-front check would refuse
    code, err = cli("repack", tiny_snapshot, drive / "out")
    assert code == 2 and "the disk is full" in err and str(drive / "out") in err and "Traceback" not in err
    assert "run the repack again" in err and not (drive / "out").exists()
    shutil.move(str(drive / "out.partial"), str(tmp_path / "out.partial"))       # "free some space": move the work
    code, err = cli("repack", tiny_snapshot, tmp_path / "out")
    assert code == 0
    assert (tmp_path / "out" / "experts.bin").read_bytes() == (tiny_model / "experts.bin").read_bytes()


def test_read_only_drive(cli, tiny_snapshot, tmp_path, small_fs):
    drive = small_fs(tmp_path / "drive")
    small_fs.read_only(drive)
    code, err = cli("repack", tiny_snapshot, drive / "out")
    assert code == 2 and "the drive is read-only" in err and str(drive) in err


def test_destination_below_a_file(cli, tiny_snapshot, tmp_path):
    (tmp_path / "file").write_text("x")
    code, err = cli("repack", tiny_snapshot, tmp_path / "file" / "out")
    assert code == 2 and "is a file where a folder should be" in err and str(tmp_path / "file") in err


def test_destination_that_is_a_file(cli, tiny_snapshot, tmp_path):
    (tmp_path / "out").write_text("x")
    code, err = cli("repack", tiny_snapshot, tmp_path / "out")
    assert code == 2 and "is a file, not a folder" in err
    assert (tmp_path / "out").read_text() == "x"


def test_folder_where_a_file_should_be(tiny_snapshot, tmp_path):
    import threading

    from engine.format.repack import RepackCancelled
    stop = threading.Event()
    with pytest.raises(RepackCancelled):
        repack(tiny_snapshot, tmp_path / "out", progress=lambda d, t, m: stop.set(), cancel_event=stop)
    experts = tmp_path / "out.partial" / "experts.bin"
    experts.unlink()
    experts.mkdir()
    with pytest.raises(SluiceError, match="a folder is where a file should be") as raised:
        repack(tiny_snapshot, tmp_path / "out")
    assert str(experts) in str(raised.value)


def test_auto_repack_cache_on_a_full_disk(cli, tiny_snapshot, tmp_path, small_fs, monkeypatch):
    import engine.format.repack as repack_module
    cache = small_fs(tmp_path / "cache", size="300k")
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.setattr(repack_module, "free_bytes", lambda path: 1 << 40)
    code, err = cli("generate", tiny_snapshot, "--prompt-ids", "1,2", "--max-new-tokens", "1")
    assert code == 2 and "the disk is full" in err and str(cache) in err and "Traceback" not in err


def test_auto_repack_cache_below_a_file(cli, tiny_snapshot, tmp_path, monkeypatch):
    (tmp_path / "cache").write_text("x")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    code, err = cli("generate", tiny_snapshot, "--prompt-ids", "1,2", "--max-new-tokens", "1")
    assert code == 2 and "part of the path is a file" in err and str(tmp_path / "cache") in err


def test_app_shows_file_system_errors_as_a_sentence(tmp_path):
    from app.work import user_message
    error = OSError(30, "Read-only file system", str(tmp_path / "models" / "x"))
    assert user_message(error) == (f"Sluice could not use '{tmp_path / 'models' / 'x'}': the drive is read-only; "
                                   "choose a folder on a writable drive.")
