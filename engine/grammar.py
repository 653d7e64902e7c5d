"""Structured output: a response format -> a grammar (llguidance), and the grammar's state while it generates.

llguidance is used rather than xgrammar: it has no dependencies (xgrammar pulls triton and a TVM runtime),
compiles a schema lazily in well under a millisecond (no per-tokenizer precompile of seconds), computes a
token mask in tens of microseconds, and covers the most of JSON Schema in public benchmarks (JSONSchemaBench).

    grammar = grammar_for({"type": "json_schema", "json_schema": {"schema": {...}, "strict": True}})
    constraint = Constraint(grammar, tokenizer, vocab_size, eos_ids)   # SluiceError if it cannot compile
    constraint.fill(words)      # int32 [ceil(V / 32)]: bit t of the mask = token t allowed
    constraint.accept(token)
"""
from __future__ import annotations

import json

from engine.errors import SluiceError

COMPACT = {"whitespace_flexible": False}      # no free whitespace: a sampled answer cannot wander in blanks
_TOKENIZERS: dict[tuple, tuple[object, object]] = {}


def grammar_for(response_format: dict | None) -> str | None:
    """An OpenAI-style response format -> an llguidance grammar (None for plain text). Formats:
    {"type": "json_schema", "json_schema": {"schema": {...}}}, {"type": "json_object"},
    {"type": "regex", "regex": "..."}, {"type": "grammar", "grammar": "<lark>"}."""
    import llguidance
    if not response_format:
        return None
    kind = response_format.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, overrides=COMPACT)
    if kind == "json_schema":
        spec = response_format.get("json_schema", response_format)
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise SluiceError("A json_schema response format needs its schema as a JSON object ('json_schema.schema').")
        return llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=COMPACT)
    if kind == "regex" and isinstance(response_format.get("regex"), str):
        return llguidance.LLMatcher.grammar_from_regex(response_format["regex"])
    if kind == "grammar" and isinstance(response_format.get("grammar"), str):
        return llguidance.LLMatcher.grammar_from_lark(response_format["grammar"])
    raise SluiceError(f"Unknown response format {kind!r}: use text, json_object, json_schema, regex or grammar.")


def response_format_for_setting(text: str) -> dict | None:
    """The app's "Structured output" chat setting ("" off, "json" any JSON object, else a JSON Schema's text)
    as an OpenAI-style response format: grammar_for's input, or what a remote endpoint is sent."""
    text = (text or "").strip()
    if not text:
        return None
    if text.lower() == "json":
        return {"type": "json_object"}
    try:
        schema = json.loads(text)
    except ValueError as exc:
        raise SluiceError(f"The structured output setting is neither 'json' nor a JSON Schema ({exc}); "
                          f"fix it in the chat settings.") from None
    if not isinstance(schema, dict):
        raise SluiceError("The structured output setting must be 'json' or a JSON Schema object.")
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


def ll_tokenizer(tokenizer, vocab_size: int, eos_ids=()):
    """llguidance's view of a Hugging Face tokenizer, built once per (tokenizer, vocabulary size)."""
    import llguidance.hf
    key = (id(tokenizer), vocab_size, frozenset(eos_ids))
    if key not in _TOKENIZERS:
        eos = sorted(eos_ids) or None
        _TOKENIZERS[key] = (tokenizer, llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=eos))
    return _TOKENIZERS[key][1]


def check(grammar: str, tokenizer, vocab_size: int, eos_ids=()) -> None:
    """SluiceError naming the part of the schema or grammar that llguidance cannot compile."""
    import llguidance
    _refuse(llguidance.LLMatcher.validate_grammar(grammar, ll_tokenizer(tokenizer, vocab_size, eos_ids)))


def check_setting(text: str) -> None:
    """SluiceError in one sentence where the app's "Structured output" setting cannot be used: neither 'json'
    nor a JSON Schema, or a schema llguidance cannot compile (checked without a model)."""
    import llguidance
    response_format = response_format_for_setting(text)
    if response_format is not None:
        _refuse(llguidance.LLMatcher.validate_grammar(grammar_for(response_format), None))


def _refuse(problem: str) -> None:
    if problem:
        lines = [line.strip() for line in problem.splitlines() if line.strip().strip("^")]   # no caret lines
        raise SluiceError(f"The response format cannot be used: {' '.join(lines)}")


class Constraint:
    """One generation's grammar state: the allowed tokens now, advanced by each chosen token (host side)."""

    def __init__(self, grammar: str, tokenizer, vocab_size: int, eos_ids=()):
        import llguidance
        check(grammar, tokenizer, vocab_size, eos_ids)
        self.matcher = llguidance.LLMatcher(ll_tokenizer(tokenizer, vocab_size, eos_ids), grammar)
        self.num_words = (vocab_size + 31) // 32

    def fill(self, words) -> None:
        """Write the mask into `words` (a contiguous host int32 tensor of num_words)."""
        self.matcher.unsafe_compute_mask_ptr(words.data_ptr(), self.num_words * 4)

    def accept(self, token: int) -> None:
        if not self.matcher.consume_token(token):
            raise SluiceError(f"The grammar refused token {token} ({self.matcher.get_error()}).")

    @property
    def is_done(self) -> bool:
        return self.matcher.is_stopped()

