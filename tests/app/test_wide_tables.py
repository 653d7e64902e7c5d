"""Wide tables and long words in an answer stay inside the chat column, light and dark, stored and streaming, at a
wide and a narrow column: a table whose columns can each show their longest word keeps its grid (its cells wrap,
only a URL or a path breaks); one that cannot shows each row as a record of `header | value` lines. Nothing is
drawn right of the view, nothing is lost, no ordinary word is cut in two, and a table that fits renders as it
always did."""
import numpy as np
from PySide6.QtCore import QPoint
from PySide6.QtGui import QColor, QFontMetricsF, QImage, QPainter, QTextCursor, QTextFrameFormat, QTextTable

from app_helpers import copy_link_rect, open_stored_answer
from app.markdown import MarkdownRenderer
from app.markdown_tables import MAX_WORD_CHARS

HEADERS = ["Model", "Total parameters", "Active parameters", "Experts", "Top-k", "Context", "License"]
COMPARISON = ("| " + " | ".join(HEADERS) + " |\n|" + "---|" * len(HEADERS) + "\n"
              "| Mixtral 8x7B | 46.7 billion | 12.9 billion | 8 | 2 | 32k tokens | Apache 2.0 |\n"
              "| Qwen3-30B-A3B | 30.5 billion | 3.3 billion | 128 | 8 | 128k tokens | Apache 2.0, open weights |\n")
LONG_URL = "https://huggingface.co/organisation/" + "a-very-long-repository-name-" * 6 + "end/resolve/main/config.json"
LONG_PATH = "/home/user/.cache/sluice/models/" + "nested_directory_" * 10 + "/experts.bin"
LOCATIONS = f"| file | where |\n|---|---|\n| config | {LONG_URL} |\n| experts | `{LONG_PATH}` |\n"
MANY = ("| " + " | ".join(f"layer {i}" for i in range(24)) + " |\n|" + "---|" * 24 + "\n"      # never fits
        "| " + " | ".join(f"{i * 3} ms" for i in range(24)) + " |\n")
NARROW = "| quant | bits |\n|---|---|\n| fp8 | 8 |\n| nvfp4 | 4 |\n"
ANSWER = (f"Here is the comparison:\n\n{COMPARISON}\nWhere the files are:\n\n{LOCATIONS}\nTimings per layer:\n\n"
          f"{MANY}\nAnd the bits:\n\n{NARROW}\nThe same link in a sentence: {LONG_URL} and the path `{LONG_PATH}`.\n\n"
          f"# {'Expert' * 30}\n\n```python\nprint('load')\n```\n\nThat is all.")


