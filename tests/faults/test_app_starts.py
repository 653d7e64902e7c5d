"""The app starts whatever its data folder holds, says what it did in a dialog, and loses nothing."""
import json
import logging
import shutil
import sqlite3
import threading

import pytest

from app import paths
from app.gui import open_main_window
from app.store import Store

WAIT_MS = 10_000


def start(qtbot):
    window = open_main_window(autoload=False)
    qtbot.addWidget(window)
    return window


def notice_kinds(window) -> list[str]:
    return [box.objectName() for box in window.startup_notices]


def saved_chat(data_dir, title="Trip plans", text="pack the tent") -> None:
    store = Store(data_dir / "sluice.db")
    conversation = store.create_conversation(title)
    store.add_message(conversation.id, "user", text)
    store.close()


def damaged_copies(data_dir) -> list:
    return sorted(p for p in data_dir.iterdir() if ".damaged-" in p.name and not p.name.endswith(("-wal", "-shm")))


@pytest.mark.parametrize("damage", ["garbage", "truncated", "folder", "foreign tables"])
def test_damaged_database_is_moved_aside_and_a_fresh_one_used(qtbot, data_dir, damage, caplog):
    data_dir.mkdir(parents=True)
    db = data_dir / "sluice.db"
    if damage == "garbage":
        db.write_bytes(b"this is not SQLite " * 500)
    elif damage == "truncated":
        saved_chat(data_dir, text="x" * 20_000)
        for n in range(40):
            saved_chat(data_dir, title=f"chat {n}", text="y" * 5_000)
        whole = db.read_bytes()
        db.write_bytes(whole[: len(whole) // 3])
        for side in data_dir.glob("sluice.db-*"):
            side.unlink()
    elif damage == "folder":
        (db / "inside").mkdir(parents=True)
    else:
        with sqlite3.connect(db) as other:
            other.execute("CREATE TABLE messages (id INTEGER, body TEXT)")
    before = db.read_bytes() if db.is_file() else None

    window = start(qtbot)
    assert notice_kinds(window) == ["notice_damaged_database"]
    [aside] = damaged_copies(data_dir)
    assert aside.name.startswith("sluice.db.damaged-") and len(aside.name) == len("sluice.db.damaged-YYYYMMDD-HHMMSS")
    assert str(aside) in window.startup_notices[0].informativeText()
    if before is not None:
        assert aside.read_bytes() == before                          # nothing lost: the damaged file kept as it was
    window.controller.new_conversation()                             # the fresh database works and saves
    assert window.shutdown()
    assert len(Store(db).conversations()) == 1
    assert any("was damaged" in r.getMessage() and str(aside) in r.getMessage() for r in caplog.records)


def test_locked_database_opens_read_only_with_the_chats(qtbot, data_dir):
    saved_chat(data_dir)
    holder = sqlite3.connect(data_dir / "sluice.db", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")                                 # another program holds the write lock
    try:
        window = start(qtbot)
        assert notice_kinds(window) == ["notice_read_only_database"]
        assert "locked" in window.startup_notices[0].informativeText()
        assert [c.title for c in window.store.conversations()] == ["Trip plans"]
        assert "read-only" in window.windowTitle()
        window.controller.new_conversation()                          # usable, only not saved
        assert window.shutdown()
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert [c.title for c in Store(data_dir / "sluice.db").conversations()] == ["Trip plans"]


def test_database_on_a_read_only_drive_opens_read_only(qtbot, data_dir, small_fs):
    small_fs(data_dir)
    saved_chat(data_dir)
    small_fs.read_only(data_dir)
    window = start(qtbot)
    kinds = notice_kinds(window)
    assert kinds[0] == "notice_read_only_database" and "notice_models_folder" in kinds
    assert "cannot write" in window.startup_notices[0].informativeText()
    assert [c.title for c in window.store.conversations()] == ["Trip plans"]
    assert window.shutdown()


def test_data_folder_that_is_a_file_still_opens(qtbot, tmp_path, monkeypatch):
    blocker = tmp_path / "data"
    blocker.write_text("not a folder")
    monkeypatch.setenv("SLUICE_DATA_DIR", str(blocker))
    window = start(qtbot)
    assert "notice_read_only_database" in notice_kinds(window) and "notice_models_folder" in notice_kinds(window)
    assert window.store.is_read_only
    assert window.shutdown()
    assert blocker.read_text() == "not a folder"


@pytest.mark.parametrize("saved", ["{not json", '"just a string"', json.dumps({"device": "gpu9", "show_panels": "yes",
                                                                                "ram_cache": "lots", "models_dir": 7})])
def test_bad_settings_fall_back_to_defaults_with_a_notice(qtbot, data_dir, saved):
    saved_chat(data_dir)
    with sqlite3.connect(data_dir / "sluice.db") as db:
        db.execute("INSERT INTO settings(key, value) VALUES ('app', ?)", (saved,))
        db.execute("UPDATE conversations SET settings='{broken'")
    window = start(qtbot)
    assert notice_kinds(window) == ["notice_settings"]
    assert window.settings.device == "auto" and window.settings.ram_cache == "" and window.settings.show_panels is True
    assert window.store.conversations()[0].settings.temperature == 0.7          # a damaged chat row reads as defaults
    assert window.shutdown()
    window = start(qtbot)                                                     # repaired: no notice the next time
    assert notice_kinds(window) == []
    assert window.shutdown()


def test_models_folder_that_is_a_file(qtbot, data_dir):
    data_dir.mkdir(parents=True)
    (data_dir / "models").write_text("oops")
    window = start(qtbot)
    assert notice_kinds(window) == ["notice_models_folder"]
    assert "is a file, not a folder" in window.startup_notices[0].informativeText()
    assert window.model_picker.count() == 1                                  # only "Choose a model…"
    assert window.shutdown()


def test_damaged_model_folder_is_listed_with_the_reason(qtbot, data_dir, tmp_path):
    from engine.tools.demo import build_demo_model
    models = data_dir / "models"
    good = build_demo_model(models / "good")
    bad = shutil.copytree(good, models / "bad")
    (bad / "sluice.json").write_text('{"format": "sluice", "format_')
    edited = shutil.copytree(good, models / "edited")
    manifest = json.loads((edited / "sluice.json").read_text())
    manifest["experts"]["num_experts"] = "sixteen"
    (edited / "sluice.json").write_text(json.dumps(manifest))
    shutil.copytree(good, models / "half.partial")                      # an unfinished repack is not a model
    window = start(qtbot)
    labels = [window.model_picker.itemText(i) for i in range(window.model_picker.count())]
    assert len(labels) == 4 and not any("half" in label for label in labels)
    assert any("damaged: sluice.json is not valid JSON" in label for label in labels)
    assert any("damaged" in label and "num_experts" in label for label in labels)
    window.load_model(str(bad))                                          # loading it says why, in one sentence
    qtbot.waitUntil(lambda: window.last_dialog is not None and window.last_dialog.isVisible(), timeout=WAIT_MS)
    assert "damaged" in window.last_dialog.text()
    assert window.shutdown()


def test_uncaught_exception_goes_to_the_log_and_a_dialog(qtbot, data_dir):
    from PySide6.QtCore import QTimer

    from app.crash_hook import CrashReporter
    from app.gui import _setup_logging
    shown = []
    log_file = _setup_logging()
    reporter = CrashReporter(shown.append, log_file)
    try:
        def slot_with_a_bug():
            raise ValueError("a bug in a slot")

        def thread_on_a_full_disk():
            raise OSError(28, "No space left on device", str(data_dir / "sluice.db"))
        QTimer.singleShot(0, slot_with_a_bug)                       # raised inside Qt's event loop
        qtbot.waitUntil(lambda: len(shown) == 1, timeout=WAIT_MS)
        worker = threading.Thread(target=thread_on_a_full_disk)     # raised in another thread
        worker.start()
        worker.join()
        qtbot.waitUntil(lambda: len(shown) == 2, timeout=WAIT_MS)
    finally:
        reporter.uninstall()
        for handler in list(logging.getLogger("sluice").handlers):
            logging.getLogger("sluice").removeHandler(handler)
            handler.close()
    assert "ValueError: a bug in a slot" in shown[0] and str(paths.log_path()) in shown[0]
    assert "the disk is full" in shown[1] and "sluice.db" in shown[1]
    log_text = paths.log_path().read_text()
    assert "Traceback" in log_text and "a bug in a slot" in log_text
