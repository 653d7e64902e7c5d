"""Nemotron-H's checkpoint names -> the Sluice dir's (its own module: engine.model.spec reads it without the family)."""
from __future__ import annotations

import re

RENAMED = {"model.embeddings.weight": "model.embed_tokens.weight", "model.norm_f.weight": "model.norm.weight"}


def canonical_name(name: str) -> str:
    """A tensor name (the Hub's `backbone.`, or transformers' `model.`) -> the Sluice dir's: `model.`, the embedding
    and the final norm named as every family's."""
    name = re.sub(r"^backbone\.", "model.", name)
    return RENAMED.get(name, name)
