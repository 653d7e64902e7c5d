"""The two setup wizards. Pages share state through attributes on the wizard (repo_ref, repo_info,
quant, estimate, snapshot_dir, repack_src, repack_dst, model_dir)."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QWizard

from .common import engine_options
from .download_page import DownloadPage
from .estimate_page import EstimatePage
from .repack_pages import DonePage, RepackOptionsPage, RepackProgressPage
from .search_page import SearchPage
from ..work import stop_and_wait


class _SetupWizard(QWizard):
    model_ready = Signal(str)            # path of the new Sluice model dir, on Finish

    def __init__(self, models_dir, parent=None):
        super().__init__(parent)
        self.models_dir = Path(models_dir)
        self.engine_options = engine_options(parent)   # device and budgets the app will load with
        self.quant = "fp8"
        self.repo_ref = self.repo_info = self.estimate = self.snapshot_dir = None
        self.repack_src = self.repack_dst = self.model_dir = None
        self.setWizardStyle(QWizard.WizardStyle.ModernStyle)
        self.setOption(QWizard.WizardOption.NoBackButtonOnLastPage, True)
        self.setOption(QWizard.WizardOption.NoCancelButtonOnLastPage, True)
        self.resize(820, 620)

    def stop_tasks(self) -> None:
        for page_id in self.pageIds():
            stop_and_wait(getattr(self.page(page_id), "task", None))

    def done(self, result: int) -> None:
        self.stop_tasks()                # a closed wizard leaves no thread running (downloads resume later)
        super().done(result)
        if result == QWizard.DialogCode.Accepted and self.model_dir is not None:
            self.model_ready.emit(str(self.model_dir))


class DownloadWizard(_SetupWizard):
    def __init__(self, models_dir, parent=None):
        super().__init__(models_dir, parent)
        self.setWindowTitle("Download a model")
        self.search_page = SearchPage(self.models_dir)
        self.estimate_page = EstimatePage(self.models_dir)
        self.download_page = DownloadPage(self.models_dir)
        self.options_page = RepackOptionsPage(self.models_dir, source_editable=False)
        self.progress_page = RepackProgressPage()
        self.done_page = DonePage()
        for page in (self.search_page, self.estimate_page, self.download_page, self.options_page,
                     self.progress_page, self.done_page):
            self.addPage(page)


class RepackWizard(_SetupWizard):
    def __init__(self, models_dir, src_dir=None, parent=None):
        super().__init__(models_dir, parent)
        self.setWindowTitle("Repack a model")
        self.snapshot_dir = Path(src_dir) if src_dir else None
        self.options_page = RepackOptionsPage(self.models_dir, source_editable=True)
        self.progress_page = RepackProgressPage()
        self.done_page = DonePage()
        for page in (self.options_page, self.progress_page, self.done_page):
            self.addPage(page)
