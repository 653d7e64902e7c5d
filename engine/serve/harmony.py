"""gpt-oss's harmony output, parsed from text (special tokens kept in the text): messages of the form
`<|channel|>analysis<|message|>…<|end|>`, `<|start|>assistant<|channel|>commentary to=functions.f
<|constrain|>json<|message|>{…}<|call|>` and `<|channel|>final<|message|>…<|return|>`.

The `openai-harmony` package parses token ids of the o200k vocabulary and downloads that vocabulary at
first use, which a machine without internet access cannot; this reads the same format from the text.
Same interface as parsing.OutputParser: push / flush give Pieces, `calls` holds the finished calls.
"""
from __future__ import annotations

import re

from engine.serve.parsing import Piece, StreamParser, _held_tail
from engine.serve.tool_syntax import ToolCall

MESSAGE = "<|message|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>", "<|start|>")


class HarmonyParser(StreamParser):
    def __init__(self, think: bool = True, starts_in_think: bool = False, tools: bool = False):
        self.think, self.tools = think, tools
        self.pending, self.state = "", "header"
        self.kind: str = "content"                   # what the current message's body is
        self.calls: list[ToolCall] = []
        self._call: ToolCall | None = None
        self._saw_header = False

    def flush(self) -> list[Piece]:
        out = self._drain(final=True)
        if self.state == "header" and self.pending and not self._saw_header:
            out.append(Piece("content", self.pending))     # a model that ignored the format: plain text
        self._end_message(out)
        self.pending = ""
        return out

    def _open(self, header: str, out: list[Piece]) -> None:
        channel = re.search(r"<\|channel\|>\s*(\w+)", header)
        recipient = re.search(r"to=functions\.([\w.\-]+)", header)
        self._saw_header = True
        if recipient and self.tools:
            self.kind, self._call = "tool", ToolCall(recipient.group(1), "")
            out.append(Piece("tool_call", "", self._call))
        elif channel and channel.group(1) == "analysis":
            self.kind = "reasoning" if self.think else "content"
        else:
            self.kind = "content"

    def _body(self, text: str, out: list[Piece]) -> None:
        if not text:
            return
        if self.kind == "tool":
            self._call.arguments += text
            out.append(Piece("tool_args", text, self._call))
        else:
            out.append(Piece(self.kind, text))

    def _end_message(self, out: list[Piece]) -> None:
        if self.state == "body" and self._call is not None:
            if not self._call.arguments.strip():             # a call without arguments: an empty object
                self._body("{}", out)
            self.calls.append(self._call)
            out.append(Piece("tool_end", call=self._call))
        self._call, self.state = None, "header"

    def _step(self, out: list[Piece], final: bool) -> bool:
        p = self.pending
        if self.state == "header":
            start = p.find(MESSAGE)
            if start < 0:
                return False
            self._open(p[:start], out)
            self.pending, self.state = p[start + len(MESSAGE):], "body"
            return True
        ends = [i for i in (p.find(e) for e in ENDS) if i >= 0]
        if ends:
            end = min(ends)
            self._body(p[:end], out)
            self._end_message(out)
            self.pending = p[end:].removeprefix("<|end|>").removeprefix("<|call|>").removeprefix("<|return|>")
            return True
        keep = len(p) if final else _held_tail(p, ENDS)
        self._body(p[:keep], out)
        self.pending = p[keep:]
        return False
