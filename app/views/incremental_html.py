"""A QTextDocument that shows a growing HTML (a streaming answer) by replacing only what follows its finished
prefix: setHtml of a whole long answer, and the layout of all of it again, cost the GUI thread tens of
milliseconds per refresh; an edit at the end lays out only the end."""
from __future__ import annotations

import re

from PySide6.QtGui import QTextCursor, QTextDocument

# QTextCursor.insertHtml merges the first inserted block into the block at the cursor (the finished part's last
# one): an invisible first paragraph takes that merge and is then removed, so every inserted block keeps the
# format setHtml would have given it. tests/app/test_markdown_growing.py compares the two at every prefix.
_MERGED = "\u2063"          # INVISIBLE SEPARATOR, removed as soon as it has done its work
# setHtml makes no block of an empty element ("- " or "#" alone in Markdown, an empty code block) that more HTML
# follows, and drops an <hr /> after a table that ends in an empty cell, where a document edited at its end would
# not. So a finished part that ends in one is no place to cut, and HTML to append that holds one before more is
# shown whole: rare, as one at the very end is harmless (the empty cells of a table row still streaming).
_EMPTY_ELEMENT = re.compile(r"<(li|h[1-6]|blockquote|pre)\b[^>]*>\s*</\1>"
                            r"|<(td|th)\b[^>]*>\s*</\2>(?=\s*</tr>\s*(</tbody>|</thead>)?\s*</table>)")
_CLOSING_TAGS_TO_THE_END = re.compile(r"(\s*</[a-z0-9]+>)*\s*\Z")


def _holds_an_empty_element_before_more(html: str, start: int) -> bool:
    return any(not _CLOSING_TAGS_TO_THE_END.match(html, match.end()) for match in _EMPTY_ELEMENT.finditer(html, start))


def _ends_in_an_empty_element(html: str) -> bool:
    last_open = html.rfind("<")
    while last_open > 0 and html.startswith("</", last_open):
        last_open = html.rfind("<", 0, last_open)
    match = _EMPTY_ELEMENT.match(html, max(last_open, 0))
    return bool(match and _CLOSING_TAGS_TO_THE_END.match(html, match.end()))


class IncrementalHtml:
    def __init__(self, document: QTextDocument):
        self.document = document
        document.setUndoRedoEnabled(False)      # edits are not the user's: no undo history to grow
        self._shown_done: str | None = None     # the finished prefix's HTML now in the document
        self._done_end = 0                      # its end: a position in the document

    def show(self, html: str, done_html: str = "") -> None:
        """Make the document what setHtml(html) would, where `done_html` starts `html` and starts every later
        `html` shown (the finished prefix: MarkdownRenderer.render_growing)."""
        can_cut_at_done = bool(done_html.strip()) and not _ends_in_an_empty_element(done_html)
        if (self._shown_done is not None and done_html.startswith(self._shown_done)
                and not _holds_an_empty_element_before_more(html, len(self._shown_done))):
            cursor = QTextCursor(self.document)
            cursor.beginEditBlock()                # one relayout for the whole edit
            self._remove_after_done(cursor)
            if can_cut_at_done:
                self._append(done_html[len(self._shown_done):], cursor)
                self._shown_done, self._done_end = done_html, self._end()
            self._append(html[len(self._shown_done):], cursor)
            cursor.endEditBlock()
        elif can_cut_at_done and not _holds_an_empty_element_before_more(html, len(done_html)):
            # Trailing whitespace would end the last block with a space (and differ once more follows).
            self.document.setHtml(done_html.rstrip())
            self._shown_done, self._done_end = done_html, self._end()
            self._append(html[len(done_html):], QTextCursor(self.document))
        else:                                      # nothing finished yet, or no place to cut: the whole, at once
            self.document.setHtml(html.rstrip())
            self._shown_done = None

    def _remove_after_done(self, cursor: QTextCursor) -> None:
        cursor.setPosition(self._done_end)
        cursor.insertText(_MERGED)        # removing what follows an empty block (<hr />) gives it the next one's format
        cursor.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
        cursor.removeSelectedText()
        cursor.deletePreviousChar()

    def _append(self, html: str, cursor: QTextCursor) -> None:
        if not html.strip():
            return
        cursor.movePosition(QTextCursor.MoveOperation.End)
        start = cursor.position()
        cursor.insertText(_MERGED)     # an empty block here (after a table, an <hr />) would take the merged format
        cursor.insertHtml(f"<p>{_MERGED}</p>{html.rstrip()}")
        cursor.setPosition(start)
        cursor.setPosition(start + 2, QTextCursor.MoveMode.KeepAnchor)
        cursor.removeSelectedText()

    def _end(self) -> int:
        return self.document.characterCount() - 1
