"""The main window: conversations | chat (or the first-run page) | live panels, toolbar and status bar."""
from __future__ import annotations

import gc
import time
from pathlib import Path

from PySide6.QtCore import QByteArray, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QGuiApplication, QIcon, QKeySequence, QShortcut
from PySide6.QtWidgets import (QComboBox, QDockWidget, QFileDialog, QHBoxLayout, QLabel, QMainWindow, QProgressBar,
                               QPushButton, QScrollArea, QSizePolicy, QSplitter, QStackedWidget, QToolBar,
                               QVBoxLayout, QWidget)

from engine import parse_size

from .. import paths
from ..chat_controller import ChatController
from ..export import EXPORT_DIR_KEY, FILTERS, export_conversation, path_for_filter
from ..model_options import model_context, set_model_context
from ..models_dir import is_sluice_model
from ..settings import AppSettings
from ..store import Store
from ..worker import EngineHost
from . import theme
from .chat_view import ChatView
from .composer import Composer
from .conversation_list import ConversationList
from .chat_settings_dialog import ChatSettingsDialog
from .dialogs import error_box
from .elided_label import ElidedLabel
from .settings_dialog import AppSettingsDialog
from .first_run import FirstRunPage
from .panels import LivePanels
from .window_models import ModelActionsMixin, freeze_heap

FIRST_SIZE = (1280, 800)
MIN_HEIGHT = 480             # the chat and the composer keep room; pages and panels scroll below it


