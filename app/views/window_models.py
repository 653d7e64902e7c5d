"""The main window's model actions: the picker, loading in the engine thread, Open folder (repack),
the demo model, the download wizard, and the progress dialogs of long jobs."""
from __future__ import annotations

import gc
from pathlib import Path
from urllib.parse import urlparse

from PySide6.QtWidgets import QFileDialog

from engine import SluiceError
from engine.setup import DEMO_DIR_NAME, read_spec

from ..model_options import load_options
from ..models_dir import installed_models, is_hf_snapshot, is_sluice_model
from ..remote import REMOTE_PREFIX, model_key, parse_model_key
from .dialogs import JobDialog


def freeze_heap() -> None:
    """Move every object alive now (Qt, torch, transformers, the model) out of the cyclic GC's reach.

    With those libraries loaded a full collection walks millions of objects and holds the GIL for
    0.3-0.5 s, freezing the GUI mid-answer; frozen objects are skipped, so collections stay short.
    """
    gc.collect()
    gc.freeze()


def display_name(path: str) -> str:
    if path.startswith(REMOTE_PREFIX):
        url, model = parse_model_key(path)
        return f"{model} ({urlparse(url).netloc})"
    return Path(path).name


class ModelActionsMixin:
    """Mixed into MainWindow (which provides host, settings, store, controller and the widgets used here)."""

    # models ------------------------------------------------------------------------------------------
    def refresh_models(self) -> None:
        models = installed_models(self.settings.models_path())
        current = self.model_info["path"] if self.model_info else self.loading_path
        self.model_picker.blockSignals(True)
        self.model_picker.clear()
        self.model_picker.addItem("Choose a model…", None)
        paths_seen = set()
        for model in models:
            self.model_picker.addItem(model.label, str(model.path))
            paths_seen.add(str(model.path))
        for endpoint in self.settings.remote_endpoints:
            for model_id in endpoint.get("models", []):
                key = model_key(endpoint["url"], model_id)
                self.model_picker.addItem(f"{model_id}  (remote: {urlparse(endpoint['url']).netloc})", key)
                paths_seen.add(key)
        if current and current not in paths_seen:
            self.model_picker.addItem(Path(current).name, current)
        index = self.model_picker.findData(current) if current else 0
        self.model_picker.setCurrentIndex(max(index, 0))
        self.model_picker.setToolTip(self.model_picker.currentText() or "Installed models")
        self.model_picker.blockSignals(False)
        self._update_page()

    def _on_model_picked(self, index: int) -> None:
        path = self.model_picker.itemData(index)
        if path and (not self.model_info or path != self.model_info.get("path")):
            self.load_model(path)

    def load_model(self, path: str | Path) -> None:
        """Load in the engine thread; a generation in progress is stopped first (its answer is kept)."""
        if str(path).startswith(REMOTE_PREFIX):
            url, _model = parse_model_key(str(path))
            self._start_load(path, {"api_key": self.settings.remote_api_key(url)})
            return
        try:
            options = load_options(self.settings, self.store, path)
        except SluiceError as exc:
            self.show_error(str(exc))
            return
        self._start_load(path, options)

    def _start_load(self, path, options: dict) -> None:
        self.controller.stop()
        self.loading_path = str(path)
        self.failed_model_path = None
        self._kept_info = self.model_info           # back in place when a remote model cannot be reached
        self.model_info = None
        self.panels.predicted_tok_s = None
        self.speed_label.setText("")
        self.speed_label.setToolTip("")
        self._last_stats = None
        self.controller.model_name = None
        self.model_label.setText(f"Loading {display_name(str(path))}…")
        self.server_panel.model_changing()
        self.load_bar.setRange(0, 0)
        self.load_bar.setVisible(True)
        self.load_cancel.setVisible(True)
        self.panels.set_busy(True)
        self.host.load(str(path), **options)

    def cancel_load(self) -> None:
        self.host.cancel_load()

    def _on_load_progress(self, done: int, total: int, message: str) -> None:
        if total > 0:
            self.load_bar.setRange(0, total)
            self.load_bar.setValue(done)
        self.load_bar.setFormat(message or "%p%")

    def _on_loaded(self, info: dict) -> None:
        self._show_loaded(info)
        self.model_loaded.emit(info)

    def _show_loaded(self, info: dict) -> None:
        self.model_info = info
        self.loading_path = None
        self.controller.model_name = info.get("name")
        self.settings.last_model = info.get("path", "")
        self.settings.save(self.store)
        self._hide_load_bar()
        dense = " · int8 dense" if info.get("dense_quant") == "int8" else ""
        self.model_label.setText(f"{info.get('name')} · {info.get('family')} · {info.get('quant')}{dense} · "
                                 f"context {info.get('max_context', 0):,} tokens")
        device = str(info.get("device", "cpu"))
        self.device_label.setText("CPU" if device.startswith("cpu") else "Remote" if device == "remote" else f"GPU {device}")
        self.panels.engine_device = device
        self.refresh_models()
        self.server_panel.model_ready(info)
        freeze_heap()

    def _on_load_failed(self, message: str) -> None:
        self.failed_model_path = self.loading_path if message else None
        self.loading_path = None
        kept = getattr(self, "_kept_info", None)
        if kept and self.host.worker.engine is not None:       # a remote model failed before the old one closed
            self._show_loaded(kept)
            if message:
                self.show_error(f"{message.rstrip('.')}; {kept.get('name')} stays loaded.")
            return
        self._hide_load_bar()
        self.model_label.setText("No model")
        self.refresh_models()
        if message:
            self.show_error(message)

    def _hide_load_bar(self) -> None:
        self.panels.set_busy(self.controller.is_generating)
        self.load_bar.setVisible(False)
        self.load_cancel.setVisible(False)

    def open_folder(self, path: str | Path | None = None) -> None:
        """A Sluice model dir loads directly; a Hugging Face snapshot is repacked into the models folder first."""
        if path is None:
            path = QFileDialog.getExistingDirectory(self, "Open a model folder", str(Path.home()))
            if not path:
                return
        path = Path(path)
        if is_sluice_model(path):
            self.load_model(path)
        elif is_hf_snapshot(path):
            self.open_repack_wizard(path)
        else:
            self.show_error(f"'{path.name}' holds neither a Sluice model nor a Hugging Face snapshot; choose the "
                            f"folder that contains sluice.json, or config.json and .safetensors files.")

    def start_demo(self) -> None:
        destination = self.settings.models_path() / DEMO_DIR_NAME
        if is_sluice_model(destination):
            self.load_model(destination)
            return
        self.run_job("demo", "Building the demo model (random weights: it produces noise)…",
                     load_after=True, dst=str(destination))

    def open_download_wizard(self) -> None:
        from app.setup import open_download_wizard
        self.last_wizard = open_download_wizard(self, self.settings.models_path(), self.load_model)

    def open_repack_wizard(self, snapshot: Path) -> None:
        """Quant choice with the size and predicted speed of each, then repack into the models folder and load."""
        try:
            read_spec(snapshot)                 # an unsupported family is one sentence before any wizard
        except SluiceError as exc:
            self.show_error(str(exc))
            return
        from app.setup import open_repack_wizard
        self.last_wizard = open_repack_wizard(self, snapshot, self.settings.models_path(), self.load_model)

    # jobs (demo) ------------------------------------------------------------------------------
    def run_job(self, kind: str, label: str, load_after: bool = False, **args) -> int:
        job_id = self.host.run_job(kind, **args)
        dialog = JobDialog(label, self)
        dialog.canceled.connect(lambda: self.host.cancel_job(job_id))
        dialog.show()
        self._job_dialogs[job_id] = dialog
        self._job_then_load[job_id] = load_after
        self.last_dialog = dialog
        return job_id

    def _on_job_progress(self, job_id: int, done: int, total: int, message: str) -> None:
        dialog = self._job_dialogs.get(job_id)
        if dialog is not None:
            dialog.set_progress(done, total, message)

    def _close_job(self, job_id: int) -> None:
        dialog = self._job_dialogs.pop(job_id, None)
        if dialog is not None:
            if self.last_dialog is dialog:
                self.last_dialog = None
            dialog.hide()                    # not close(): that would reject(), i.e. cancel the job
            dialog.deleteLater()

    def _on_job_finished(self, job_id: int, result: str) -> None:
        self._close_job(job_id)
        self.refresh_models()
        if self._job_then_load.pop(job_id, False):
            self.load_model(result)

    def _on_job_failed(self, job_id: int, message: str) -> None:
        self._close_job(job_id)
        self._job_then_load.pop(job_id, None)
        if message:
            self.show_error(message)
