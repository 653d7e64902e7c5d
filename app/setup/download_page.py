"""Wizard page 3: download with progress, pause/resume, cancel and retry; resumes after a restart."""
from __future__ import annotations

import shutil

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QHBoxLayout, QLabel, QMessageBox, QProgressBar, QPushButton, QVBoxLayout, QWizardPage

from .common import format_duration, format_rate, snapshot_dir
from ..work import Work, stop_and_wait

BAR_SCALE = 1024          # QProgressBar holds an int: count KiB so 2 TiB fits


class DownloadPage(QWizardPage):
    def __init__(self, models_dir, parent=None):
        super().__init__(parent)
        self.models_dir = models_dir
        self.setTitle("Downloading")
        self.setSubTitle("Every file is checked against the hub's hash. You can pause, or close Sluice: "
                         "the download continues where it stopped next time.")
        self.task: Work | None = None
        self.is_done = False
        self.dst = None

        self.bar = QProgressBar()
        self.bytes_label, self.file_label, self.status = QLabel(), QLabel(), QLabel()
        self.status.setWordWrap(True)
        self.pause_button = QPushButton("Pause")
        self.retry_button = QPushButton("Retry")
        self.discard_button = QPushButton("Cancel download")
        self.discard_button.setToolTip("Stop and delete what was downloaded of this model")
        buttons = QHBoxLayout()
        buttons.addWidget(self.pause_button)
        buttons.addWidget(self.retry_button)
        buttons.addStretch(1)
        buttons.addWidget(self.discard_button)
        layout = QVBoxLayout(self)
        layout.addWidget(self.bar)
        layout.addWidget(self.bytes_label)
        layout.addWidget(self.file_label)
        layout.addWidget(self.status)
        layout.addStretch(1)
        layout.addLayout(buttons)
        self.pause_button.clicked.connect(self.toggle_pause)
        self.retry_button.clicked.connect(self.start)
        self.discard_button.clicked.connect(self.discard)

    def initializePage(self) -> None:
        wizard = self.wizard()
        self.dst = snapshot_dir(self.models_dir, wizard.repo_info.repo_id)
        self.is_done = False
        self.start()

    def start(self) -> None:
        from engine.setup import download
        wizard = self.wizard()
        info, dst = wizard.repo_info, self.dst
        extra = wizard.estimate.repacked_bytes if wizard.estimate else 0
        self.retry_button.setVisible(False)
        self.pause_button.setText("Pause")
        self.pause_button.setEnabled(True)
        self.status.setText("Connecting to the hub…")
        stop_and_wait(self.task)
        self.task = Work(lambda report, stop: download(info, dst, progress=report, stop_event=stop,
                                                       extra_bytes_needed=extra), "download")
        self.task.on(progress=self._on_progress, result=self._on_done, failed=self._on_failed,
                     stopped=self._on_stopped).start()

    def _on_progress(self, p) -> None:
        from engine import format_size
        self.bar.setMaximum(max(1, p.bytes_total // BAR_SCALE))
        self.bar.setValue(p.bytes_done // BAR_SCALE)
        self.bytes_label.setText(f"{format_size(p.bytes_done)} of {format_size(p.bytes_total)} · "
                                 f"{format_rate(p.speed_bps)} · {format_duration(p.eta_s)}")
        if p.current_file:
            self.file_label.setText(f"Now: {p.current_file}")
        self.status.setText("")

    def _on_done(self, dst) -> None:
        self.is_done = True
        self.bar.setMaximum(1)
        self.bar.setValue(1)
        self.status.setText("Downloaded and verified.")
        self.file_label.clear()
        self.pause_button.setEnabled(False)
        self.discard_button.setEnabled(False)
        self.wizard().snapshot_dir = dst
        self.completeChanged.emit()
        QTimer.singleShot(0, self.wizard().next)        # straight on to the repack

    def _on_failed(self, message: str) -> None:
        self.status.setText(f"<span style='color:#cf222e'>{message}</span>")
        self.pause_button.setEnabled(False)
        self.retry_button.setVisible(True)

    def _on_stopped(self) -> None:
        self.status.setText("Paused. The downloaded part is kept; press Resume to continue.")
        self.pause_button.setText("Resume")
        self.pause_button.setEnabled(True)

    def toggle_pause(self) -> None:
        if self.task is not None and self.task.is_running():
            self.pause_button.setEnabled(False)
            self.task.stop()
        else:
            self.start()

    def discard(self) -> None:
        answer = QMessageBox.question(self, "Cancel download",
                                      "Stop and delete everything downloaded of this model so far?")
        if answer != QMessageBox.StandardButton.Yes:
            return
        stop_and_wait(self.task)
        if self.dst is not None:
            shutil.rmtree(self.dst, ignore_errors=True)
        self.wizard().back()

    def isComplete(self) -> bool:
        return self.is_done

    def cleanupPage(self) -> None:
        stop_and_wait(self.task)
