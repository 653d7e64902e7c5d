"""Repack pages (both wizards): choose quant and destination, repack with progress, done."""
from __future__ import annotations

import time
from pathlib import Path

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import (QFileDialog, QHBoxLayout, QLabel, QLineEdit, QProgressBar, QPushButton, QVBoxLayout,
                               QWizardPage)

from .common import format_duration, machine_for, model_dir_name
from .estimate_page import QuantChoice, estimates_for
from .quant_table import QuantTable
from ..work import Work, stop_and_wait


class RepackOptionsPage(QuantChoice, QWizardPage):
    """Source folder (fixed after a download, chosen in the repack wizard), quant, destination."""

    def __init__(self, models_dir, source_editable: bool, parent=None):
        super().__init__(parent)
        self.models_dir = Path(models_dir)
        self.source_editable = source_editable
        self.setTitle("Repack for Sluice")
        self.setSubTitle("Sluice stores each expert as one aligned block so it can stream it from disk. "
                         "Choose how the experts are stored.")
        self.task: Work | None = None
        self.config: dict | None = None
        self._name_edited = False

        self.source = QLineEdit(placeholderText="a downloaded model folder (config.json + .safetensors)")
        self.source.setReadOnly(not source_editable)
        self.browse = QPushButton("Browse…")
        self.browse.setVisible(source_editable)
        self.status = QLabel()
        self.status.setWordWrap(True)
        self.quants = QuantTable()
        self.verdict = QLabel()
        self.verdict.setWordWrap(True)
        self.name = QLineEdit()
        self.destination = QLabel()
        self.destination.setWordWrap(True)
        self.machine_label = QLabel()
        self.machine_label.setWordWrap(True)

        source_row = QHBoxLayout()
        source_row.addWidget(QLabel("Source:"))
        source_row.addWidget(self.source, 1)
        source_row.addWidget(self.browse)
        name_row = QHBoxLayout()
        name_row.addWidget(QLabel("Name in your models folder:"))
        name_row.addWidget(self.name, 1)
        layout = QVBoxLayout(self)
        layout.addLayout(source_row)
        layout.addWidget(self.status)
        layout.addWidget(self.quants)
        layout.addWidget(self.verdict)
        layout.addLayout(name_row)
        layout.addWidget(self.destination)
        layout.addWidget(self.machine_label)
        layout.addStretch(1)

        self.browse.clicked.connect(self._browse)
        self.source.editingFinished.connect(lambda: self.set_source(self.source.text()))
        self.quants.quant_changed.connect(self._on_quant)
        self.name.textEdited.connect(self._on_name_edited)
        self.quants.setVisible(False)

    def initializePage(self) -> None:
        src = getattr(self.wizard(), "snapshot_dir", None)
        if src:
            self.set_source(str(src))

    def _browse(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Choose a downloaded model folder", self.source.text())
        if path:
            self.set_source(path)

    def set_source(self, path: str) -> None:
        from engine.setup import load_config_dict, read_spec
        options = getattr(self.wizard(), "engine_options", None)
        if options is None:          # the wizard is closing (the source field lost focus as it went)
            return
        self.source.setText(path)
        self.config = None
        self.quants.setVisible(False)
        self.verdict.clear()
        src = Path(path)
        models_dir = self.models_dir

        def work(report, stop):
            config = load_config_dict(src)          # SluiceError: no config.json
            read_spec(config)                       # SluiceError: unsupported family
            machine, hw = machine_for(models_dir, options["device"])
            return config, estimates_for(config, 0, 0, machine, options), hw

        if not path:
            return
        if not (src / "config.json").is_file() or not any(src.glob("*.safetensors")):
            self.status.setText("<span style='color:#cf222e'>This folder has no config.json and .safetensors files; "
                                "choose the folder of a downloaded model.</span>")
            self.completeChanged.emit()
            return
        self.status.setText("Reading the model's config and measuring this computer…")
        stop_and_wait(self.task)
        self.task = Work(work, "repack estimate")
        self.task.on(result=self._on_estimates, failed=self._on_failed).start()

    def _on_failed(self, message: str) -> None:
        self.status.setText(f"<span style='color:#cf222e'>{message}</span>")
        self.completeChanged.emit()

    def _on_estimates(self, result) -> None:
        self.config, estimates, hw = result
        self.status.setText(f"{self.config.get('model_type')} model in {Path(self.source.text()).name}.")
        self.quants.setVisible(True)
        self._show_estimates(estimates, hw)

    def _on_quant(self, quant: str) -> None:
        if self._choose(quant) is None:
            return
        if not self._name_edited:
            self.name.setText(model_dir_name(Path(self.source.text()).name, quant))
        self._update_destination()

    def _on_name_edited(self) -> None:
        self._name_edited = True
        self._update_destination()

    def destination_path(self) -> Path:
        return self.models_dir / self.name.text().strip()

    def _destination_problem(self) -> str | None:
        name = self.name.text().strip()
        if not name or "/" in name or name.startswith("."):
            return "Enter a folder name for the new model."
        dst = self.destination_path()
        if (dst / "sluice.json").exists():
            return f"A model named '{name}' already exists; choose another name."
        if dst.exists() and any(dst.iterdir()):
            return f"'{name}' is a folder that is not empty; choose another name."
        return None

    def _update_destination(self) -> None:
        problem = self._destination_problem()
        resume = self.destination_path().with_name(self.destination_path().name + ".partial").is_dir()
        text = problem or (f"Will be written to {self.destination_path()}"
                           + (" (an interrupted repack there will resume)." if resume else "."))
        color = "#cf222e" if problem else "palette(placeholder-text)"
        self.destination.setText(f"<span style='color:{color}'>{text}</span>")
        self.completeChanged.emit()

    def isComplete(self) -> bool:
        est = self.quants.current()
        return bool(self.config and est and est.is_usable and self._destination_problem() is None)

    def validatePage(self) -> bool:
        wizard = self.wizard()
        wizard.repack_src = Path(self.source.text())
        wizard.repack_dst = self.destination_path()
        wizard.quant = self.quants.quant()
        return True

    def cleanupPage(self) -> None:
        stop_and_wait(self.task)


class RepackProgressPage(QWizardPage):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.setTitle("Repacking")
        self.setSubTitle("Layer by layer. If you stop or close Sluice, finished layers are kept and the repack "
                         "resumes from there.")
        self.task: Work | None = None
        self.is_done = False
        self.bar = QProgressBar()
        self.detail, self.status = QLabel(), QLabel()
        self.status.setWordWrap(True)
        self.cancel_button = QPushButton("Stop")
        self.restart_button = QPushButton("Start again")
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(self.restart_button)
        buttons.addWidget(self.cancel_button)
        layout = QVBoxLayout(self)
        layout.addWidget(self.bar)
        layout.addWidget(self.detail)
        layout.addWidget(self.status)
        layout.addStretch(1)
        layout.addLayout(buttons)
        self.cancel_button.clicked.connect(lambda: self.task and self.task.stop())
        self.restart_button.clicked.connect(self.start)

    def initializePage(self) -> None:
        self.is_done = False
        self.start()

    def start(self) -> None:
        from engine.setup import repack
        wizard = self.wizard()
        src, dst, quant = wizard.repack_src, wizard.repack_dst, wizard.quant
        self.restart_button.setVisible(False)
        self.cancel_button.setEnabled(True)
        self.status.setText(f"Repacking {src.name} as {quant} into {dst}…")
        self._started_s, self._first_done = time.monotonic(), None
        stop_and_wait(self.task)
        self.task = Work(lambda report, stop: repack(src, dst, quant=quant, cancel_event=stop,
                                                     progress=lambda d, t, m: report((d, t, m))), "repack")
        self.task.on(progress=self._on_progress, result=self._on_done, failed=self._on_failed,
                     stopped=self._on_stopped).start()

    def _on_progress(self, step) -> None:
        done, total, message = step
        now = time.monotonic()
        if self._first_done is None:            # steps done before this run (resumed) do not count for speed
            self._first_done = (done, now)
        self.bar.setMaximum(max(1, total))
        self.bar.setValue(done)
        base_done, base_s = self._first_done
        left = None
        if done > base_done:
            left = (now - base_s) / (done - base_done) * (total - done)
        self.detail.setText(f"Step {done} of {total}: {message} · {format_duration(left)}")

    def _on_done(self, dst) -> None:
        self.is_done = True
        self.bar.setValue(self.bar.maximum())
        self.status.setText("Repacked; every expert block's checksum was verified.")
        self.cancel_button.setEnabled(False)
        self.wizard().model_dir = Path(dst)
        self.completeChanged.emit()
        QTimer.singleShot(0, self.wizard().next)

    def _on_failed(self, message: str) -> None:
        self.status.setText(f"<span style='color:#cf222e'>{message}</span>")
        self.cancel_button.setEnabled(False)
        self.restart_button.setVisible(True)

    def _on_stopped(self) -> None:
        self.status.setText("Stopped. Finished layers are kept; press Start again to continue.")
        self.cancel_button.setEnabled(False)
        self.restart_button.setVisible(True)

    def isComplete(self) -> bool:
        return self.is_done

    def cleanupPage(self) -> None:
        stop_and_wait(self.task)


class DonePage(QWizardPage):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.setTitle("Ready")
        self.summary = QLabel()
        self.summary.setWordWrap(True)
        self.summary.setTextFormat(Qt.TextFormat.RichText)
        layout = QVBoxLayout(self)
        layout.addWidget(self.summary)
        layout.addStretch(1)

    def initializePage(self) -> None:
        from engine import format_size
        model_dir = self.wizard().model_dir
        size = sum(p.stat().st_size for p in model_dir.iterdir() if p.is_file())
        self.summary.setText(f"<p><b>{model_dir.name}</b> is ready ({format_size(size)}), in {model_dir.parent}.</p>"
                             "<p>Press <b>Finish</b> to load it and start chatting. It also appears in the model "
                             "list at the top of the window.</p>")
