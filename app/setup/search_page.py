"""Wizard page 1: find a model by text, or paste its name or address, with an optional revision."""
from __future__ import annotations

import html

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import (QHBoxLayout, QHeaderView, QInputDialog, QLabel, QLineEdit, QPushButton, QTreeWidget,
                               QTreeWidgetItem, QVBoxLayout, QWizardPage)

from engine.setup import supported_families

from ..work import Work, stop_and_wait

COLUMNS = ("Model", "Family", "Runs in Sluice", "Downloads", "Likes")
SEARCH_TIMEOUT_S = 6        # the hub client retries for up to half a minute offline: say so before that


def _results_tree() -> QTreeWidget:
    results = QTreeWidget()
    results.setHeaderLabels(COLUMNS)
    results.setRootIsDecorated(False)
    results.setAlternatingRowColors(True)
    header = results.header()
    header.setStretchLastSection(False)
    header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
    for col in range(1, len(COLUMNS)):
        header.setSectionResizeMode(col, QHeaderView.ResizeMode.ResizeToContents)
    return results


CATALOG_TEXT = Qt.ItemDataRole.UserRole + 1      # a catalog row's words, for the offline filter


class SearchPage(QWizardPage):
    def __init__(self, models_dir, parent=None):
        super().__init__(parent)
        self.models_dir = models_dir
        self.setTitle("Find a model")
        self.setSubTitle("Search the Hugging Face hub, or paste a model name (owner/name) or its address.")
        self.task: Work | None = None

        self.query = QLineEdit(placeholderText="e.g. Qwen3 MoE, or Qwen/Qwen3-30B-A3B")
        self.search_button = QPushButton("Search")
        self.search_button.setDefault(True)
        self.revision = QLineEdit(placeholderText="newest")
        self.revision.setMaximumWidth(160)
        self.token_button = QPushButton("Access token…")
        self.token_button.setToolTip("For gated or private models: a token from huggingface.co/settings/tokens")
        self.status = QLabel()
        self.status.setWordWrap(True)
        self.retry_button = QPushButton("Retry")
        self.retry_button.setVisible(False)
        self._timeout = QTimer(self, singleShot=True, interval=SEARCH_TIMEOUT_S * 1000)
        self._timeout.timeout.connect(lambda: self._on_failed(
            f"The Hugging Face hub did not answer within {SEARCH_TIMEOUT_S} s; check the internet connection "
            "and press Retry. The models listed here need no search."))
        self.results = _results_tree()

        row = QHBoxLayout()
        row.addWidget(self.query, 1)
        row.addWidget(self.search_button)
        options = QHBoxLayout()
        options.addWidget(QLabel("Revision:"))
        options.addWidget(self.revision)
        options.addStretch(1)
        options.addWidget(self.token_button)
        layout = QVBoxLayout(self)
        layout.addLayout(row)
        layout.addWidget(self.results, 1)
        status_row = QHBoxLayout()
        status_row.addWidget(self.status, 1)
        status_row.addWidget(self.retry_button)
        layout.addLayout(status_row)
        layout.addLayout(options)

        self.search_button.clicked.connect(self.search)
        self.retry_button.clicked.connect(self.search)
        self.query.returnPressed.connect(self.search)
        self.query.textEdited.connect(self._on_query_edited)
        self.query.textChanged.connect(self.completeChanged)
        self.results.itemSelectionChanged.connect(self.completeChanged)
        self.results.itemDoubleClicked.connect(lambda *_: self.wizard().next())
        self.token_button.clicked.connect(self.ask_token)

    def initializePage(self) -> None:
        self._list_unfinished()
        self._list_catalog()

    def _list_catalog(self) -> None:
        """The shipped catalog of supported models, shown before any search and offline."""
        from .catalog import load_catalog
        for model in load_catalog():
            item = QTreeWidgetItem([model.repo, model.family, "yes", "", ""])
            item.setData(0, Qt.ItemDataRole.UserRole, model.repo)
            item.setData(0, CATALOG_TEXT, f"{model.repo} {model.family} {model.note}".lower())
            item.setToolTip(0, model.describe())
            item.setText(0, f"{model.repo}  ({model.total_params_b:g}B, {model.active_params_b:g}B active, "
                            f"{model.download_gb:g} GB)")
            self.results.addTopLevelItem(item)
        if not self.status.text():
            self.status.setText("Models Sluice runs well, from its catalog; search the hub for others.")

    def _list_unfinished(self) -> None:
        """Downloads stopped earlier (paused, app closed, network lost) come first: one click continues."""
        from engine import format_size
        from .common import unfinished_downloads
        unfinished = unfinished_downloads(self.models_dir)
        for repo_id, revision, on_disk in unfinished:
            item = QTreeWidgetItem([f"{repo_id} — unfinished, {format_size(on_disk)} downloaded", "", "yes", "", ""])
            item.setData(0, Qt.ItemDataRole.UserRole, repo_id)
            item.setData(1, Qt.ItemDataRole.UserRole, revision)
            item.setToolTip(0, "Continue this download where it stopped")
            self.results.addTopLevelItem(item)
        if unfinished:
            self.results.setCurrentItem(self.results.topLevelItem(0))
            self.status.setText(f"{len(unfinished)} unfinished download(s): pick one and press Next to continue, "
                                "or search for another model.")

    # --- search ------------------------------------------------------------------------------------
    def search(self) -> None:
        from engine.setup import search
        text = self.query.text().strip()
        if self.task is not None and self.task.is_running():    # a search that hangs: let it end on its own
            self.task.result.disconnect()
            self.task.failed.disconnect()
        self.status.setText("Searching the hub…")
        self.search_button.setEnabled(False)
        self.retry_button.setVisible(False)
        self._timeout.start()
        self.task = Work(lambda report, stop: search(text), "hub search")
        self.task.on(result=self._on_results, failed=self._on_failed).start()

    def _on_results(self, hits) -> None:
        if not self._timeout.isActive():
            return                                  # too late: the timeout message is showing
        self._timeout.stop()
        self.search_button.setEnabled(True)
        self.results.clear()
        for hit in hits:
            item = QTreeWidgetItem([hit.repo_id, hit.family or "?", "yes" if hit.is_supported else "no",
                                    f"{hit.downloads:,}", f"{hit.likes:,}"])
            item.setData(0, Qt.ItemDataRole.UserRole, hit.repo_id)
            for col in (3, 4):
                item.setTextAlignment(col, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            if not hit.is_supported:
                for col in range(len(COLUMNS)):
                    item.setForeground(col, self.palette().placeholderText())
                item.setToolTip(0, f"Sluice runs {', '.join(supported_families())} models")
            self.results.addTopLevelItem(item)
        supported = sum(h.is_supported for h in hits)
        self.status.setText(f"{len(hits)} models found, {supported} of them run in Sluice (listed first)."
                            if hits else "No model matches; try other words, or paste the exact name.")
        if hits:
            self.results.setCurrentItem(self.results.topLevelItem(0))

    def _on_failed(self, message: str) -> None:
        self._timeout.stop()
        self.search_button.setEnabled(True)
        self.retry_button.setVisible(True)
        shown = self._filter_catalog(self.query.text())
        self.status.setText(f"<span style='color:#cf222e'>{message}</span>" + (f" Listed: the catalog's {shown} "
                            f"model{'s' if shown != 1 else ''} matching '{html.escape(self.query.text().strip())}'."
                            if self.query.text().strip() else ""))

    def _filter_catalog(self, text: str) -> int:
        """Offline, a search still narrows the catalog: its models whose name, family or note hold every word
        (unfinished downloads stay). -> how many catalog models are shown."""
        words = text.lower().split()
        shown = 0
        for i in range(self.results.topLevelItemCount()):
            item = self.results.topLevelItem(i)
            about = item.data(0, CATALOG_TEXT)
            if about is not None:
                item.setHidden(not all(word in about for word in words))
                shown += not item.isHidden()
        return shown

    def _on_query_edited(self, text: str) -> None:
        """A typed name wins over a picked row; the status says what Next would do with it."""
        self.results.clearSelection()
        if not text.strip():
            return
        ref = self.selected_ref()
        self.status.setText(f"Next: {ref[0]}." if ref else
                            "Press Search to look it up, or write the model's name as owner/name to go on.")

    def ask_token(self) -> None:
        from engine.setup import save_token
        token, ok = QInputDialog.getText(self, "Hugging Face access token",
                                         "Token for gated or private models (stored like the huggingface-cli does):",
                                         QLineEdit.EchoMode.Password)
        if ok and token.strip():
            save_token(token)
            self.status.setText("Access token saved.")

    # --- wizard protocol ---------------------------------------------------------------------------
    def selected_ref(self) -> tuple[str, str | None] | None:
        from engine import SluiceError
        from engine.setup import parse_repo_ref
        revision = self.revision.text().strip() or None
        item = self.results.currentItem()
        if item is not None and item.isSelected():
            return item.data(0, Qt.ItemDataRole.UserRole), revision or item.data(1, Qt.ItemDataRole.UserRole)
        try:
            repo_id, rev = parse_repo_ref(self.query.text())
        except SluiceError:
            return None
        return repo_id, revision or rev

    def isComplete(self) -> bool:
        return self.selected_ref() is not None

    def validatePage(self) -> bool:
        self.wizard().repo_ref = self.selected_ref()
        return True

    def cleanupPage(self) -> None:
        self._timeout.stop()
        stop_and_wait(self.task)
