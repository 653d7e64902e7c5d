"""Export a conversation to Markdown or JSON. Qt-free."""
from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

from .store import Conversation, Message


def stats_line(stats: dict) -> str:
    """'12.3 tok/s · TTFT 0.42 s · 87 tokens · stopped' (parts that are known)."""
    parts = []
    if stats.get("tok_s"):
        parts.append(f"{stats['tok_s']:.1f} tok/s")
    if stats.get("ttft_s") is not None:
        parts.append(f"TTFT {stats['ttft_s']:.2f} s")
    if stats.get("num_tokens"):
        parts.append(f"{stats['num_tokens']} tokens")
    reason = stats.get("finish_reason")
    if reason in ("cancelled", "length"):
        parts.append({"cancelled": "stopped", "length": "max tokens reached"}[reason])
    return " · ".join(parts)


def to_markdown(conversation: Conversation, messages: list[Message]) -> str:
    lines = [f"# {conversation.title}", ""]
    created = time.strftime("%Y-%m-%d %H:%M", time.localtime(conversation.created_at))
    lines += [f"_Exported from Sluice; conversation started {created}._", ""]
    if conversation.settings.system_prompt:
        lines += ["## System", "", conversation.settings.system_prompt, ""]
    for message in messages:
        heading = "You" if message.role == "user" else "Assistant"
        model = message.stats.get("model")
        lines += [f"## {heading}" + (f" ({model})" if model else ""), "", message.content, ""]
        if message.role == "assistant" and stats_line(message.stats):
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
