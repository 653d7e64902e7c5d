"""A model's chat template applied to messages: its failures are one sentence, not a jinja2 traceback.

A template that cannot compile (a syntax error, an unknown filter) is the model folder's fault; one that
refuses these messages (its `raise_exception`, or a runtime error on them) is the messages'.
"""
from __future__ import annotations

from engine.errors import SluiceError


def apply(tokenizer, messages: list, tools: list | None) -> list[int]:
    """Prompt ids of `messages` (with the generation prompt), or SluiceError."""
    import jinja2
    try:
        ids = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True)
    except jinja2.TemplateSyntaxError as exc:
        where = f" at line {exc.lineno}" if exc.lineno else ""
        raise SluiceError(f"The chat template of the model in '{tokenizer.name_or_path}' is broken ({exc.message}{where}); "
                          "fix chat_template.jinja there or repack the model from a working snapshot.") from None
    except Exception as exc:           # raise_exception('...') in the template, or an error on these messages
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SluiceError(f"The model's chat template refused these messages ({detail.rstrip('.')}).") from None
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
