"""Wizard page 2: what the model is and whether it will run here, before any weight is downloaded."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QFormLayout, QHBoxLayout, QHeaderView, QLabel, QPushButton, QTreeWidget,
                               QTreeWidgetItem, QVBoxLayout, QWidget, QWizardPage)

from .catalog import load_catalog
from .common import VERDICT_COLORS, describe_machine, format_speed, machine_for, snapshot_dir
from .quant_table import QuantTable
from ..work import Work, stop_and_wait


def estimates_for(config: dict, download_bytes: int, missing_bytes: int, machine, options: dict) -> dict:
    from engine.setup import QUANTS, estimate
    return {q: estimate(config, download_bytes, machine, q, missing_download_bytes=missing_bytes,
                        vram_budget=options["vram_budget"], ram_cache=options["ram_cache"],
                        dense_quant=options.get("dense_quant"), suggest_int8_dense=True) for q in QUANTS}


def verdict_html(est) -> str:
    from engine import format_size
    color = VERDICT_COLORS[est.verdict]
    if est.verdict == "unavailable":
        return f"<p><b style='color:{color}; font-size:large'>Unavailable</b> — {est.reason}</p>"
    tip = est.int8_dense_tip
    if tip is not None:
        gain = "it would run" if not est.is_usable else "it would run faster"
        tip_html = (f"<p>Tip: with int8 dense weights (Settings → Dense weights: the attention and head weights in "
                    f"fewer bytes, the memory they free for experts) {gain}: about "
                    f"<b>{format_speed(tip.tok_s)}</b>.</p>")
    else:
        tip_html = ""
    to_fetch = est.disk_needed_bytes - est.repacked_bytes
    disk = (f"{format_size(to_fetch)} still to download + {format_size(est.repacked_bytes)} repacked model"
            if to_fetch else "the repacked model")
    return (f"<p><b style='color:{color}; font-size:large'>{est.verdict.capitalize()}</b> — {est.reason}</p>"
            f"<p>Disk needed: <b>{format_size(est.disk_needed_bytes)}</b> ({disk}). "
            f"Each token needs {format_size(est.expert_bytes_per_token)} of experts; moved per token "
            f"(not already cached): <b>{format_size(est.bytes_per_token)}</b> "
            f"({format_size(est.disk_bytes_per_token)} from disk). Predicted decode speed: "
            f"<b>{format_speed(est.tok_s)}</b>{' with int8 dense weights (Settings)' if est.dense_quant else ''}.</p>"
            + tip_html)


class QuantChoice:
    """What both pages with a quant table do (they have `quants`, `verdict`, `machine_label`):
    show the estimates with the wizard's last choice preselected, and on a choice remember it in
    the wizard and show its verdict. `_on_quant(quant)` is the page's own reaction."""

    def _show_estimates(self, estimates: dict, hw) -> None:
        self.machine_label.setText(describe_machine(hw))
        self.quants.set_estimates(estimates, preferred=getattr(self.wizard(), "quant", "fp8"))
        self._on_quant(self.quants.quant() or "")

    def _choose(self, quant: str):
        """The estimate of the chosen quant (None while there is none), remembered and shown."""
        est = self.quants.current()
        if est is not None:
            self.wizard().quant = quant
            self.verdict.setText(verdict_html(est))
        return est


