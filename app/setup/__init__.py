"""Guided model setup: the download wizard (search -> estimate -> download -> repack) and the repack wizard.

Entry points for the main window:
    open_download_wizard(parent, models_dir, on_ready=None)
    open_repack_wizard(parent, src_dir, models_dir, on_ready=None)
With `on_ready`, the wizard opens window-modal without blocking, calls on_ready(path) when the new
model dir is ready (Finish pressed), and the wizard is returned. Without it, the call blocks
(exec) and returns the model dir's Path, or None if the user cancelled.
"""
from __future__ import annotations

from pathlib import Path


def _open(wizard, on_ready):
    from PySide6.QtCore import Qt
    if on_ready is None:
        accepted = wizard.exec()
        return wizard.model_dir if accepted and wizard.model_dir else None
    wizard.model_ready.connect(lambda path: on_ready(Path(path)))
    wizard.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    wizard.setWindowModality(Qt.WindowModality.WindowModal)
    wizard.show()
    return wizard


def open_download_wizard(parent, models_dir, on_ready=None):
    from .wizards import DownloadWizard
    return _open(DownloadWizard(models_dir, parent), on_ready)


def open_repack_wizard(parent, src_dir, models_dir, on_ready=None):
    from .wizards import RepackWizard
    return _open(RepackWizard(models_dir, src_dir, parent), on_ready)


__all__ = ["open_download_wizard", "open_repack_wizard"]
