"""The shipped catalog of supported models (resources/catalog.json), read offline. Qt-free."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..paths import RESOURCES_DIR

CATALOG_PATH = RESOURCES_DIR / "catalog.json"


@dataclass(frozen=True)
class CatalogModel:
    repo: str
    family: str
    total_params_b: float
    active_params_b: float
    download_gb: float
    note: str = ""

    def describe(self) -> str:
        text = (f"{self.total_params_b:g}B parameters, {self.active_params_b:g}B active per token, "
                f"{self.download_gb:g} GB to download")
        return f"{text}; {self.note}" if self.note else text


def load_catalog(path: Path = CATALOG_PATH) -> list[CatalogModel]:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return [CatalogModel(**entry) for entry in data["models"]]
