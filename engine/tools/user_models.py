"""The app's models folder, as the command line finds it: the CLI puts models where the app lists them."""
from __future__ import annotations

import json
import os
import sqlite3
from contextlib import closing
from pathlib import Path


def data_root() -> Path:
    """Where the app keeps its files (the app's data dir too): SLUICE_DATA_DIR, else the platform's user data dir."""
    root = os.environ.get("SLUICE_DATA_DIR")
    if root:
        return Path(root)
    import platformdirs
    return Path(platformdirs.user_data_dir("sluice", appauthor=False))


def user_models_dir() -> Path:
    """The folder chosen in the app's Settings, else <data dir>/models (app.settings stores the choice as
    `models_dir` in the JSON of the settings row 'app' of <data dir>/sluice.db)."""
    root = data_root()
    return _chosen_models_dir(root / "sluice.db") or root / "models"


def _chosen_models_dir(database: Path) -> Path | None:
    """The app's saved choice; None when there is none or it cannot be read (the app then uses its default too)."""
    if not database.is_file():
        return None
    try:        # read-only: the CLI never creates or changes the app's database
        with closing(sqlite3.connect(f"{database.as_uri()}?mode=ro", uri=True)) as db:
            row = db.execute("SELECT value FROM settings WHERE key = 'app'").fetchone()
        chosen = json.loads(row[0]).get("models_dir") if row else None
    except (sqlite3.Error, ValueError, TypeError, AttributeError):
        return None
    return Path(chosen) if isinstance(chosen, str) and chosen else None
