"""Incremental detokenizer: emits only complete UTF-8 text, and holds back possible stop strings.

Stop strings are matched as the text streams in, one Knuth-Morris-Pratt automaton per stop string: each new
character costs amortized O(1) per stop string, whatever the stop strings' lengths, and only the tail that can
still become a stop string is held back.
"""
from __future__ import annotations


class StopMatcher:
    """Streams text past one stop string. `matched` is the length of the longest suffix of the text fed so far
    that is a prefix of the stop string; it equals len(stop) once the stop string has appeared."""

    def __init__(self, stop: str):
        self.stop = stop
        self.matched = 0
        self._fail = [0]     # KMP failure function of stop[:i+1], extended only as far as a match has reached

    def feed(self, char: str) -> bool:
        """Advance by one character; True when the stop string ends here."""
        stop, q = self.stop, self.matched
        while q > 0 and stop[q] != char:
            q = self._failure(q - 1)
        if stop[q] == char:
            q += 1
        self.matched = q
        return q == len(stop)

    def _failure(self, i: int) -> int:
        fail, stop = self._fail, self.stop
        while len(fail) <= i:              # extend: fail[j] depends only on fail[:j]
            j, k = len(fail), fail[-1]
            while k > 0 and stop[j] != stop[k]:
                k = fail[k - 1]
            fail.append(k + 1 if stop[j] == stop[k] else 0)
        return fail[i]


class IncrementalDetokenizer:
    def __init__(self, tokenizer, stop: list[str] | None = None, keep_special: bool = False):
        self.tokenizer, self.keep_special = tokenizer, keep_special
        self.stop = [s for s in (stop or []) if s]
        self._matchers = [StopMatcher(s) for s in self.stop]
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
        prefix_text, new_text = self._window()
        if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
            return ""                # an incomplete UTF-8 sequence: wait for the next token
        self._prefix_offset, self._read_offset = self._read_offset, len(self.ids)
        return self._release(new_text[len(prefix_text):])

    def flush(self) -> str:
        """Text still held back at the end: an unfinished character (as U+FFFD, as a whole decode of the ids shows
        it) and an unfinished stop-string prefix. With it, the pieces add up to the decode of all the ids."""
        prefix_text, new_text = self._window()
        self._prefix_offset = self._read_offset = len(self.ids)
        text = self._release(new_text[len(prefix_text):]) if len(new_text) > len(prefix_text) else ""
        text, self._pending = text + ("" if self.stopped else self._pending), ""
        return text

    def _window(self) -> tuple[str, str]:
        """The decode of the ids already emitted in the window, and of the whole window (prefix_offset on)."""
        return (self._decode(self.ids[self._prefix_offset:self._read_offset]),
                self._decode(self.ids[self._prefix_offset:]))

    def _release(self, text: str) -> str:
        if self.stopped:
            return ""
        if not self._matchers:
            return text
        start = len(self._pending)
        self._pending += text
        for offset, char in enumerate(text):
            ended = [m for m in self._matchers if m.feed(char)]
            if ended:
                self.stopped = True
                cut = start + offset + 1 - max(len(m.stop) for m in ended)
                out, self._pending = self._pending[:cut], ""
                return out
        hold = max(m.matched for m in self._matchers)
        out = self._pending[:len(self._pending) - hold]
        self._pending = self._pending[len(self._pending) - hold:]
        return out