def _drawn_width(body) -> int:
    """How far to the right the whole document draws (px), painted without the view's clipping."""
    document = body.document()
    width = int(max(document.size().width(), document.idealWidth(), body.viewport().width())) + 100
    image = QImage(width, int(document.size().height()) + 1, QImage.Format.Format_ARGB32)
    image.fill(QColor(0, 0, 0, 0))
    painter = QPainter(image)
    document.drawContents(painter)
    painter.end()
    alpha = np.frombuffer(image.constBits(), np.uint8).reshape(image.height(), image.bytesPerLine() // 4, 4)[..., 3]
    return int(np.nonzero(alpha.max(axis=0))[0].max()) + 1


def _words_cut_in_two(body) -> list[str]:
    """The words of at most MAX_WORD_CHARS that the document's line breaks cut (not after a "-" or a "/") in a line
    narrower than the word. A line less than a pixel too narrow is Qt's: with collapsed borders it may round the
    width of a column that its text fits exactly down, and the text's last character wraps."""
    cut, block = [], body.document().begin()
    while block.isValid():
        layout, text = block.layout(), block.text()
        for line in (layout.lineAt(i) for i in range(layout.lineCount() - 1)):
            end = line.textStart() + line.textLength()
            if text[end - 1] not in " -/" and not text[end].isspace():
                start = max(text.rfind(" ", 0, end), text.rfind("/", 0, end)) + 1
                stop = min(position for position in (text.find(" ", end), text.find("/", end), len(text))
                           if position >= 0)
                cursor = QTextCursor(block)
                cursor.setPosition(block.position() + start + 1)
                word_px = QFontMetricsF(cursor.charFormat().font()).horizontalAdvance(text[start:stop])
                if stop - start <= MAX_WORD_CHARS and line.width() < word_px - 1:
                    cut.append(text[start:stop])
        block = block.next()
    return cut


def _table(body, first_cell: str) -> QTextTable:
    """The document's table whose first cell reads `first_cell`."""
    for frame in body.document().rootFrame().childFrames():
        if isinstance(frame, QTextTable) and frame.cellAt(0, 0).firstCursorPosition().block().text() == first_cell:
            return frame
    raise AssertionError(f"no table starts with {first_cell!r}")


def _table_columns(body, first_cell: str) -> int:
    return _table(body, first_cell).columns()


def _assert_fits(widget):
    body = widget.body
    assert _drawn_width(body) <= body.viewport().width()            # nothing runs off to the right
    assert _words_cut_in_two(body) == []
    link = copy_link_rect(body).translated(body.viewport().mapTo(widget.window().chat_view.viewport(), QPoint(0, 0)))
    assert 0 < link.left() < link.right() < widget.window().chat_view.viewport().width()   # the Copy link in view
    text = widget.rendered_text()
    for word in [*HEADERS, "Mixtral 8x7B", "Apache 2.0, open weights", "layer 23", "69 ms", "nvfp4"]:
        assert word in text                                          # nothing lost
    assert "".join(text.split()).count(LONG_URL) == 2 and "".join(text.split()).count(LONG_PATH) == 2


def _open_stored_answer(qtbot, data_dir):
    return open_stored_answer(qtbot, data_dir, "Wide tables", "Compare them, please.", ANSWER)


def _resize(qtbot, window, widget, width):
    """The window `width` px wide: 1000 gives the chat a 700 px column, 600 one of about 500 px."""
    window.resize(width, 700)
    qtbot.waitUntil(lambda: (widget.body.viewport().width() > 600) == (width >= 1000))
    qtbot.wait(100)                                        # posted layout requests re-centre the column


def test_wide_tables_and_long_words_stay_inside_a_wide_and_a_narrow_column(qtbot, data_dir):
    window, widget = _open_stored_answer(qtbot, data_dir)
    for width, comparison in ((1000, "Model"), (600, "Model Mixtral 8x7B"), (1000, "Model")):
        _resize(qtbot, window, widget, width)
        for is_dark in (False, True):
            window.chat_view.set_dark(is_dark)
            _assert_fits(widget)
            assert _table_columns(widget.body, comparison) == (len(HEADERS) if comparison == "Model" else 2)
            assert _table_columns(widget.body, "layer 0 0 ms") == 2          # a record per row, at any width
            assert _table_columns(widget.body, "file") == 2 and _table_columns(widget.body, "quant") == 2   # grids
            for first_cell in ("file", "layer 0 0 ms"):                     # 1 px lines in the theme's colour
                table_format = _table(widget.body, first_cell).format()
                assert table_format.border() == 1 and table_format.borderStyle() == QTextFrameFormat.BorderStyle_Solid
                assert table_format.borderBrush().color().name() == ("#30363d" if is_dark else "#d0d7de")
    assert window.shutdown()


def test_a_streaming_wide_table_never_widens_the_message_and_ends_as_the_stored_one(qtbot, data_dir):
    window, widget = _open_stored_answer(qtbot, data_dir)
    _resize(qtbot, window, widget, 600)
    stored_html = widget.body.toHtml()
    widget.set_streamed_content("")
    for end in range(40, len(ANSWER), 90):
        with qtbot.waitSignal(widget.body.document().contentsChanged):          # shown (20 times/s at most)
            widget.set_streamed_content(ANSWER[:end])
        assert _drawn_width(widget.body) <= widget.body.viewport().width() and _words_cut_in_two(widget.body) == []
    widget.set_streamed_content(ANSWER)
    qtbot.waitUntil(lambda: widget.rendered_text().endswith("That is all."))
    _assert_fits(widget)
    assert widget.body.toHtml() == stored_html
    assert window.shutdown()


def test_a_table_that_fits_renders_exactly_as_without_a_width_limit():
    limited, unlimited = MarkdownRenderer(), MarkdownRenderer()
    width = unlimited.render(COMPARISON).table_widths[0]
    assert limited.render(NARROW, text_width_chars=20).html == unlimited.render(NARROW).html
    assert limited.render(COMPARISON, text_width_chars=width).html == unlimited.render(COMPARISON).html
    assert "<th" not in limited.render(COMPARISON, text_width_chars=width - 1).html          # records instead
