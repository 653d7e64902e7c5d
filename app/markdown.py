"""Chat Markdown -> the HTML subset QTextDocument renders. Qt-free.

Code blocks get Pygments colours (inline styles: QTextDocument has no real CSS) and a "Copy" link
`copy-code:N`; `<think>` sections become a one-line "Thinking" link `toggle-think:N` unless expanded; a table too
wide for the text width shows its rows as records (app.markdown_tables).
Raw HTML in model output is escaped, never rendered.
"""
from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from functools import lru_cache

from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import TextLexer, get_lexer_by_name
from pygments.util import ClassNotFound

from .markdown_tables import measure_tables, render_records

_THINK = re.compile(r"<think>(.*?)(</think>|\Z)", re.DOTALL)


@dataclass
class Rendered:
    html: str
    code_blocks: list[str] = field(default_factory=list)   # raw source of each block, by copy-code index
    num_thinks: int = 0
    table_widths: list[int] = field(default_factory=list)  # each table's, in characters (app.markdown_tables)


@dataclass
class FinishedPrefix:
    """The start of a growing text whose HTML no appended text can change (Markdown blocks that a later block
    has closed, closed <think> sections), with that HTML, so that only the rest is parsed again."""
    text: str = ""
    html: str = ""
    code_blocks: list[str] = field(default_factory=list)
    num_thinks: int = 0
    expanded_thinks: frozenset[int] = frozenset()
    table_widths: list[int] = field(default_factory=list)
    text_width_chars: int | None = None


def _pieces(text: str):
    """(start, end, None) for each Markdown stretch and (start, end, match) for each <think> section, in order."""
    cursor = 0
    for match in _THINK.finditer(text):
        yield cursor, match.start(), None
        yield match.start(), match.end(), match
        cursor = match.end()
    yield cursor, len(text), None


def _line_start(text: str, line: int) -> int:
    """The offset of line number `line` (0-based) in `text`."""
    offset = 0
    for _ in range(line):
        offset = text.index("\n", offset) + 1
    return offset


@dataclass(frozen=True)
class Palette:
    is_dark: bool

    @property
    def code_style(self) -> str:
        return "github-dark" if self.is_dark else "default"

    @property
    def code_background(self) -> str:
        return "#0d1117" if self.is_dark else "#f6f8fa"

    @property
    def code_header(self) -> str:
        return "#161b22" if self.is_dark else "#eaeef2"

    @property
    def muted(self) -> str:
        return "#8b949e" if self.is_dark else "#6e7781"

    @property
    def think_background(self) -> str:
        return "#161b22" if self.is_dark else "#f3f4f6"

    @property
    def table_border(self) -> str:
        return "#30363d" if self.is_dark else "#d0d7de"


@lru_cache(maxsize=2)
def _formatter(style: str) -> HtmlFormatter:
    return HtmlFormatter(noclasses=True, nowrap=True, style=style)


@lru_cache(maxsize=256)
def _highlight(source: str, language: str, style: str) -> str:
    # Cached: while an answer streams, every finished block is re-rendered on each refresh.
    return highlight(source, _lexer(language), _formatter(style)).rstrip("\n")


@lru_cache(maxsize=64)
def _lexer(language: str):
    try:
        return get_lexer_by_name(language) if language else TextLexer()
    except ClassNotFound:
        return TextLexer()


COMMON_LANGUAGES = ("python", "bash", "shell", "javascript", "typescript", "json", "c", "cpp", "rust", "go",
                    "java", "html", "css", "sql", "yaml", "text")


def warm_up() -> None:
    """Import the common lexers now (10-30 ms each on first use), not in the middle of a streaming answer."""
    for language in COMMON_LANGUAGES:
        _highlight("x", language, "default")


