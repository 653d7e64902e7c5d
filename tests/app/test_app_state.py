"""Qt-free app state: the chat store, Markdown, export, telemetry rates, engine history."""
import json
import math
import sqlite3

from app.chat_controller import history_for_engine, title_from
from app.export import stats_line, to_json, to_markdown
from app.markdown import MarkdownRenderer
from app.store import ChatSettings, Store
from app.telemetry_history import TelemetryHistory, thread_last_core


def test_store_uses_wal_and_marks_answers_cut_by_a_crash(tmp_path):
    store = Store(tmp_path / "chat.db")
    conversation = store.create_conversation("c", ChatSettings(temperature=0.1))
    store.add_message(conversation.id, "user", "hi")
    streaming = store.add_message(conversation.id, "assistant", "", state="streaming")
    store.update_message(streaming.id, content="partial ans")
    # no close(): the process "crashes" here
    with sqlite3.connect(tmp_path / "chat.db") as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    reopened = Store(tmp_path / "chat.db")
    messages = reopened.messages(conversation.id)
    assert [(m.content, m.state) for m in messages] == [("hi", "done"), ("partial ans", "interrupted")]
    assert reopened.conversation(conversation.id).settings.temperature == 0.1


def test_store_delete_from_and_search(tmp_path):
    store = Store(tmp_path / "chat.db")
    a, b = store.create_conversation("Alpha"), store.create_conversation("Beta")
    first = store.add_message(a.id, "user", "about gardens")
    store.add_message(a.id, "assistant", "roses")
    store.add_message(b.id, "user", "about boats")
    assert [c.title for c in store.conversations("GARDEN")] == ["Alpha"]
    assert [c.title for c in store.conversations("bet")] == ["Beta"]
    store.delete_messages_from(a.id, first.id)
    assert store.messages(a.id) == [] and len(store.messages(b.id)) == 1
    store.delete_conversation(b.id)
    assert store.messages(b.id) == [] and [c.title for c in store.conversations()] == ["Alpha"]


def test_markdown_code_blocks_thinks_and_escaping():
    text = "<think>plan it</think>Hi <b>there</b>\n\n```python\nx = 1\n```\n\n```\nplain\n```"
    rendered = MarkdownRenderer().render(text)
    assert rendered.code_blocks == ["x = 1\n", "plain\n"]
    assert 'href="copy-code:0"' in rendered.html and 'href="copy-code:1"' in rendered.html
    assert "plan it" not in rendered.html and 'href="toggle-think:0"' in rendered.html
    assert "&lt;b&gt;there&lt;/b&gt;" in rendered.html and "<b>there</b>" not in rendered.html
    assert "plan it" in MarkdownRenderer().render(text, {0}).html
    streaming = MarkdownRenderer().render("<think>still going")          # an unfinished thought
    assert "Thinking…" in streaming.html and "still going" not in streaming.html


def test_history_drops_thoughts_errors_and_adds_the_system_prompt(tmp_path):
    store = Store(tmp_path / "chat.db")
    c = store.create_conversation()
    q1 = store.add_message(c.id, "user", "q1")
    a1 = store.add_message(c.id, "assistant", "<think>hmm</think>a1")
    store.add_message(c.id, "assistant", "", state="error")
    q2 = store.add_message(c.id, "user", "q2")
    history, ids = history_for_engine(ChatSettings(system_prompt="Be kind."), store.messages(c.id))
    assert history == [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "q1"},
                       {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}]
    assert ids == [None, q1.id, a1.id, q2.id]


def test_titles_are_one_plain_line():
    assert title_from("  a   very " + "long " * 20) .endswith("…") and len(title_from("x" * 100)) == 48
    assert title_from("## How do I **parse** `json` in [Python](https://python.org)?") == \
        "How do I parse json in Python?"
    assert title_from("- item one\n- item two") == "item one item two"


def test_export_formats(tmp_path):
    store = Store(tmp_path / "chat.db")
    c = store.create_conversation("Trip", ChatSettings(system_prompt="sys"))
    store.add_message(c.id, "user", "where?")
    store.add_message(c.id, "assistant", "there", stats={"tok_s": 12.345, "ttft_s": 0.5, "num_tokens": 9,
                                                          "finish_reason": "cancelled", "model": "m"})
    conversation, messages = store.conversation(c.id), store.messages(c.id)
    markdown = to_markdown(conversation, messages)
    assert markdown.startswith("# Trip") and "## Assistant (m)" in markdown
    assert "12.3 tok/s · TTFT 0.50 s · 9 tokens · stopped" in markdown
    data = json.loads(to_json(conversation, messages))
    assert data["messages"][1]["stats"]["tok_s"] == 12.345 and data["settings"]["system_prompt"] == "sys"
    assert stats_line({}) == ""


def test_telemetry_history_reads_the_engines_derived_figures():
    from engine.runtime.telemetry import Telemetry
    telemetry, history = Telemetry(), TelemetryHistory()
    telemetry.set(ram_capacity_bytes=100, ram_used_bytes=50)
    history.push(telemetry.snapshot(), 10.0, system_read_bytes=1_000)
    assert history.cache_summary()["hit_rate"] is None and history.speculation_recall() is None   # nothing yet
    telemetry.add(disk_bytes_read=2e9, h2d_bytes=1e9, ram_hits=3, ram_misses=1, spec_predicted=10, spec_correct=6)
    telemetry.set(decode_tok_s=12.5)
    history.push(telemetry.snapshot(), 10.5, system_read_bytes=1_000 + 3e9)
    history.push(telemetry.snapshot(), 11.0, system_read_bytes=1_000 + 3e9, is_busy=False)
    assert history.values("disk_gbps") == [4.0, 0.0]            # 2 GB in 0.5 s
    assert history.values("h2d_gbps") == [2.0, 0.0]
    assert history.values("system_disk_gbps") == [6.0, 0.0]
    assert history.values("hit_rate")[0] == 0.75 and math.isnan(history.values("hit_rate")[1])
    assert history.values("decode_tok_s")[0] == 12.5 and math.isnan(history.values("decode_tok_s")[1])  # idle
    assert history.cache_summary()["hit_rate"] == 0.75 and history.speculation_recall() == 0.6


def test_thread_last_core_reads_this_thread():
    import os
    import threading
    core = thread_last_core(threading.get_native_id())
    assert core is None or core in os.sched_getaffinity(0) or core >= 0
