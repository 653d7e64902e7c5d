"""Incremental detokenizer: emits only complete UTF-8 text, and holds back possible stop strings."""
from __future__ import annotations


class IncrementalDetokenizer:
    def __init__(self, tokenizer, stop: list[str] | None = None, keep_special: bool = False):
        self.tokenizer, self.keep_special = tokenizer, keep_special
        self.stop = [s for s in (stop or []) if s]
        self.ids: list[int] = []
        self._prefix_offset = 0      # ids[prefix_offset:read_offset] decode to text already emitted
        self._read_offset = 0
        self._pending = ""           # decoded text held back (could start a stop string)
        self.stopped = False

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=not self.keep_special, clean_up_tokenization_spaces=False)

    def push(self, token_id: int) -> str:
        """Add one token; return the newly complete text (may be empty)."""
        self.ids.append(token_id)
        prefix_text = self._decode(self.ids[self._prefix_offset:self._read_offset])
        new_text = self._decode(self.ids[self._prefix_offset:])
        if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
            return ""                # an incomplete UTF-8 sequence: wait for the next token
        self._prefix_offset, self._read_offset = self._read_offset, len(self.ids)
        return self._release(new_text[len(prefix_text):])

    def flush(self) -> str:
        """Text still held back at the end (an unfinished stop-string prefix)."""
        text, self._pending = ("" if self.stopped else self._pending), ""
        return text

    def _release(self, text: str) -> str:
        if self.stopped:
            return ""
        self._pending += text
        for stop in self.stop:
            index = self._pending.find(stop)
            if index >= 0:
                self.stopped = True
                out, self._pending = self._pending[:index], ""
                return out
        hold = max((n for s in self.stop for n in range(len(s) - 1, 0, -1) if self._pending.endswith(s[:n])), default=0)
        out = self._pending[:len(self._pending) - hold]
        self._pending = self._pending[len(self._pending) - hold:]
        return out
