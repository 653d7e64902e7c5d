"""The About box: version, what Sluice is, and the licences of the libraries it ships with."""
from __future__ import annotations

from importlib import metadata

from PySide6.QtWidgets import QMessageBox, QWidget

DISTRIBUTION = "sluice-chat"
# (distribution, shown name, licence): the libraries the app runs on
LIBRARIES = (("PySide6-Essentials", "Qt for Python (PySide6) and Qt", "LGPL-3.0"),
             ("torch", "PyTorch", "BSD-3-Clause"),
             ("transformers", "Hugging Face transformers", "Apache-2.0"),
             ("tokenizers", "Hugging Face tokenizers", "Apache-2.0"),
             ("safetensors", "safetensors", "Apache-2.0"),
             ("huggingface-hub", "huggingface_hub", "Apache-2.0"),
             ("pyqtgraph", "pyqtgraph", "MIT"),
             ("psutil", "psutil", "BSD-3-Clause"),
             ("platformdirs", "platformdirs", "MIT"))


def version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def about_html() -> str:
    rows = "".join(f"<tr><td>{name}</td><td>{version(dist) or ''}</td><td>{licence}</td></tr>"
                   for dist, name, licence in LIBRARIES if version(dist))
    return (f"<h3>Sluice {version(DISTRIBUTION) or ''}</h3>"
            "<p>Runs Mixture-of-Experts language models larger than your GPU and RAM by streaming expert "
            "weights from disk; its answers are the model's own, token for token.</p>"
            "<p>Built on these libraries, each under its own licence:</p>"
            f"<table cellspacing='6'>{rows}</table>"
            "<p>Models you download keep their own licences; see each model's page on the hub.</p>")


def show_about(parent: QWidget) -> QMessageBox:
    box = QMessageBox(QMessageBox.Icon.NoIcon, "About Sluice", about_html(), QMessageBox.StandardButton.Ok, parent)
    box.setObjectName("aboutDialog")
    box.setIconPixmap(parent.windowIcon().pixmap(64, 64))
    box.open()
    return box
