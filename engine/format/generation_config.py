"""generation_config.json, read and checked: a broken one is one sentence at repack and at load, not a traceback.

Only what Sluice uses is checked: the file is a JSON object, and its eos_token_id is absent, null, a token id
or a list of token ids.
"""
from __future__ import annotations

import json
from pathlib import Path

from engine.errors import SluiceError

FILE = "generation_config.json"


def read(model_dir: Path, then: str = "fix or delete it") -> dict:
    """The checked contents of model_dir's generation_config.json ({} without one)."""
    path = Path(model_dir) / FILE
    if not path.is_file():
        return {}
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise SluiceError(f"'{path}' is not valid JSON ({exc}); {then}.") from None
    if not isinstance(config, dict):
        raise SluiceError(f"'{path}' is not a JSON object; {then}.")
    eos = config.get("eos_token_id")
    ids = eos if isinstance(eos, list) else [] if eos is None else [eos]
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise SluiceError(f"'{path}' has an eos_token_id that is not a token id or a list of them ({eos!r}); {then}.")
    return config


def eos_token_ids(model_dir: Path) -> set[int]:
    eos = read(model_dir, then="repack the model, or fix or delete the file").get("eos_token_id")
    return set(eos if isinstance(eos, list) else [] if eos is None else [eos])