def first_size(available) -> tuple[int, int]:
    """The window's size on a first start: 1280 x 800, or less on a screen without room for it (a
    1366 x 768 laptop), so that the composer and the status bar are not below the screen's edge."""
    return min(FIRST_SIZE[0], available.width() * 95 // 100), min(FIRST_SIZE[1], available.height() * 92 // 100)


def _scrolling(panel: QWidget) -> QScrollArea:
    """A dock's panel that scrolls up and down below its own height, so that a short window or a dock beside it
    never squeezes its rows onto each other; as wide as its widest row, so it never scrolls sideways."""
    scroll = QScrollArea()
    scroll.setWidget(panel)
    scroll.setWidgetResizable(True)
    scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
    width = max(panel.minimumSizeHint().width(), panel.minimumWidth())
    scroll.setMinimumWidth(width + scroll.verticalScrollBar().sizeHint().width() + 2 * scroll.frameWidth())
    return scroll


class MainWindow(ModelActionsMixin, QMainWindow):
    model_loaded = Signal(dict)          # engine.info, after a model finished loading

    def __init__(self, store: Store | None = None, load_fn=None, autoload: bool = True):
        super().__init__()
        self.store = store or Store(paths.database_path())
        self.settings = AppSettings.load(self.store)
        self.host = EngineHost(self, load_fn=load_fn)
        self.controller = ChatController(self.store, self.host, self)
        self.model_info: dict | None = None
        self.loading_path: str | None = None
        self.failed_model_path: str | None = None   # the model whose last load failed (Settings retries it)
        self.last_dialog = None          # the latest error dialog or job progress dialog (tests read it)
        self.last_wizard = None          # the latest setup wizard (download or repack)
        self._job_dialogs: dict = {}     # job id -> JobDialog
        self._job_then_load: dict[int, bool] = {}
        self._stream_started_s: float | None = None
        self._last_stats: dict | None = None
        self._is_shut_down = False

        self.setWindowTitle(paths.APP_NAME)
        self.setWindowIcon(QIcon(str(paths.icon_path())))
        self.resize(*first_size(self.screen().availableGeometry().size()))
        self._build_toolbar()
        self._build_central()
        self._build_panels()
        self._build_menus()
        self._build_status_bar()
        self._build_shortcuts()
        self._connect()
        self._restore_window()
        for dock in (self.panels_dock, self.server_dock):
            dock.visibilityChanged.connect(self._on_dock_visibility)
        self._update_minimum_size()
        self.refresh_models()
        self.conversations.refresh()
        existing = self.store.conversations()
        if existing:
            self.controller.open_conversation(existing[0].id)
        self._update_page()
        if autoload and self.settings.last_model and is_sluice_model(Path(self.settings.last_model)):
            self.load_model(self.settings.last_model)
        freeze_heap()

    # construction ------------------------------------------------------------------------------------
    def _build_toolbar(self) -> None:
        bar = self.toolbar = QToolBar("Main")
        bar.setObjectName("mainToolbar")
        bar.setMovable(False)
        self.addToolBar(bar)
        bar.addWidget(QLabel(" Model "))
        self.model_picker = QComboBox()
        self.model_picker.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.model_picker.setMinimumContentsLength(22)      # long names elide; the tooltip has the whole name
        # wider where the toolbar has room (it takes a share of the spacer), up to a long model name
        self.model_picker.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.model_picker.setMaximumWidth(self.model_picker.fontMetrics().averageCharWidth() * 52)
        self.model_picker.setToolTip("Installed models (in the models folder set in Settings)")
        self.model_picker.activated.connect(self._on_model_picked)
        bar.addWidget(self.model_picker)
        self.open_action = bar.addAction("Open folder…", self.open_folder)
        self.open_action.setToolTip("Open a Sluice model folder or a Hugging Face snapshot folder")
        self.download_action = bar.addAction("Download…", self.open_download_wizard)
        self.remote_action = bar.addAction("Remote…", self.open_remote_endpoints)
        self.remote_action.setToolTip("Add an OpenAI-compatible endpoint (vLLM, SGLang, LM Studio, another Sluice)")
        bar.addSeparator()
        self.chat_settings_action = bar.addAction("Chat settings…", self.edit_chat_settings)
        self.chat_settings_action.setToolTip("System prompt and sampling for this chat")
        self.export_action = bar.addAction("Export…", lambda: self.export_conversation())
        spacer = QWidget()
        spacer.setSizePolicy(spacer.sizePolicy().horizontalPolicy().Expanding,
                             spacer.sizePolicy().verticalPolicy().Preferred)
        bar.addWidget(spacer)
        self.panels_action = bar.addAction("Panels")
        self.panels_action.setCheckable(True)
        self.settings_action = bar.addAction("Settings…", self.edit_app_settings)

    def minimumSizeHint(self) -> QSize:
        """What the docks and pages need, and no narrower than every toolbar action side by side (none hidden
        behind a chevron); the docks shown change it, so it is a hint, not a fixed minimum size."""
        return super().minimumSizeHint().expandedTo(QSize(self.toolbar.sizeHint().width() + 8, MIN_HEIGHT))

    def _on_dock_visibility(self, _visible: bool) -> None:
        QTimer.singleShot(0, self, self._update_minimum_size)      # once the dock layout has settled

    def _update_minimum_size(self) -> None:
        """The window's own minimum follows the hint (a shown dock needs room); a top-level window does not."""
        self.setMinimumSize(0, 0)                   # the layout's own minimum, without the previous one
        self.setMinimumSize(self.minimumSizeHint())

    def _build_central(self) -> None:
        self.conversations = ConversationList(self.controller)
        self.conversations.setMinimumWidth(160)
        self.chat_view = ChatView(self.controller)
        self.composer = Composer()
        chat_page = QWidget()
        chat_layout = QVBoxLayout(chat_page)
        chat_layout.setContentsMargins(0, 0, 0, 0)
        chat_layout.setSpacing(0)
        chat_layout.addWidget(self.chat_view, 1)
        composer_row = QHBoxLayout()              # centred under the chat column, as wide as it
        composer_row.addStretch(1)
        composer_row.addWidget(self.composer, 100)
        composer_row.addStretch(1)
        chat_layout.addLayout(composer_row)
        self.first_run = FirstRunPage()
        self.pages = QStackedWidget()
        self.pages.addWidget(self.first_run)
        self.pages.addWidget(chat_page)
        self.chat_page = chat_page
        splitter = QSplitter()
        splitter.addWidget(self.conversations)
        splitter.addWidget(self.pages)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([240, 800])
        self.setCentralWidget(splitter)

    def _build_panels(self) -> None:
        self.panels = LivePanels(self.host.telemetry, lambda: self.host.native_thread_id,
                                 lambda: self.host.worker.pinned_cores, lambda: self.host.worker.compute_threads)
        self.panels_dock = QDockWidget("Machinery (live)", self)
        self.panels_dock.setObjectName("panelsDock")
        self.panels_dock.setWidget(_scrolling(self.panels))
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.panels_dock)
        self.panels_dock.setVisible(self.settings.show_panels)
        self.panels_action.setChecked(self.settings.show_panels)
        self.panels_action.toggled.connect(self.panels_dock.setVisible)
        # toggleViewAction, not visibilityChanged: a dock behind the Server tab is not closed
        self.panels_dock.toggleViewAction().toggled.connect(self._on_panels_visibility)
        from .server_panel import ServerPanel
        self.server_panel = ServerPanel(self.host.worker, self.settings.server)
        self.server_panel.error.connect(self.show_error)
        self.server_dock = QDockWidget("Local server", self)
        self.server_dock.setObjectName("serverDock")
        self.server_dock.setWidget(_scrolling(self.server_panel))
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.server_dock)
        # a tab beside Machinery, not stacked under it: opening it never squeezes the panels to one box
        self.tabifyDockWidget(self.panels_dock, self.server_dock)
        self.server_dock.setVisible(False)          # opened by the Server button
        self.server_action = self.server_dock.toggleViewAction()
        self.server_action.setText("Server")
        self.server_action.setToolTip("Local server: serve the loaded model over the OpenAI, Anthropic and Ollama APIs")
        self.server_action.triggered.connect(lambda checked: checked and self.server_dock.raise_())
        self.toolbar.insertAction(self.settings_action, self.server_action)

    def _build_status_bar(self) -> None:
        status = self.statusBar()
        self.model_label = ElidedLabel("No model")        # the longest: it gives way to the speed and device
        self.device_label = QLabel("")
        self.speed_label = QLabel("")
        self.load_bar = QProgressBar()
        self.load_bar.setMaximumWidth(220)
        self.load_bar.setVisible(False)
        self.load_cancel = QPushButton("Cancel")
        self.load_cancel.setVisible(False)
        self.load_cancel.clicked.connect(self.cancel_load)
        status.addWidget(self.model_label)
        status.addWidget(self.load_bar)
        status.addWidget(self.load_cancel)
        status.addPermanentWidget(self.speed_label)
        status.addPermanentWidget(self.device_label)

    def _build_menus(self) -> None:
        bar = self.menuBar()
        file = bar.addMenu("&File")
        file.addAction("&New chat", QKeySequence.StandardKey.New, self.controller.new_conversation)
        file.addAction("&Open model folder…", QKeySequence.StandardKey.Open, self.open_folder)
        file.addAction("&Download a model…", self.open_download_wizard)
        file.addAction("&Export chat…", QKeySequence("Ctrl+E"), lambda: self.export_conversation())
        file.addSeparator()
        self.quit_action = file.addAction("&Quit", QKeySequence("Ctrl+Q"), self.close)
        edit = bar.addMenu("&Edit")
        edit.addAction("&Stop the answer", self.controller.stop)
        edit.addAction("&Chat settings…", self.edit_chat_settings)
        edit.addSeparator()
        edit.addAction("Se&ttings…", QKeySequence.StandardKey.Preferences, self.edit_app_settings)
        view = bar.addMenu("&View")
        view.addAction(self.panels_action)
        view.addAction("&Focus the message box", QKeySequence("Ctrl+L"), self.composer.edit.setFocus)
        help_menu = bar.addMenu("&Help")
        help_menu.addAction("&About Sluice", self.show_about)

    def show_about(self) -> None:
        from .about import show_about
        self.last_dialog = show_about(self)

    def _build_shortcuts(self) -> None:
        QShortcut(QKeySequence(Qt.Key.Key_Escape), self, self.controller.stop)

    def _connect(self) -> None:
        c, h = self.controller, self.host
        self.composer.send_requested.connect(self.send)
        self.composer.resend_requested.connect(self._resend)
        self.composer.stop_requested.connect(c.stop)
        self.chat_view.edit_requested.connect(self.composer.begin_edit)
        self.conversations.export_requested.connect(self._export_by_id)
        c.generating_changed.connect(self._on_generating_changed)
        c.conversation_opened.connect(lambda *_: self._update_composer())
        c.error.connect(self.show_error)
        h.load_progress.connect(self._on_load_progress)
        h.loaded.connect(self._on_loaded)
        h.load_failed.connect(self._on_load_failed)
        h.chunk.connect(self._on_chunk)
        h.finished.connect(self._on_finished)
        h.estimated.connect(self._on_estimated)
        h.job_progress.connect(self._on_job_progress)
        h.job_finished.connect(self._on_job_finished)
        h.job_failed.connect(self._on_job_failed)
        self.first_run.open_folder_requested.connect(self.open_folder)
        self.first_run.demo_requested.connect(self.start_demo)
        self.first_run.download_requested.connect(self.open_download_wizard)
        QGuiApplication.styleHints().colorSchemeChanged.connect(self._on_color_scheme)

    # chat --------------------------------------------------------------------------------------------
    def _update_page(self) -> None:
        has_model = self.model_info is not None or self.loading_path is not None
        has_installed = self.model_picker.count() > 1
        has_history = bool(self.controller.conversations())
        show_first_run = not (has_model or has_installed or has_history)
        self.pages.setCurrentWidget(self.first_run if show_first_run else self.chat_page)

    def send(self, text: str) -> None:
        if self.model_info is None:
            self.composer.edit.setPlainText(text)
            self.show_error("The model is still loading; wait a moment and send again." if self.loading_path
                            else "No model is loaded; choose one in the Model list at the top, or open a folder.")
            return
        self.controller.send(text)

    def _resend(self, message_id: int, text: str) -> None:
        if self.model_info is None:
            self.show_error("No model is loaded; choose one in the Model list at the top, or open a folder.")
            return
        self.controller.edit_and_resend(message_id, text)

    def _update_composer(self) -> None:
        self.composer.set_generating(self.controller.is_generating_here, self.controller.streaming_title())

    def _on_generating_changed(self, is_generating: bool) -> None:
        """Send/Stop and the status bar follow the engine: set on start, cleared on every end (done,
        stopped before the first token, failed); a finished answer's speed is set after this."""
        self._update_composer()
        self.panels.set_busy(is_generating)
        self._stream_started_s = None
        self.speed_label.setToolTip("")
        self.speed_label.setText("generating…" if is_generating else "")

    def _on_chunk(self, _request_id: int, _text: str, num_tokens: int) -> None:
        now = time.perf_counter()
        if self._stream_started_s is None:
            self._stream_started_s = now
            self._stream_first_tokens = num_tokens
        elif now > self._stream_started_s:
            rate = (num_tokens - self._stream_first_tokens) / (now - self._stream_started_s)
            self.speed_label.setText(f"{rate:.1f} tok/s")

    def _on_finished(self, _request_id: int, stats: dict) -> None:
        self._last_stats = stats
        if stats.get("tok_s"):
            self.speed_label.setText(f"{stats['tok_s']:.1f} tok/s · TTFT {stats.get('ttft_s') or 0:.2f} s")
            self._request_prediction()

    def _request_prediction(self) -> None:
        """Ask for the roofline prediction with the hit rates measured so far (shown beside the measured speed)."""
        snapshot = self.host.telemetry() or {}

        def hit_rate(section: str) -> float:
            counts = snapshot.get(section) or {}
            lookups = counts.get("hits", 0) + counts.get("misses", 0)
            return counts.get("hits", 0) / lookups if lookups else 0.0
        self.host.estimate_speed(hit_rate("vram"), hit_rate("ram_cache"))

    def _on_estimated(self, prediction: dict) -> None:
        self.panels.predicted_tok_s = prediction["tok_s"]
        stats = self._last_stats or {}
        if stats.get("tok_s") and not self.controller.is_generating:
            self.speed_label.setText(f"{stats['tok_s']:.1f} tok/s of {prediction['tok_s']:.1f} possible · "
                                     f"TTFT {stats.get('ttft_s') or 0:.2f} s")
            self.speed_label.setToolTip("“Possible”: the fastest this machine could go, from its measured disk "
                                        "and memory speeds at the cache hit rates seen so far (the setup wizard's "
                                        "estimate). The gap to the measured speed is per-read and per-layer "
                                        "overhead, largest on tiny models.")

    def edit_chat_settings(self) -> None:
        if self.controller.conversation is None:
            self.controller.new_conversation()
        dialog = ChatSettingsDialog(self.controller.conversation.settings, self, self.controller)
        dialog.accepted.connect(lambda: self.controller.set_chat_settings(dialog.value()))
        dialog.open()
        self.last_dialog = dialog

    def open_remote_endpoints(self) -> None:
        from .remote_dialog import RemoteEndpointsDialog
        dialog = RemoteEndpointsDialog(self.settings, self)
        dialog.changed.connect(lambda: (self.settings.save(self.store), self.refresh_models()))
        dialog.open()
        self.last_dialog = dialog

    def edit_app_settings(self) -> None:
        path = self.model_info["path"] if self.model_info else None
        dialog = AppSettingsDialog(self.settings, self, self.model_info,
                                   model_context(self.store, path) if path else None)
        dialog.accepted.connect(lambda: self.apply_app_settings(dialog.value(), dialog.context_value()))
        dialog.open()
        self.last_dialog = dialog

    def apply_app_settings(self, settings: AppSettings, context: int | None = None) -> None:
        """Save the settings; the model (the loaded one, or the one whose load just failed) is reloaded when
        the device, a budget or its context changed, so changing a setting back undoes it."""
        try:
            for value in (settings.vram_budget, settings.ram_cache):
                if value:
                    parse_size(value)
        except Exception as exc:
            self.show_error(str(exc))
            return
        path = self.model_info["path"] if self.model_info else self.failed_model_path
        engine_settings = lambda s: (s.device, s.vram_budget, s.ram_cache, s.dense_weights)   # noqa: E731
        reload = engine_settings(settings) != engine_settings(self.settings)
        if self.model_info and context != model_context(self.store, path):
            set_model_context(self.store, path, context)
            reload = True
        self.settings = settings
        self.settings.save(self.store)
        self.refresh_models()
        if path and (reload or self.failed_model_path):
            self.load_model(path)

    def export_conversation(self, path: str | Path | None = None) -> Path | None:
        conversation = self.controller.conversation
        if conversation is None:
            self.show_error("Open a chat first; there is nothing to export yet.")
            return None
        if path is None:
            safe = "".join(ch if ch.isalnum() or ch in " -_" else "_" for ch in conversation.title).strip() or "chat"
            folder = Path(self.store.get_setting(EXPORT_DIR_KEY, "") or Path.home())
            path, selected = QFileDialog.getSaveFileName(self, "Export chat", str(folder / f"{safe}.md"),
                                                         ";;".join(FILTERS))
            if not path:
                return None
            path = path_for_filter(path, selected)
            self.store.set_setting(EXPORT_DIR_KEY, str(Path(path).parent))
        try:
            return export_conversation(path, conversation, self.controller.messages())
        except OSError as exc:
            self.show_error(f"Could not write '{path}' ({exc.strerror}); choose another place.")
            return None

    def _export_by_id(self, conversation_id: int) -> None:
        self.controller.open_conversation(conversation_id)
        self.export_conversation()

    def show_error(self, sentence: str, title: str = "Sluice") -> None:
        self.last_dialog = error_box(self, sentence, title)

    # window ------------------------------------------------------------------------------------------
    def _on_panels_visibility(self, visible: bool) -> None:
        if self.isVisible():
            self.panels_action.setChecked(visible)

    def _on_color_scheme(self, _scheme) -> None:
        self.chat_view.set_dark(theme.is_dark())
        self.panels.apply_palette()

    def _restore_window(self) -> None:
        if self.settings.window_geometry:
            self.restoreGeometry(QByteArray.fromHex(self.settings.window_geometry.encode()))
        if self.settings.window_state:
            self.restoreState(QByteArray.fromHex(self.settings.window_state.encode()))
            self.panels_dock.setVisible(self.settings.show_panels)

    def shutdown(self) -> bool:
        """Stop generating, save settings, join the engine thread, close the database. Safe to call twice."""
        if self._is_shut_down:
            return True
        self._is_shut_down = True
        self.panels.timer.stop()
        self.settings.show_panels = self.panels_action.isChecked()
        self.settings.server = self.server_panel.settings
        self.settings.window_geometry = bytes(self.saveGeometry().toHex()).decode()
        self.settings.window_state = bytes(self.saveState().toHex()).decode()
        self.settings.save(self.store)
        self.controller.stop()
        self.server_panel.shutdown()
        ended = self.host.shutdown()        # delivers the answer's last chunks before the database closes
        self.store.close()
        gc.unfreeze()         # let interpreter exit (and the next window) see every object again
        return ended

    def closeEvent(self, event) -> None:
        self.shutdown()
        super().closeEvent(event)
