"""A QTextDocument that shows a growing HTML (a streaming answer) by replacing only what follows its finished
prefix: setHtml of a whole long answer, and the layout of all of it again, cost the GUI thread tens of
milliseconds per refresh; an edit at the end lays out only the end."""
from __future__ import annotations

from PySide6.QtGui import QTextCursor, QTextDocument

# QTextCursor.insertHtml merges the first inserted block into the block at the cursor (the finished part's last
# one): an invisible first paragraph takes that merge and is then removed, so every inserted block keeps its own
# format, as setHtml would have given it.
_MERGED = "\u2063"          # INVISIBLE SEPARATOR, removed as soon as it has done its work


class IncrementalHtml:
    def __init__(self, document: QTextDocument):
        self.document = document
        document.setUndoRedoEnabled(False)      # edits are not the user's: no undo history to grow
        self._shown_done: str | None = None     # the finished prefix's HTML now in the document
        self._done_end = 0                      # its end: a position in the document

    def show(self, html: str, done_html: str = "") -> None:
        """Make the document what setHtml(html) would, where `done_html` starts `html` and starts every later
        `html` shown (the finished prefix: MarkdownRenderer.render_growing)."""
        if done_html.strip() and self._shown_done is not None and done_html.startswith(self._shown_done):
            self._replace_after_done(html, done_html)
        elif not done_html.strip():                # nothing finished yet: a short HTML, shown whole
            self.document.setHtml(html.rstrip())   # trailing whitespace would end the last block with a space
            self._shown_done = None
        else:
            self.document.setHtml(done_html.rstrip())
            self._shown_done, self._done_end = done_html, self._end()
            self._append(html[len(done_html):], QTextCursor(self.document))

    def _replace_after_done(self, html: str, done_html: str) -> None:
        cursor = QTextCursor(self.document)
        cursor.beginEditBlock()                    # one relayout for the whole edit
        cursor.setPosition(self._done_end)
        cursor.insertText(_MERGED)        # removing what follows an empty block (<hr />) gives it the next one's format
        cursor.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
        cursor.removeSelectedText()
        cursor.deletePreviousChar()
        self._append(done_html[len(self._shown_done):], cursor)
        self._shown_done, self._done_end = done_html, self._end()
        self._append(html[len(done_html):], cursor)
        cursor.endEditBlock()

    def _append(self, html: str, cursor: QTextCursor) -> None:
        if not html.strip():
            return
        cursor.movePosition(QTextCursor.MoveOperation.End)
        start = cursor.position()
        cursor.insertHtml(f"<p>{_MERGED}</p>{html.rstrip()}")
        cursor.setPosition(start)
        cursor.setPosition(start + 1, QTextCursor.MoveMode.KeepAnchor)
        cursor.removeSelectedText()

    def _end(self) -> int:
        return self.document.characterCount() - 1
