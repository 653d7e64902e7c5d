"""A streaming answer reaches the SQLite file in batches from the saver's thread, and survives a crash."""
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from app.store import Store

ROOT = Path(__file__).resolve().parents[2]


def test_chunks_are_written_in_batches_and_the_final_write_wins(tmp_path):
    store = Store(tmp_path / "sluice.db")
    conversation = store.create_conversation()
    message = store.add_message(conversation.id, "assistant", "", state="streaming")
    started = time.monotonic()
    for i in range(200):                                   # 200 chunks in ~0.2 s: a fast stream
        store.save_streaming(message.id, "x" * (i + 1))
        time.sleep(0.001)
    handing_over_s = time.monotonic() - started
    store.update_message(message.id, content="final", state="done")
    assert store._saver.num_writes <= 3                    # the first chunk at once, then at most every 0.5 s
    assert handing_over_s < 1.0
    reader = Store(tmp_path / "sluice.db")                 # another connection sees the final text, not a late batch
    assert [(m.content, m.state) for m in reader.messages(conversation.id)] == [("final", "done")]
    reader.close()
    store.close()


def test_a_copy_of_the_database_saves_nothing_while_streaming(tmp_path):
    store = Store.in_memory(tmp_path / "sluice.db")
    conversation = store.create_conversation()
    message = store.add_message(conversation.id, "assistant", "", state="streaming")
    store.save_streaming(message.id, "partial")
    store.update_message(message.id, content="partial answer", state="done")
    assert store.messages(conversation.id)[0].content == "partial answer" and store._saver is None
    assert not (tmp_path / "sluice.db").exists()


CRASHING_WRITER = textwrap.dedent("""
    import json, os, signal, sys, time
    from app.store import Store
    store = Store(sys.argv[1])
    conversation = store.create_conversation()
    message = store.add_message(conversation.id, "assistant", "", state="streaming")
    pushed, content, started = [], "", time.monotonic()
    while time.monotonic() - started < 2.5:           # ~40 chunks a second, like a fast model
        content += "token "
        store.save_streaming(message.id, content)
        pushed.append((time.monotonic(), len(content)))
        time.sleep(0.025)
    crash_at = time.monotonic()
    a_second_before = max(length for t, length in pushed if t <= crash_at - 1.0)
    print(json.dumps({"id": message.id, "conversation": conversation.id, "a_second_before": a_second_before,
                      "content": content}), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)               # a crash: no flush, no close
""")


def test_a_crash_loses_at_most_the_last_second(tmp_path):
    db = tmp_path / "sluice.db"
    done = subprocess.run([sys.executable, "-c", CRASHING_WRITER, str(db)], cwd=ROOT, capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT)}, timeout=60)
    assert done.returncode == -9, done.stderr
    sent = json.loads(done.stdout)
    store = Store(db)                                      # the next start marks the answer interrupted
    [saved] = store.messages(sent["conversation"])
    store.close()
    assert saved.state == "interrupted"
    assert sent["content"].startswith(saved.content) and len(saved.content) >= sent["a_second_before"]
