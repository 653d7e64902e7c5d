"""The page a user with no model sees first: open a folder, try the demo, or download a model."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QScrollArea, QVBoxLayout, QWidget

from .. import paths
from . import theme


class FirstRunPage(QWidget):
    open_folder_requested = Signal()
    demo_requested = Signal()
    download_requested = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        content = QWidget()
        outer = QVBoxLayout(content)
        outer.addStretch(1)
        card = QFrame()
        card.setMinimumWidth(320)    # narrow windows (900 px with panels) shrink it; its labels wrap
        card.setMaximumWidth(560)
        layout = QVBoxLayout(card)
        layout.setSpacing(10)
        icon = QLabel()
        icon.setPixmap(QIcon(str(paths.icon_path())).pixmap(72, 72))
        icon.setAlignment(Qt.AlignmentFlag.AlignCenter)
        title = QLabel("Welcome to Sluice")
        title.setAlignment(Qt.AlignmentFlag.AlignCenter)
        title.setStyleSheet("font-size: 22px; font-weight: 600;")
        intro = QLabel("Sluice runs Mixture-of-Experts models larger than your GPU and RAM by streaming "
                       "experts from disk. No model is installed yet; pick one way to start.")
        intro.setWordWrap(True)
        intro.setAlignment(Qt.AlignmentFlag.AlignCenter)
        layout.addWidget(icon)
        layout.addWidget(title)
        layout.addWidget(intro)
        layout.addSpacing(8)

        self.open_button = self._choice(layout, "Open folder…",
                                        "A Sluice model folder, or a Hugging Face snapshot folder "
                                        "(repacked into your models folder).")
        self.open_button.clicked.connect(self.open_folder_requested)
        self.download_button = self._choice(layout, "Download a model…",
                                            "Pick a model that fits this computer and download it.")
        self.download_button.clicked.connect(self.download_requested)
        self.demo_button = self._choice(layout, "Try the demo model (it produces noise)",
                                        "A tiny Mixture-of-Experts model generated here in seconds. Its answers "
                                        "are gibberish by design; it shows the app, the streaming and the panels "
                                        "without any download.")
        self.demo_button.clicked.connect(self.demo_requested)
        # Centred by stretches, not by an alignment flag: an aligned widget gets its size hint's height,
        # computed before its labels wrap to the card's real width, and the last note was cut off.
        row = QHBoxLayout()
        row.addStretch(1)
        row.addWidget(card, 4)
        row.addStretch(1)
        outer.addLayout(row)
        outer.addStretch(2)
        self._scrolled(content)

    def _scrolled(self, content: QWidget) -> None:
        """A window at its minimum height scrolls the page, never cuts its text."""
        scroll = QScrollArea()
        scroll.setWidget(content)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setMinimumWidth(360)       # the card's minimum and its margins: the scroll area does not pass it on
        page = QVBoxLayout(self)
        page.setContentsMargins(0, 0, 0, 0)
        page.addWidget(scroll)

    def _choice(self, layout: QVBoxLayout, text: str, explanation: str) -> QPushButton:
        button = QPushButton(text)
        button.setMinimumHeight(40)
        note = QLabel(explanation)
        note.setWordWrap(True)
        note.setStyleSheet(f"color: {theme.muted_color()}; margin-bottom: 6px;")
        layout.addWidget(button)
        layout.addWidget(note)
        return button
