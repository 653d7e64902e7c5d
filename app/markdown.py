"""Chat Markdown -> the HTML subset QTextDocument renders. Qt-free.

Code blocks get Pygments colours (inline styles: QTextDocument has no real CSS) and a "Copy" link
`copy-code:N`; `<think>` sections become a one-line "Thinking" link `toggle-think:N` unless expanded.
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

_THINK = re.compile(r"<think>(.*?)(</think>|\Z)", re.DOTALL)


@dataclass
class Rendered:
    html: str
    code_blocks: list[str] = field(default_factory=list)   # raw source of each block, by copy-code index
    num_thinks: int = 0


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
        border = "#30363d" if is_dark else "#d0d7de"
        self._md.add_render_rule("table_open", lambda *_: (
            f'<table border="1" cellspacing="0" cellpadding="4" style="border-collapse: collapse; '
            f'border-color: {border}; margin-bottom: 8px">'))
        # markdown-it calls rules as renderer methods: rule(renderer, tokens, idx, options, env)
        self._md.add_render_rule("fence", lambda _renderer, tokens, idx, *_: self._render_fence(tokens[idx]))
        self._md.add_render_rule("code_block", lambda _renderer, tokens, idx, *_: self._render_fence(tokens[idx]))
        self._blocks: list[str] = []

    def render(self, text: str, expanded_thinks: frozenset[int] | set[int] = frozenset()) -> Rendered:
        self._blocks = []
        parts: list[str] = []
        cursor = 0
        num_thinks = 0
        for index, match in enumerate(_THINK.finditer(text)):
            parts.append(self._md.render(text[cursor:match.start()]))
            is_open = match.group(2) == ""        # still streaming inside <think>
            parts.append(self._render_think(index, match.group(1), is_open, index in expanded_thinks))
            cursor = match.end()
            num_thinks += 1
        parts.append(self._md.render(text[cursor:]))
        return Rendered("".join(parts), list(self._blocks), num_thinks)

    def _render_think(self, index: int, body: str, is_open: bool, is_expanded: bool) -> str:
        p = self.palette
        num_words = len(body.split())
        label = "Thinking…" if is_open else f"Thought ({num_words} words)"
        arrow = "▾" if is_expanded else "▸"
        head = (f'<a href="toggle-think:{index}" style="color:{p.muted}; text-decoration:none">'
                f"{arrow} {label}</a>")
        if not is_expanded:
            return f"<p>{head}</p>"
        inner = self._md.render(body) or "<p></p>"
        return (f'<p>{head}</p><table width="100%" cellpadding="8" cellspacing="0" '
                f'bgcolor="{p.think_background}"><tr><td style="color:{p.muted}">{inner}</td></tr></table>')

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
            f'<tr><td colspan="2"><pre style="margin:0">{code}</pre></td></tr></table>')