class EstimatePage(QuantChoice, QWizardPage):
    def __init__(self, models_dir, parent=None):
        super().__init__(parent)
        self.models_dir = models_dir
        self.setTitle("Will it run here?")
        self.setSubTitle("Read from the model's config.json and file list only: no weights are downloaded yet.")
        self.task: Work | None = None
        self.info = None

        status_row = self._status_row()
        self.model_label, self.family_label, self.params_label = QLabel(), QLabel(), QLabel()
        self.files_label, self.machine_label = QLabel(), QLabel()
        for label in (self.model_label, self.family_label, self.params_label, self.files_label, self.machine_label):
            label.setWordWrap(True)
            label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.files = QTreeWidget()
        self.files.setHeaderLabels(("File", "Size"))
        self.files.setRootIsDecorated(False)
        self.files.setMaximumHeight(110)
        self.files.header().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.files.header().setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)
        self.quants = QuantTable()
        self.verdict = QLabel()
        self.verdict.setWordWrap(True)
        self.verdict.setTextFormat(Qt.TextFormat.RichText)

        form = QFormLayout()
        form.addRow("Model:", self.model_label)
        form.addRow("Family:", self.family_label)
        self.details = QWidget()                     # shown only for a supported model
        details_form = QFormLayout()
        details_form.setContentsMargins(0, 0, 0, 0)
        details_form.addRow("Parameters:", self.params_label)
        details_form.addRow("Files:", self.files_label)
        details = QVBoxLayout(self.details)
        details.setContentsMargins(0, 0, 0, 0)
        details.addLayout(details_form)
        details.addWidget(self.files)
        details.addWidget(QLabel("Quant (how the experts are stored; smaller moves fewer bytes per token):"))
        details.addWidget(self.quants)
        details.addWidget(self.verdict)
        details.addWidget(self.machine_label)
        layout = QVBoxLayout(self)
        layout.addLayout(status_row)
        layout.addLayout(form)
        layout.addWidget(self.details)
        layout.addStretch(1)
        self.quants.quant_changed.connect(self._on_quant)
        self._show_details(False)

    def _status_row(self) -> QHBoxLayout:
        """What the page is doing or what went wrong, and Retry (shown when the hub cannot be reached)."""
        self.status = QLabel("Reading config.json and the file list…")
        self.status.setWordWrap(True)
        self.retry_button = QPushButton("Retry")
        self.retry_button.clicked.connect(self.initializePage)
        self.retry_button.setVisible(False)
        row = QHBoxLayout()
        row.addWidget(self.status, 1)
        row.addWidget(self.retry_button, 0, Qt.AlignmentFlag.AlignTop)
        return row

    def _show_details(self, visible: bool) -> None:
        self.details.setVisible(visible)

    def initializePage(self) -> None:
        from engine.setup import repo_info
        from engine.setup import missing_bytes
        repo_id, revision = self.wizard().repo_ref
        self.info = None
        self.quants.estimates = {}
        self._show_details(False)
        self.retry_button.setVisible(False)
        for label in (self.model_label, self.family_label, self.params_label, self.files_label):
            label.clear()
        self.status.setText(f"Reading {repo_id}'s config.json and file list…")
        models_dir, options = self.models_dir, self.wizard().engine_options

        def work(report, stop):
            info = repo_info(repo_id, revision)
            if not info.is_supported:
                return info, None, None
            machine, hw = machine_for(models_dir, options["device"])
            files = info.model_files()
            total = sum(f.size for f in files)
            missing = missing_bytes(info, snapshot_dir(models_dir, repo_id), files)
            return info, estimates_for(info.config, total, missing, machine, options), hw

        stop_and_wait(self.task)
        self.task = Work(work, "estimate")
        self.task.on(result=self._on_info, failed=self._on_failed).start()

    def _on_failed(self, message: str) -> None:
        """The hub could not be read (offline, or it did not answer): what the catalog knows, and Retry."""
        repo_id, _revision = self.wizard().repo_ref
        self.status.setText(f"<span style='color:#cf222e'>{message}</span>")
        self.retry_button.setVisible(True)
        known = next((m for m in load_catalog() if m.repo == repo_id), None)
        self.model_label.setText(repo_id)
        if known is None:
            self.family_label.setText("not in Sluice's catalog: the hub is needed to read it")
            return
        self.family_label.setText(f"{known.family} — supported; {known.describe()} (from Sluice's catalog: the file "
                                  f"list and the speed estimate need the hub)")

    def _on_info(self, result) -> None:
        from engine.setup import format_params, model_shape
        from engine.setup import supported_families
        from engine import format_size
        info, estimates, hw = result
        self.info = info
        self.wizard().repo_info = info
        self.model_label.setText(f"{info.repo_id} @ {info.revision[:12]}")
        if not info.is_supported:
            self.status.setText(
                f"<span style='color:#cf222e'><b>{info.repo_id} is a '{info.family}' model, which Sluice cannot "
                f"run.</b></span> Sluice runs Mixture-of-Experts models of these families: "
                f"{', '.join(supported_families())}. Nothing was downloaded; go back and pick another model.")
            self.family_label.setText(f"{info.family} — not supported")
            self.completeChanged.emit()
            return
        shape = model_shape(info.config)
        files = info.model_files()
        self.status.setText("")
        self.family_label.setText(f"{info.family} — supported · {shape.num_layers} layers, "
                                  f"{shape.num_experts} experts, {shape.top_k} active per token")
        self.params_label.setText(f"{format_params(shape.total_params)} total, "
                                  f"{format_params(shape.active_params)} active per token")
        self.files_label.setText(f"{len(files)} files, {format_size(sum(f.size for f in files))} to download")
        self.files.clear()
        for f in files:
            item = QTreeWidgetItem([f.path, format_size(f.size)])
            item.setTextAlignment(1, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            self.files.addTopLevelItem(item)
        self._show_details(True)
        self._show_estimates(estimates, hw)

    def _on_quant(self, quant: str) -> None:
        est = self._choose(quant)
        if est is None:
            return
        self.wizard().estimate = est
        self.completeChanged.emit()

    def isComplete(self) -> bool:
        est = self.quants.current()
        return bool(self.info and self.info.is_supported and est and est.is_usable)

    def cleanupPage(self) -> None:
        stop_and_wait(self.task)