class MarkdownRenderer:
    def __init__(self, is_dark: bool = False):
        self.palette = Palette(is_dark)
        self._md = MarkdownIt("commonmark", {"html": False, "linkify": False}).enable(["table", "strikethrough"])
        self._md.core.ruler.push("measure_tables", measure_tables)
        # markdown-it calls rules as renderer methods: rule(renderer, tokens, idx, options, env)
        self._md.add_render_rule("table_open", lambda _renderer, tokens, idx, *_: self._render_table_open(tokens[idx]))
        self._md.add_render_rule("table_records", lambda renderer, tokens, idx, options, env: self._render_records(
            tokens[idx], lambda token: renderer.renderInline(token.children, options, env)))
        self._md.add_render_rule("fence", lambda _renderer, tokens, idx, *_: self._render_fence(tokens[idx]))
        self._md.add_render_rule("code_block", lambda _renderer, tokens, idx, *_: self._render_fence(tokens[idx]))
        self._blocks: list[str] = []
        self._table_widths: list[int] = []
        self._text_width_chars: int | None = None

    def render(self, text: str, expanded_thinks: frozenset[int] | set[int] = frozenset(),
               text_width_chars: int | None = None) -> Rendered:
        """`text_width_chars`: the text width, in average character widths (None: unlimited), which shapes the
        tables (app.markdown_tables)."""
        self._blocks, self._table_widths, self._text_width_chars = [], [], text_width_chars
        parts: list[str] = []
        num_thinks = 0
        for start, end, think in _pieces(text):
            if think is None:
                parts.append(self._md.render(text[start:end], self._env()))
            else:
                parts.append(self._render_think(num_thinks, think, num_thinks in expanded_thinks))
                num_thinks += 1
        return Rendered("".join(parts), list(self._blocks), num_thinks, list(self._table_widths))

    def render_growing(self, text: str, expanded_thinks: frozenset[int] | set[int], finished: FinishedPrefix,
                       text_width_chars: int | None = None) -> tuple[Rendered, FinishedPrefix]:
        """What render(text) returns, parsing only what follows `finished` (the previous call's, for a text this
        one extends), and the finished prefix of `text` for the next call. A streaming answer thus costs the
        Markdown of its last block per refresh, not of the whole answer."""
        expanded = frozenset(expanded_thinks)
        if (expanded != finished.expanded_thinks or text_width_chars != finished.text_width_chars
                or not text.startswith(finished.text) or "\r" in text):    # "\r": markdown-it would count lines
            finished = FinishedPrefix(expanded_thinks=expanded, text_width_chars=text_width_chars)
        base = len(finished.text)
        tail = text[base:]
        self._blocks, self._table_widths = list(finished.code_blocks), list(finished.table_widths)
        self._text_width_chars = text_width_chars
        done, pending = [finished.html], []               # HTML that can no longer change, and the rest
        done_end, done_blocks, num_thinks = base, len(self._blocks), finished.num_thinks
        done_thinks, done_tables = num_thinks, len(self._table_widths)
        for start, end, think in _pieces(tail):
            if think is None and end == len(tail) and not pending:      # the growing end
                env = self._env()
                finished_tokens, rest_tokens, rest_start = self._split_growing_end(tail[start:], env)
                if env.get("references") and base:       # a link definition reaches back into cached blocks
                    start_again = FinishedPrefix(expanded_thinks=expanded, text_width_chars=text_width_chars)
                    return self.render_growing(text, expanded, start_again, text_width_chars)
                if finished_tokens:
                    done.append(self._md.renderer.render(finished_tokens, self._md.options, env))
                    done_end, done_blocks, done_thinks = base + start + rest_start, len(self._blocks), num_thinks
                    done_tables = len(self._table_widths)
                pending.append(self._md.renderer.render(rest_tokens, self._md.options, env))
                continue
            if think is None:                            # a <think> follows: a Markdown text of its own
                html, is_final = self._md.render(tail[start:end], self._env()), True
            else:
                html, is_final = self._render_think(num_thinks, think, num_thinks in expanded), think.group(2) != ""
                num_thinks += 1
            if is_final and not pending:
                done.append(html)
                done_end, done_blocks, done_thinks = base + end, len(self._blocks), num_thinks
                done_tables = len(self._table_widths)
            else:
                pending.append(html)
        done_html = "".join(done)
        return (Rendered(done_html + "".join(pending), list(self._blocks), num_thinks, list(self._table_widths)),
                FinishedPrefix(text[:done_end], done_html, self._blocks[:done_blocks], done_thinks, expanded,
                               self._table_widths[:done_tables], text_width_chars))

    def _env(self, indent_chars: int = 0) -> dict:
        """The markdown-it env of one Markdown text: what measure_tables needs."""
        return {"text_width_chars": self._text_width_chars, "indent_chars": indent_chars}

    def _split_growing_end(self, markdown: str, env: dict) -> tuple[list, list, int]:
        """The tokens of `markdown` (the end of a growing text) split into those of the blocks no appended text
        can change (each one closed by a later block whose first line is written), the rest, and where the
        rest starts in `markdown`."""
        tokens = self._md.parse(markdown, env)
        tops = [i for i, token in enumerate(tokens) if token.level == 0 and token.nesting != -1]   # block starts
        if tops and "\n" not in markdown[_line_start(markdown, tokens[tops[-1]].map[0]):]:
            tops.pop()            # the last block's first line is unfinished: "2" may become "2." of the list above
        if len(tops) < 2 or env.get("references"):       # a link definition applies to the whole Markdown text
            return [], tokens, 0
        return tokens[:tops[-1]], tokens[tops[-1]:], _line_start(markdown, tokens[tops[-1]].map[0])

    def _render_think(self, index: int, think: re.Match, is_expanded: bool) -> str:
        p = self.palette
        body, is_open = think.group(1), think.group(2) == ""     # open: still streaming inside <think>
        num_words = len(body.split())
        label = "Thinking…" if is_open else f"Thought ({num_words} words)"
        arrow = "▾" if is_expanded else "▸"
        head = (f'<a href="toggle-think:{index}" style="color:{p.muted}; text-decoration:none">'
                f"{arrow} {label}</a>")
        if not is_expanded:
            return f"<p>{head}</p>"
        inner = self._md.render(body, self._env(indent_chars=3)) or "<p></p>"     # the cell's padding: 16 px
        return (f'<p>{head}</p><table width="100%" cellpadding="8" cellspacing="0" '
                f'bgcolor="{p.think_background}"><tr><td style="color:{p.muted}">{inner}</td></tr></table>')

    def _render_table_open(self, token) -> str:
        self._table_widths.append(token.meta["width_chars"])
        # solid: Qt's default style for table borders is outset, which draws their top and left sides near white
        return (f'<table border="1" cellspacing="0" cellpadding="4" style="border-collapse: collapse; '
                f'border-style: solid; border-color: {self.palette.table_border}; margin-bottom: 8px">')

    def _render_records(self, token, render_inline) -> str:
        p = self.palette
        return render_records(token.meta["rows"], render_inline, self._render_table_open(token), p.code_header, p.muted)

    def _render_fence(self, token) -> str:
        language = token.info.strip().split(" ")[0] if token.info else ""
        source = token.content
        index = len(self._blocks)
        self._blocks.append(source)
        p = self.palette
        code = _highlight(source, language.lower(), p.code_style)
        label = html.escape(language or "code")
        return (
            f'<table width="100%" cellpadding="6" cellspacing="0" bgcolor="{p.code_background}" '
            f'style="margin-top:4px; margin-bottom:8px">'
            f'<tr><td bgcolor="{p.code_header}"><span style="color:{p.muted}">{label}</span></td>'
            f'<td bgcolor="{p.code_header}" align="right"><a href="copy-code:{index}" '
            f'style="text-decoration:none">Copy</a></td></tr>'
            f'<tr><td colspan="2"><pre style="margin:0; white-space:pre-wrap">{code}</pre></td></tr></table>')
