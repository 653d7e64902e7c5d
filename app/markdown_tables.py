"""Markdown tables in a text of limited width. Qt-free.

QTextDocument lays out a table whose cells do not all fit on one line thus: every column starts one character wide,
then, from the first column to the last, each takes its share of the width left, up to its one-line width (so the
last columns get what the first ones leave). Words then wrap, a word longer than its column breaks in pieces, and a
table with more columns than characters runs off the view.

So the narrowest text width at which that gives every column its longest word (up to MAX_WORD_CHARS: a URL or a
path breaks where it must) is worked out, in characters. A table no wider than the text width the view gives
(`text_width_chars`) stays a grid, as it always was; a wider one shows each row as a record: its first cell as its
title, every other cell beside its header, in a table of two columns, which fits any width.
"""
from __future__ import annotations

import math

from markdown_it.rules_core import StateCore
from markdown_it.token import Token

MIN_WORD_CHARS, MAX_WORD_CHARS = 3, 12     # the longest word counts within these limits
CELL_PADDING_CHARS = 2                     # 2 x 4 px of cell padding and a 1 px border
MIN_COLUMN_CHARS = 1 + CELL_PADDING_CHARS  # where QTextDocument starts each column: its widest character
BOLD_WIDTH = 1.15                          # a header's bold characters are this much wider
# QTextDocument indents a list level 40 px and a quote 80 px (40 on each side): 6 and 12 characters of 6.75 px,
# and one to spare
_INDENT_CHARS = {"bullet_list_open": 7, "ordered_list_open": 7, "blockquote_open": 14}


def measure_tables(state: StateCore) -> None:
    """Core rule: note on each table its width in characters (its indent included; `env["indent_chars"]` for the
    Markdown text's own), and turn each one wider than `env["text_width_chars"]` into a `table_records` token."""
    text_width = state.env.get("text_width_chars")
    indents = [state.env.get("indent_chars", 0)]               # the indent of each open block
    tokens, index = state.tokens, 0
    while index < len(tokens):
        token = tokens[index]
        if token.nesting == -1:
            indents.pop()
        elif token.nesting == 1:
            indents.append(indents[-1] + _INDENT_CHARS.get(token.type, 0))
        if token.type == "table_open":
            end = next(i for i in range(index, len(tokens)) if tokens[i].type == "table_close")
            rows = [[cell for cell in tokens[start:stop] if cell.type == "inline"]
                    for start, stop in _rows(tokens, index, end)]
            columns = list(zip(*rows))
            width = indents[-2] + _grid_chars([_line_chars(column) for column in columns],
                                              [_longest_word_chars(column) for column in columns])
            token.meta["width_chars"] = width
            if text_width is not None and width > text_width:
                indents.pop()                            # the table's own: its closing token goes too
                tokens[index:end + 1] = [Token("table_records", "table", 0, map=token.map, level=token.level,
                                               block=True, meta={"width_chars": width, "rows": rows})]
        index += 1


def _rows(tokens: list[Token], start: int, end: int):
    """(start, stop) of each row's tokens in tokens[start:end], the header row first."""
    row_start = 0
    for index in range(start, end):
        if tokens[index].type == "tr_open":
            row_start = index
        elif tokens[index].type == "tr_close":
            yield row_start, index


def _grid_chars(lines: list[int], words: list[int]) -> int:
    """The narrowest text width at which QTextDocument's layout gives each column its longest word (`words`) or
    its one-line width (`lines`), whichever is less."""
    needs = [min(line, word) for line, word in zip(lines, words)]
    narrow, wide = sum(needs) - 1, sum(lines)           # too narrow, and wide enough (every cell on one line)
    while wide - narrow > 1:                             # more width never gives a column less
        middle = (narrow + wide) // 2
        if all(width >= need for width, need in zip(_column_widths(lines, middle), needs)):
            wide = middle
        else:
            narrow = middle
    return wide


def _column_widths(lines: list[int], text_width: int) -> list[float]:
    """The widths QTextDocument gives columns of one-line widths `lines` in `text_width` characters, when they do
    not all fit (qtextdocumentlayout.cpp, layoutTable: "for variable columns distribute the remaining space")."""
    widths = [float(MIN_COLUMN_CHARS)] * len(lines)
    left = text_width - sum(widths)
    while left > 0:
        left_before = left
        for index, line in enumerate(lines):
            grow = max(0.0, min(line - widths[index], left / (len(lines) - index)))
            widths[index] += grow
            left -= grow
        if left >= left_before:
            break
    return widths


def _longest_word_chars(column: tuple[Token, ...]) -> int:
    """The width of a column's longest word, within limits, with its cell padding. `column` holds the inline token
    of each of its cells, the header's first."""
    header, *cells = column
    longest = max([math.ceil(len(word) * BOLD_WIDTH) for word in _text(header).split()]
                  + [len(word) for cell in cells for word in _text(cell).split()], default=0)
    return min(max(longest, MIN_WORD_CHARS), MAX_WORD_CHARS) + CELL_PADDING_CHARS


def _line_chars(column: tuple[Token, ...]) -> int:
    """The width of a column with each cell on one line, with its cell padding."""
    header, *cells = column
    longest = max([math.ceil(len(_text(header)) * BOLD_WIDTH)] + [len(_text(cell)) for cell in cells])
    return longest + CELL_PADDING_CHARS


def _text(cell: Token) -> str:
    return "".join(child.content for child in cell.children or () if child.type in ("text", "code_inline"))


def render_records(rows: list[list[Token]], render_inline, table_open: str, title_background: str,
                   label_color: str) -> str:
    """The records of a table: `rows` holds each row's inline tokens, the header's first; `render_inline` renders
    one; `table_open` is the <table> tag of a grid, whose borders and padding the records keep."""
    header, body = rows[0], rows[1:] or [[]]                 # a table with its header alone: the header's names
    labels = [f'<span style="color:{label_color}">{render_inline(cell)}</span>' for cell in header]
    parts = [table_open]
    for row in body:
        values = [render_inline(cell) for cell in row] or [""] * len(header)
        parts.append(f'<tr><td colspan="2" bgcolor="{title_background}">{labels[0]} <b>{values[0]}</b></td></tr>')
        parts.extend(f"<tr><td>{label}</td><td>{value}</td></tr>" for label, value in zip(labels[1:], values[1:]))
    return "".join(parts) + "</table>\n"
