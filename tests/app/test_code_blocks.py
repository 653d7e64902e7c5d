"""A code block with lines far longer than the chat column: it wraps inside the column (light and dark), its
Copy link stays in view and, clicked, copies the code as written, unwrapped. Also while the answer streams."""
from PySide6.QtCore import QPoint, Qt
from PySide6.QtGui import QGuiApplication

from app_helpers import copy_link_rect, open_stored_answer

LONG_LINE = "result = compute(" + ", ".join(f"argument_{i}" for i in range(22)) + ")  # " + "why " * 10
NO_SPACES = "QUJD" * 75                                            # base64-like: no place to break a word
CODE = f"{LONG_LINE}\n    {NO_SPACES}\nprint(result)\n"
ANSWER = f"Here it is:\n\n```python\n{CODE}```\n\nThat is all."


def _assert_fits_with_copy_in_view(widget):
    body, chat_view = widget.body, widget.window().chat_view
    assert body.document().size().width() <= body.viewport().width()      # nothing runs off to the right
    assert body.document().idealWidth() <= body.viewport().width()
    rect = copy_link_rect(body).translated(body.viewport().mapTo(chat_view.viewport(), QPoint(0, 0)))
    assert rect.width() > 0 and chat_view.viewport().rect().contains(rect), (rect, chat_view.viewport().rect())


def _open_stored_answer(qtbot, data_dir):
    window, widget = open_stored_answer(qtbot, data_dir, "Long code", "One long line, please.", ANSWER)
    window.resize(1000, 700)                               # the chat alone: a 700 px column
    qtbot.waitUntil(lambda: widget.body.viewport().width() > 600)
    qtbot.wait(100)                                        # posted layout requests re-centre the column
    return window, widget


def test_a_long_code_line_wraps_inside_the_column_and_copy_stays_visible_and_exact(qtbot, data_dir):
    window, widget = _open_stored_answer(qtbot, data_dir)
    for is_dark in (False, True):
        window.chat_view.set_dark(is_dark)
        assert ("#0d1117" in widget.body.toHtml()) == is_dark              # the dark code background, or not
        _assert_fits_with_copy_in_view(widget)
        QGuiApplication.clipboard().clear()
        center = copy_link_rect(widget.body).center()          # a user's click on the link, where it is drawn
        assert widget.body.anchorAt(center) == "copy-code:0"
        with qtbot.waitSignal(widget.copy_requested):
            qtbot.mouseClick(widget.body.viewport(), Qt.MouseButton.LeftButton, pos=center)
        assert QGuiApplication.clipboard().text() == CODE      # the code as written, not as wrapped
    assert LONG_LINE in widget.rendered_text()                 # wrapping adds no line breaks to the text
    assert window.shutdown()


def test_a_streaming_long_code_line_never_widens_the_message(qtbot, data_dir):
    window, widget = _open_stored_answer(qtbot, data_dir)
    widget.set_streamed_content("")
    cut = ANSWER.index("```python") + len("```python\n")
    for end in range(cut + 40, cut + len(CODE), 60):            # inside the long line, then the unbroken one
        widget.set_streamed_content(ANSWER[:end])
        qtbot.waitUntil(lambda: ANSWER[cut:end].rstrip() in widget.rendered_text())     # shown (20 times/s at most)
        _assert_fits_with_copy_in_view(widget)
    widget.set_streamed_content(ANSWER)
    qtbot.waitUntil(lambda: widget.rendered_text().endswith("That is all."))
    _assert_fits_with_copy_in_view(widget)
    assert window.shutdown()
