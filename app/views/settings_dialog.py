"""App settings: models folder, device, budgets and the loaded model's context, checked in place.

A wrong field says what is wrong under it and the dialog stays open with the edits. Sizes show the
machine's limits (and the loaded model's minimum) beside them; only devices this machine has are offered.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

from PySide6.QtWidgets import (QComboBox, QDialog, QDialogButtonBox, QFileDialog, QFormLayout, QHBoxLayout, QLabel,
                               QLineEdit, QPushButton, QSpinBox, QVBoxLayout, QWidget)

from engine import SluiceError, format_size, parse_size

from ..settings import AppSettings
from . import theme

DEVICE_LABELS = {"auto": "Automatic (the GPU when there is one)", "cpu": "CPU", "cuda": "GPU (CUDA)"}


@dataclass(frozen=True)
class MachineLimits:
    ram_total_bytes: int
    gpu_name: str | None = None
    gpu_total_bytes: int | None = None

    @classmethod
    def probe(cls) -> "MachineLimits":
        import psutil
        import torch
        ram = psutil.virtual_memory().total
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            return cls(ram, props.name, props.total_memory)
        return cls(ram)

    @property
    def devices(self) -> list[str]:
        return ["auto", "cpu"] + (["cuda"] if self.gpu_total_bytes else [])


def models_dir_problem(text: str) -> str | None:
    """One sentence when `text` is not a folder Sluice can create and write models into, else None."""
    if not text:
        return "Choose a models folder."
    path = Path(text).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"Sluice cannot create the models folder {path} ({exc.strerror or exc}); choose another folder."
    if not os.access(path, os.W_OK | os.X_OK):
        return f"Sluice cannot write into the models folder {path}; choose another folder."
    return None


class AppSettingsDialog(QDialog):
    def __init__(self, settings: AppSettings, parent: QWidget | None = None, model_info: dict | None = None,
                 context: int | None = None, limits: MachineLimits | None = None):
        """model_info: the loaded model's engine.info (its minimum budgets and context limit), if any;
        context: the context chosen for it (None: automatic)."""
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self.setMinimumWidth(560)
        self._settings = settings
        self._info = model_info or {}
        self.limits = limits or MachineLimits.probe()
        form = QFormLayout()
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.DontWrapRows)
        form.addRow("Models folder", self._models_dir_row(settings))
        form.addRow("Device", self._device_row(settings))
        form.addRow("VRAM budget", self._budget_row("vram", settings.vram_budget, self._vram_limits()))
        form.addRow("RAM cache", self._budget_row("ram", settings.ram_cache, self._ram_limits()))
        form.addRow("Dense weights", self._dense_weights_row(settings))
        form.addRow("Context", self._context_row(context))
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(buttons)

    # rows -------------------------------------------------------------------------------------
    def _models_dir_row(self, settings: AppSettings) -> QWidget:
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        self.models_dir = QLineEdit(str(settings.models_path()))
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse)
        row.addWidget(self.models_dir, 1)
        row.addWidget(browse)
        line = QWidget()
        line.setLayout(row)
        self.models_dir_error = self._error()
        self.models_dir.textEdited.connect(lambda _: self.models_dir_error.setVisible(False))
        return self._with_note(line, self.models_dir_error)

    def _device_row(self, settings: AppSettings) -> QWidget:
        self.device = QComboBox()
        for device in self.limits.devices:
            self.device.addItem(DEVICE_LABELS[device], device)
        self.device.setCurrentIndex(max(0, self.device.findData(settings.device)))
        self.device_note = self._note("" if self.limits.gpu_total_bytes else
                                      "No CUDA GPU found on this computer: Sluice runs on the CPU.")
        return self._with_note(self.device, self.device_note)

    def _budget_row(self, name: str, text: str, limits: str) -> QWidget:
        """The VRAM budget or RAM cache field (self.vram_budget / self.ram_cache), its limits and its error."""
        field, error = QLineEdit(text), self._error()
        field.setPlaceholderText("automatic")
        field.textEdited.connect(lambda _: error.setVisible(False))
        setattr(self, "vram_budget" if name == "vram" else "ram_cache", field)
        setattr(self, f"{name}_error", error)
        return self._with_note(field, self._note(limits), error)

    def _dense_weights_row(self, settings: AppSettings) -> QWidget:
        self.dense_weights = QComboBox()
        self.dense_weights.addItem("As the model stores them", "stored")
        self.dense_weights.addItem("int8: less memory, faster decode", "int8")
        self.dense_weights.setCurrentIndex(max(0, self.dense_weights.findData(settings.dense_weights)))
        return self._with_note(self.dense_weights, self._note(
            "int8 halves the VRAM the attention and head weights take; the expert slots get it (on a GPU about "
            "a fifth faster where experts stream from RAM). On the CPU device they take a quarter of the RAM "
            "and a token reads a quarter of their bytes. Answers change slightly. Models whose family does not "
            "support it load as stored."))

    def _context_row(self, context: int | None) -> QWidget:
        self.context = QSpinBox()
        self.context.setSpecialValueText("automatic")
        self.context.setSingleStep(1024)
        self.context.setGroupSeparatorShown(True)
        limit = self._info.get("model_max_context")
        self.context.setRange(0, limit or 0)
        self.context.setValue(context or 0)
        self.context.setEnabled(bool(limit))
        note = (f"Tokens of prompt and answer for {self._info.get('name')}: up to {limit:,} (its own limit); "
                f"now {self._info.get('max_context', 0):,}. Automatic fits the VRAM budget."
                if limit else "Load a model to choose its context.")
        return self._with_note(self.context, self._note(note))

    # layout helpers ---------------------------------------------------------------------------
    def _note(self, text: str) -> QLabel:
        label = QLabel(text)
        label.setWordWrap(True)
        label.setStyleSheet(f"color: {theme.muted_color()}; font-size: 11px;")
        label.setVisible(bool(text))
        return label

    def _error(self) -> QLabel:
        label = QLabel()
        label.setWordWrap(True)
        label.setStyleSheet(f"color: {theme.ERROR_COLOR};")
        label.setVisible(False)
        return label

    @staticmethod
    def _with_note(field: QWidget, *notes: QLabel) -> QWidget:
        box = QWidget()
        column = QVBoxLayout(box)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(2)
        column.addWidget(field)
        for note in notes:
            column.addWidget(note)
        return box

    def _vram_limits(self) -> str:
        parts = [f"This GPU ({self.limits.gpu_name}): {format_size(self.limits.gpu_total_bytes)}."
                 if self.limits.gpu_total_bytes else
                 f"No GPU: the device slots live in RAM ({format_size(self.limits.ram_total_bytes)} here)."]
        if self._info.get("min_vram_budget_bytes"):
            parts.append(f"{self._info.get('name')} needs at least {format_size(self._info['min_vram_budget_bytes'])} "
                         f"with its current context.")
        return " ".join(parts)

    def _ram_limits(self) -> str:
        parts = [f"This computer: {format_size(self.limits.ram_total_bytes)} of RAM."]
        if self._info.get("min_ram_cache_bytes"):
            parts.append(f"{self._info.get('name')} needs at least {format_size(self._info['min_ram_cache_bytes'])}.")
        return " ".join(parts)

    def _browse(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Models folder", self.models_dir.text())
        if path:
            self.models_dir.setText(path)

    # checking ---------------------------------------------------------------------------------
    def _check_size(self, field: QLineEdit, error: QLabel, what: str, maximum: int, minimum: int | None) -> bool:
        text = field.text().strip()
        problem = None
        try:
            value = parse_size(text) if text else None
        except SluiceError as exc:
            problem, value = str(exc), None
        if value is not None and value > maximum:
            problem = (f"{format_size(value)} is more than this computer has for the {what} "
                       f"({format_size(maximum)}); choose less.")
        elif value is not None and minimum and value < minimum:
            problem = (f"{format_size(value)} is too small for {self._info.get('name')}: the {what} needs at least "
                       f"{format_size(minimum)}.")
        error.setText(problem or "")
        error.setVisible(problem is not None)
        return problem is None

    def accept(self) -> None:
        device = self.device.currentData()
        on_gpu = device == "cuda" or (device == "auto" and self.limits.gpu_total_bytes)
        vram_maximum = self.limits.gpu_total_bytes if on_gpu else self.limits.ram_total_bytes
        is_valid = self._check_size(self.vram_budget, self.vram_error, "VRAM budget", vram_maximum,
                                    self._info.get("min_vram_budget_bytes"))
        is_valid &= self._check_size(self.ram_cache, self.ram_error, "RAM cache", self.limits.ram_total_bytes,
                                     self._info.get("min_ram_cache_bytes"))
        is_valid &= self._check_models_dir()
        if is_valid:
            super().accept()
        else:
            self._grow_to_fit()

    def showEvent(self, event) -> None:
        super().showEvent(event)
        self._grow_to_fit()

    def _grow_to_fit(self) -> None:
        """As tall as its wrapped notes and errors need at its width (a form layout's size hint does not
        count wrapped lines), so an error shown never overlaps the notes: the dialog grows."""
        self.layout().activate()
        height = self.heightForWidth(self.width())
        if height > 0:
            self.setMinimumHeight(height)
            if height > self.height():
                self.resize(self.width(), height)

    def _check_models_dir(self) -> bool:
        """The models folder must exist or be creatable (it is created here, as the app would at first use)."""
        problem = models_dir_problem(self.models_dir.text().strip())
        self.models_dir_error.setText(problem or "")
        self.models_dir_error.setVisible(problem is not None)
        return problem is None

    def value(self) -> AppSettings:
        """A copy of the settings with this dialog's fields (checked by accept())."""
        return replace(self._settings, models_dir=self.models_dir.text().strip(), device=self.device.currentData(),
                       vram_budget=self.vram_budget.text().strip(), ram_cache=self.ram_cache.text().strip(),
                       dense_weights=self.dense_weights.currentData())

    def context_value(self) -> int | None:
        return self.context.value() or None
