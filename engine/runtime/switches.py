"""A/B switches read from the environment (SLUICE_PREFETCH_READS=N, ...): measured alternatives to a default."""
from __future__ import annotations

import os


def env_int(name: str) -> int | None:
    """The integer the variable holds, or None when it is unset or empty (the default applies)."""
    value = os.environ.get(name, "").strip()
    return int(value) if value else None
