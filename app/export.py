"""Export a conversation to Markdown or JSON. Qt-free."""
from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

from .store import Conversation, Message


FILTERS = {"Markdown (*.md)": ".md", "JSON (*.json)": ".json"}     # file dialog filter -> extension
EXPORT_DIR_KEY = "export_dir"                                       # the store setting: the last folder used


def path_for_filter(path: str | Path, selected_filter: str) -> Path:
    """The file the user meant: the chosen filter's extension is added when the name has neither."""
    path = Path(path)
    if path.suffix.lower() not in FILTERS.values():
        path = path.with_name(path.name + FILTERS.get(selected_filter, ".md"))
    return path


def stats_line(stats: dict) -> str:
    """'12.3 tok/s · TTFT 0.42 s · 87 tokens · stopped' (parts that are known)."""
    parts = []
    if stats.get("tok_s"):
        parts.append(f"{stats['tok_s']:.1f} tok/s")
    if stats.get("ttft_s") is not None:
        parts.append(f"TTFT {stats['ttft_s']:.2f} s")
    if stats.get("num_tokens"):
        parts.append(f"{stats['num_tokens']:,} token{'s' if stats['num_tokens'] != 1 else ''}")
    reason = stats.get("finish_reason")
    if reason in FINISH_WORDS:
        parts.append(FINISH_WORDS[reason])
    return " · ".join(parts)


FINISH_WORDS = {"cancelled": "stopped", "length": "max new tokens reached",
                "context_full": "stopped: the model's context is full"}


def to_markdown(conversation: Conversation, messages: list[Message]) -> str:
    lines = [f"# {conversation.title}", ""]
    created = time.strftime("%Y-%m-%d %H:%M", time.localtime(conversation.created_at))
    lines += [f"_Exported from Sluice; conversation started {created}._", ""]
    if conversation.settings.system_prompt:
        lines += ["## System", "", conversation.settings.system_prompt, ""]
    for message in messages:
        heading = "You" if message.role == "user" else "Assistant"
        model = message.stats.get("model")
        lines += [f"## {heading}" + (f" ({model})" if model else ""), ""]
        if message.content:
            lines += [message.content, ""]
        if message.state == "error":
            lines += [f"_This answer failed: {message.stats.get('error', 'no reason was recorded')}_", ""]
        elif message.role == "assistant" and stats_line(message.stats):
            lines += [f"_{stats_line(message.stats)}_", ""]
    return "\n".join(lines)


def to_json(conversation: Conversation, messages: list[Message]) -> str:
    data = {
        "format": "sluice-conversation/1",
        "title": conversation.title,
        "created_at": conversation.created_at,
        "settings": asdict(conversation.settings),
        "messages": [{"role": m.role, "content": m.content, "state": m.state, "stats": m.stats,
                      "created_at": m.created_at} for m in messages],
    }
    return json.dumps(data, indent=2, ensure_ascii=False)


def export_conversation(path: Path | str, conversation: Conversation, messages: list[Message]) -> Path:
    """Write Markdown or JSON depending on the file suffix (.json -> JSON, anything else -> Markdown)."""
    path = Path(path)
    text = to_json(conversation, messages) if path.suffix.lower() == ".json" else to_markdown(conversation, messages)
    path.write_text(text, encoding="utf-8")
    return path
