"""Where the app keeps its files. SLUICE_DATA_DIR overrides the platform's user data dir (tests use tmp dirs)."""
from __future__ import annotations

import logging
from pathlib import Path

APP_ID = "io.github.sluice.Sluice"   # reverse-DNS id: .desktop file name, icon name, Qt desktopFileName
APP_NAME = "Sluice"
RESOURCES_DIR = Path(__file__).resolve().parent.parent / "resources"


def data_dir() -> Path:
    from engine.setup import data_root
    path = data_root()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:       # the app still starts: app.startup says what cannot be saved
        logging.getLogger("sluice.paths").warning("the data folder %s cannot be created: %s", path, exc)
    return path


def database_path() -> Path:
    return data_dir() / "sluice.db"


def default_models_dir() -> Path:
    return data_dir() / "models"


def log_path() -> Path:
    return data_dir() / "sluice.log"


def icon_path() -> Path:
    return RESOURCES_DIR / f"{APP_ID}.svg"
