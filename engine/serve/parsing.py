"""Generated text -> reasoning, content and tool calls, while it streams.

Models that think write `<think>…</think>` first (or their chat template opens the tag in the prompt).
Tool calls come in each family's own syntax (engine/serve/tool_syntax.py, chosen from the chat template),
between an opening and a closing tag; Qwen/Hermes-style templates use
`<tool_call>{"name": …, "arguments": {…}}</tool_call>`. A tag can arrive split over several tokens,
so text that may be the start of a tag is held back until the next piece decides it. A call streams as
pieces: "tool_call" (its name, and the arguments known so far), "tool_args" (more of the arguments),
"tool_end" (the call is complete; `call.arguments` is final).
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.serve.tool_syntax import HERMES, ToolCall, syntax_of

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


@dataclass
class Piece:
    kind: str                        # "reasoning" | "content" | "tool_call" | "tool_args" | "tool_end"
    text: str = ""                   # for a call's pieces: arguments text to append
    call: ToolCall | None = None


def template_features(chat_template: str | None, prompt_tail: str = "") -> dict:
    """What the model's chat template tells: does it think, does the prompt open the thought, tool syntax."""
    template = chat_template or ""
    return {"think": THINK_OPEN in template,
            "starts_in_think": prompt_tail.rstrip().endswith(THINK_OPEN),
            "tools": "tools" in template and syntax_of(template) is not None}


def _held_tail(text: str, tags: tuple[str, ...]) -> int:
    """Index from which text's end could be the beginning of one of tags (len(text) if none)."""
    for start in range(max(0, len(text) - max(len(t) for t in tags) + 1), len(text)):
        if any(t.startswith(text[start:]) for t in tags):
            return start
    return len(text)


class StreamParser:
    """Text in as it streams, pieces out: `_step(out, final)` takes what it can from `pending` (True: call again)."""
    pending = ""

    def push(self, text: str) -> list[Piece]:
        self.pending += text
        return self._drain(final=False)

    def _drain(self, final: bool) -> list[Piece]:
        out: list[Piece] = []
        while self._step(out, final=final):
            pass
        return out

    def _step(self, out: list[Piece], final: bool) -> bool:
        raise NotImplementedError


class OutputParser(StreamParser):
    def __init__(self, think: bool = False, starts_in_think: bool = False, tools: bool = False, syntax=None):
        self.think, self.tools, self.syntax = think, tools, syntax or HERMES
        self.state = "think" if starts_in_think else ("start" if think else "content")
        self.pending = ""
        self.calls: list[ToolCall] = []
        self._open: ToolCall | None = None           # the call whose arguments are streaming
        self._after_thought = False

    def flush(self) -> list[Piece]:
        out = self._drain(final=True)
        if self.state == "tool" and self.pending:        # an unterminated call: use it if it parses
            self._close_block(self.pending, out)
        elif self.pending:
            self._emit(out, "reasoning" if self.state == "think" else "content", self.pending)
        self.pending = ""
        return out

    def _emit(self, out: list[Piece], kind: str, text: str) -> None:
        if kind == "content" and self.calls and not text.strip():
            return                                       # whitespace between tool calls
        if text:
            out.append(Piece(kind, text))

    def _stream_block(self, body: str, out: list[Piece]) -> None:
        """The first call of an unfinished block: its head once the name is known, then its arguments."""
        known = self.syntax.partial(body) if self.syntax.partial else None
        if known is None:
            return
        name, arguments = known
        if self._open is None:
            self._open = ToolCall(name, arguments)
            out.append(Piece("tool_call", arguments, self._open))
        elif len(arguments) > len(self._open.arguments):
            out.append(Piece("tool_args", arguments[len(self._open.arguments):], self._open))
            self._open.arguments = arguments

    def _close_block(self, body: str, out: list[Piece]) -> None:
        found = self.syntax.parse(body)
        if not found and self._open is None:              # not a call after all: the user sees the text
            self._emit(out, "content", self.syntax.open + body + self.syntax.close)
            return
        for i, (name, arguments) in enumerate(found or [(self._open.name, self._open.arguments)]):
            call = self._open if i == 0 and self._open is not None else None
            if call is None:
                call = ToolCall(name, arguments)
                out.append(Piece("tool_call", arguments, call))
            elif arguments.startswith(call.arguments) and len(arguments) > len(call.arguments):
                out.append(Piece("tool_args", arguments[len(call.arguments):], call))
            call.arguments = arguments
            self.calls.append(call)
            out.append(Piece("tool_end", call=call))
        self._open = None

    def _step(self, out: list[Piece], final: bool) -> bool:
        """Consume what can be decided in pending; True if the state changed (run again)."""
        return getattr(self, "_in_" + self.state)(out, final)

    def _in_start(self, out: list[Piece], final: bool) -> bool:
        stripped = self.pending.lstrip()
        if stripped.startswith(THINK_OPEN):
            self.pending, self.state = stripped[len(THINK_OPEN):], "think"
            return True
        if stripped and not THINK_OPEN.startswith(stripped) or final:
            self.state = "content"
            return True
        return False

    def _in_think(self, out: list[Piece], final: bool) -> bool:
        p = self.pending
        end = p.find(THINK_CLOSE)
        if end >= 0:
            self._emit(out, "reasoning", p[:end])
            self.pending, self.state = p[end + len(THINK_CLOSE):], "content"
            self._after_thought = True
            return True
        keep = len(p) if final else _held_tail(p, (THINK_CLOSE,))
        self._emit(out, "reasoning", p[:keep])
        self.pending = p[keep:]
        return False

    def _in_content(self, out: list[Piece], final: bool) -> bool:
        p = self.pending
        if self._after_thought:                           # the newlines that follow </think> are layout
            p = self.pending = p.lstrip("\n")
            if not p:
                return False
            self._after_thought = False
        start = p.find(self.syntax.open) if self.tools else -1
        if start >= 0:
            self._emit(out, "content", p[:start])
            self.pending, self.state = p[start + len(self.syntax.open):], "tool"
            return True
        keep = len(p) if final or not self.tools else _held_tail(p, (self.syntax.open,))
        self._emit(out, "content", p[:keep])
        self.pending = p[keep:]
        return False

    def _in_tool(self, out: list[Piece], final: bool) -> bool:
        """Stream the call until its closing tag."""
        p = self.pending
        end = p.find(self.syntax.close)
        if end >= 0:
            self._close_block(p[:end], out)
            self.pending, self.state = p[end + len(self.syntax.close):], "content"
            return True
        self._stream_block(p[:_held_tail(p, (self.syntax.close,))], out)   # not a part of the closing tag
        return False
