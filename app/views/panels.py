"""Live panels: the streaming machinery, refreshed ~10 times a second from the engine's telemetry() (never per token)."""
from __future__ import annotations

import math
import time

import psutil
import pyqtgraph as pg
from PySide6.QtCore import QTimer, Qt
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QFormLayout, QGroupBox, QHBoxLayout, QLabel, QProgressBar, QVBoxLayout, QWidget

from engine import format_size
from engine.setup import format_cpu_list

from ..gpu_info import GpuInfo
from ..telemetry_history import GB, TelemetryHistory, thread_last_core
from .slot_map import NO_MODEL_TEXT, REMOTE_TEXT, STATE_COLORS, SlotMap

REFRESH_MS = 100          # while the engine works (generating, loading)
IDLE_REFRESH_MS = 1000    # while it waits: nothing moves but the clock; hidden panels do not refresh at all
PLOT_HEIGHT_PX = 84
COLORS = {"engine": "#3b82f6", "system": "#9ca3af", "prefill": "#f59e0b", "decode": "#10b981", "hit": "#8b5cf6"}


def _memory_text(snapshot: dict) -> str:
    """"0.9 GB besides the cache · VRAM 3.6 GB (driver) of a 3.7 GB budget"."""
    process, vram = snapshot.get("process") or {}, snapshot.get("vram") or {}
    if not process.get("non_cache_anon_bytes"):
        return "—"                                  # no engine yet: nothing measured
    text = f"{format_size(process.get('non_cache_anon_bytes', 0))} besides the cache"
    if vram.get("driver_bytes"):
        text += (f" · VRAM {format_size(vram['driver_bytes'])} (driver) of a "
                 f"{format_size(vram.get('budget_bytes', 0))} budget")
    return text


def _disk_text(snapshot: dict) -> str:
    disk, h2d, cpu = (snapshot.get(key) or {} for key in ("disk", "h2d", "cpu"))
    text = f"engine read {format_size(disk.get('bytes_read', 0))} · host→device {format_size(h2d.get('bytes', 0))}"
    if cpu.get("experts"):
        text += f" · computed on the CPU {format_size(cpu['bytes'])} ({cpu['experts']} experts)"
    return text


def _ngram_text(snapshot: dict) -> str | None:
    """A PLE model's n-gram rows (engine.runtime.ngram), None for other models: rows and bytes a token, the hot
    rows' hit rate, bytes read per byte used (a row is read with its page)."""
    ngram = snapshot.get("ngram") or {}
    if not ngram.get("tokens"):
        return None
    held = "of hot rows"
    if ngram.get("held"):
        read = ngram["held_read_bytes"]
        held = "of tables held in RAM" + (f" ({format_size(read)} read so far)" if read < ngram["cache_bytes"] else "")
    return (f"n-gram rows: {ngram['rows_per_token']:.1f} a token · {format_size(ngram['bytes_per_token'])} read a "
            f"token · hit rate {_percent(ngram['hit_rate'])} · read amplification {ngram['read_amplification']:.1f}x"
            f" · {format_size(ngram['cache_bytes'])} {held}")


def _fit_from_zero(plot, values: list[float]) -> None:
    """A rate's axis runs from 0 to a little above its highest value, so a dip from 4.3 to 4.1 tok/s looks like
    the 5 % it is (an auto range fitted to the values would draw it as a fall to nothing)."""
    top = max((v for v in values if math.isfinite(v)), default=0.0)
    _set_y_range(plot, 0, top * 1.1 if top > 0 else 1)


def _set_y_range(plot, bottom: float, top: float) -> None:
    """The range, and labels 1, 2 or 5 times a power of ten apart, one to three steps up the ~60 px axis
    (pyqtgraph's own spacing put six labels there, touching)."""
    plot.setYRange(bottom, top, padding=0)
    quarter = (top - bottom) / 4
    power = 10 ** math.floor(math.log10(quarter))
    major = next(m * power for m in (1, 2, 5, 10) if m * power > quarter)
    plot.getAxis("left").setTickSpacing(major, major)


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.0f} %"


class LivePanels(QWidget):
    def __init__(self, telemetry_source, thread_id_source=lambda: None, pinned_cores_source=lambda: None,
                 compute_threads_source=lambda: None, parent: QWidget | None = None):
        """telemetry_source() -> snapshot dict or None (no model); thread_id_source() -> the engine thread's
        native id; pinned_cores_source() -> the cores it is pinned to, or None; compute_threads_source() ->
        torch's threads for its ops, or None."""
        super().__init__(parent)
        self._telemetry_source = telemetry_source
        self._thread_id_source = thread_id_source
        self._pinned_cores_source = pinned_cores_source
        self._compute_threads_source = compute_threads_source
        self.history = TelemetryHistory()
        self.gpu = GpuInfo()
        self.engine_device: str | None = None
        self.predicted_tok_s: float | None = None      # the fastest this machine could go (engine.plan.estimate)
        self._ticks = 0
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        self.remote_label = QLabel("")          # shown while the chat model runs on a remote endpoint
        self.remote_label.setWordWrap(True)
        self.remote_label.setObjectName("remoteNotice")
        self.remote_label.setVisible(False)
        layout.addWidget(self.remote_label)
        layout.addWidget(self._build_hardware_box())
        layout.addWidget(self._build_slots_box())
        layout.addWidget(self._build_cache_box())
        layout.addWidget(self._build_throughput_box())
        layout.addStretch(1)

        self.timer = QTimer(self, interval=IDLE_REFRESH_MS)
        self.timer.timeout.connect(self.refresh)
        self.is_busy = False
        self.apply_palette()

    def _build_hardware_box(self) -> QGroupBox:
        box = QGroupBox("Hardware")
        form = QFormLayout(box)
        self.device_label = QLabel("CPU")
        self.gpu_label = QLabel("no GPU (NVML not available)")
        self.core_label = QLabel("—")
        self.speed_label = QLabel("—")
        self.speculation_label = QLabel("—")
        self.memory_label = QLabel("—")
        for label in (self.gpu_label, self.core_label, self.speed_label, self.memory_label):   # long lines wrap:
            label.setWordWrap(True)                                                             # nothing is cut
        self.memory_label.setToolTip("What this process holds besides the RAM cache (anonymous memory: torch, CUDA, Qt, "
                                     "Python), and the GPU memory the driver shows for it against the VRAM budget.")
        self.speed_label.setToolTip("Measured decode and prefill speed; “possible” is the fastest this machine "
                                    "could go at the cache hit rates seen so far.")
        form.addRow("Device", self.device_label)
        form.addRow("GPU", self.gpu_label)
        form.addRow("Decode thread", self.core_label)
        form.addRow("Tokens/s", self.speed_label)
        form.addRow("Speculation recall", self.speculation_label)
        form.addRow("Process memory", self.memory_label)
        return box

    def _build_slots_box(self) -> QGroupBox:
        """The slot map with a legend of its states' colours."""
        self.slots_box = QGroupBox("Device slots")
        self.slot_map = SlotMap()
        self.slot_legend = QWidget()                  # hidden where there are no slots to explain (a remote model)
        legend = QHBoxLayout(self.slot_legend)
        legend.setContentsMargins(0, 0, 0, 0)
        for state, color in STATE_COLORS.items():
            legend.addWidget(QLabel(f'<span style="color:{color.name()}">■</span> {state}'))
        legend.addStretch(1)
        box_layout = QVBoxLayout(self.slots_box)
        box_layout.addWidget(self.slot_map)
        box_layout.addWidget(self.slot_legend)
        return self.slots_box

    def _build_cache_box(self) -> QGroupBox:
        box = QGroupBox("RAM cache")
        self.cache_bar = QProgressBar()
        self.cache_bar.setRange(0, 1000)
        self.cache_bar.setFormat("—")
        self.cache_label = QLabel("hits 0 · misses 0 · evictions 0")
        self.cache_label.setWordWrap(True)
        self.hit_plot, self.hit_curves = self._plot("hit rate", {"interval": COLORS["hit"]}, y_range=(0, 100),
                                                    units="%")
        self.ngram_label = QLabel("")          # shown for models with n-gram tables: their rows share the RAM budget
        self.ngram_label.setWordWrap(True)
        self.ngram_label.setToolTip("Rows of the model's n-gram tables a token reads from disk, through a cache of "
                                    "hot rows in RAM; a row is read with its whole 4 KiB page.")
        self.ngram_label.setVisible(False)
        box_layout = QVBoxLayout(box)
        box_layout.addWidget(self.cache_bar)
        box_layout.addWidget(self.cache_label)
        box_layout.addWidget(self.ngram_label)
        box_layout.addWidget(self.hit_plot)
        return box

    def _build_throughput_box(self) -> QGroupBox:
        """Tokens per second (first: what a user watches), disk reads (the engine's and the whole system's) and
        host-to-device copies."""
        box = QGroupBox("Throughput")
        self.disk_plot, self.disk_curves = self._plot("disk reads, last 60 s", {"engine": COLORS["engine"],
                                                                 "system": COLORS["system"]}, units="B/s")
        self.h2d_plot, self.h2d_curves = self._plot("host → device copies", {"h2d": COLORS["engine"]}, units="B/s")
        self.tok_plot, self.tok_curves = self._plot("tokens per second", {"decode": COLORS["decode"],
                                                                          "prefill": COLORS["prefill"]},
                                                    units="tok/s")
        self.disk_label = QLabel("engine read 0 B")
        self.disk_label.setWordWrap(True)
        box_layout = QVBoxLayout(box)
        for widget in (self.tok_plot, self.disk_label, self.disk_plot, self.h2d_plot):
            box_layout.addWidget(widget)
        return box

    def _plot(self, title: str, curves: dict[str, str], y_range=None, units: str | None = None):
        """A small plot; its axis shows human units (SI prefixes: "80 kB/s", not "8e-05") and its legend is
        in the title, coloured like the lines, so it never hides them."""
        plot = pg.PlotWidget()
        plot.setFixedHeight(PLOT_HEIGHT_PX)
        plot.setMenuEnabled(False)
        plot.setMouseEnabled(x=False, y=False)
        plot.hideButtons()
        # no grid: its lines cost half the paint time of a plot (about 2.5 of 5 ms)
        if len(curves) > 1:
            title += ": " + " · ".join(f"<span style='color:{color}'>{name}{' (dashed)' if name == 'system' else ''}"
                                        f"</span>" for name, color in curves.items())
        plot.setTitle(title, size="8pt")
        if units:
            plot.setLabel("left", units=units)
            plot.getAxis("left").enableAutoSIPrefix(units != "%")
        _set_y_range(plot, *(y_range or (0, 1)))             # a rate's top follows its values (_fit_from_zero)
        plot.getViewBox().setLimits(yMin=0)          # all values are >= 0; no empty negative half
        plot.hideAxis("bottom")                      # x: the last 60 s, newest on the right
        plot.getPlotItem().layout.setContentsMargins(2, 4, 6, 8)   # room for the lowest tick's label
        # the system's disk reads include the engine's own; draw them dashed, beneath the engine's line
        items = {name: plot.plot([], [], name=name, connect="finite",
                                 pen=pg.mkPen(color, width=2, style=Qt.PenStyle.DashLine if name == "system"
                                              else Qt.PenStyle.SolidLine))
                 for name, color in sorted(curves.items(), key=lambda kv: kv[0] != "system")}
        return plot, items

    def apply_palette(self) -> None:
        background = self.palette().color(QPalette.ColorRole.Base)
        foreground = self.palette().color(QPalette.ColorRole.Text)
        for plot in (self.hit_plot, self.disk_plot, self.h2d_plot, self.tok_plot):
            plot.setBackground(background)
            for axis in ("left", "bottom"):
                plot.getAxis(axis).setPen(foreground)
                plot.getAxis(axis).setTextPen(foreground)
            plot.getPlotItem().titleLabel.setText(plot.getPlotItem().titleLabel.text, color=foreground, size="8pt")

    # refresh ---------------------------------------------------------------------------------------
    def set_busy(self, is_busy: bool) -> None:
        """10 Hz while the engine works, 1 Hz while it waits (after one refresh with its final figures)."""
        self.is_busy = is_busy
        self.timer.setInterval(REFRESH_MS if is_busy else IDLE_REFRESH_MS)
        if not is_busy and self.isVisible():
            self.refresh(every_plot=True)

    def showEvent(self, event) -> None:
        super().showEvent(event)
        self.refresh(every_plot=True)
        self.timer.start()

    def hideEvent(self, event) -> None:
        super().hideEvent(event)
        self.timer.stop()

    def refresh(self, every_plot: bool = False) -> None:
        """One tick: the labels, and the plot whose turn it is (every plot when asked: shown, or work ended)."""
        snapshot = self._telemetry_source() or {}
        try:
            system_read = psutil.disk_io_counters().read_bytes
        except (AttributeError, RuntimeError):     # no disks visible (some containers)
            system_read = None
        self.history.push(snapshot, time.monotonic(), system_read, is_busy=self.is_busy)
        self._ticks += 1
        self._update_labels(snapshot)
        if self.isVisible():
            self._update_plots(None if every_plot else self._ticks)

    def _update_labels(self, snapshot: dict) -> None:
        self._update_device(snapshot)
        if self._ticks % 5 == 1:                  # NVML at 2 Hz is plenty
            self._update_gpu()
        self.core_label.setText(self._core_text(snapshot))
        self.speed_label.setText(self._speed_text(snapshot))
        spec = snapshot.get("speculation") or {}
        self.speculation_label.setText(f"{_percent(self.history.speculation_recall())} "
                                       f"({spec.get('correct', 0)} of {spec.get('predicted', 0)})")
        self._update_cache()
        ngram = _ngram_text(snapshot)
        self.ngram_label.setVisible(ngram is not None)
        self.ngram_label.setText(ngram or "")
        self.disk_label.setText(_disk_text(snapshot))
        self.memory_label.setText(_memory_text(snapshot))
        self.slot_map.set_slots(self.history.slots())

    def _update_device(self, snapshot: dict) -> None:
        device = str(snapshot.get("device") or self.engine_device or "cpu")
        remote = snapshot.get("remote")
        self.remote_label.setVisible(bool(remote))
        if remote:
            self.remote_label.setText(f"<b>{remote['model']}</b> runs remotely at {remote['url']}: its speed and "
                                      f"time to first token are measured here; the slots, cache and disk below "
                                      f"are this computer's, idle.")
            self.device_label.setText(f"remote ({remote['url']})")
        else:
            self.device_label.setText("CPU" if device.startswith("cpu") else f"GPU ({device})")
        self.slot_map.empty_text = REMOTE_TEXT if remote else NO_MODEL_TEXT
        self.slot_legend.setVisible(not remote)
        self.slots_box.setTitle("Device slots" if remote else "Device slots (VRAM)" if device.startswith("cuda")
                                else "Device slots (in RAM: CPU device)")

    def _update_gpu(self) -> None:
        sample = self.gpu.sample()
        if not sample:
            self.gpu_label.setText("none: running on the CPU")
            return
        self.gpu_label.setText(f"{self.gpu.name}: {sample['util_percent']} % load, "
                               f"{format_size(sample['mem_used_bytes'])} / {format_size(sample['mem_total_bytes'])}")

    def _core_text(self, snapshot: dict) -> str:
        if snapshot.get("remote"):
            return "none here: the model decodes on its server"
        pinned = self._pinned_cores_source()
        running_on = thread_last_core(self._thread_id_source())
        if running_on is None and (snapshot.get("decode_thread_core") or -1) >= 0:
            running_on = int(snapshot["decode_thread_core"])
        if not pinned:
            return "—" if running_on is None else f"core {running_on} (not pinned)"
        threads = self._compute_threads_source()
        return (f"pinned to cores {format_cpu_list(pinned)}"
                + (f", running on core {running_on}" if running_on is not None else "")
                + (f"; {threads} compute thread{'s' if threads != 1 else ''}" if threads else ""))

    def _speed_text(self, snapshot: dict) -> str:
        """The measured speeds while the engine works; "idle" while it waits (not the last answer's figures)."""
        predicted = f" · possible {self.predicted_tok_s:.1f}" if self.predicted_tok_s else ""
        if not self.is_busy:
            return f"idle{predicted}"
        speed = snapshot.get("speed") or {}
        return (f"decode {speed.get('decode_tok_s', 0.0):.1f} · prefill "
                f"{speed.get('prefill_tok_s', 0.0):.1f}{predicted}")

    def _update_cache(self) -> None:
        cache = self.history.cache_summary()
        if cache["capacity_bytes"]:
            self.cache_bar.setValue(int(1000 * cache["used_bytes"] / cache["capacity_bytes"]))
            self.cache_bar.setFormat(f"{format_size(cache['used_bytes'])} of {format_size(cache['capacity_bytes'])}")
        else:
            self.cache_bar.setValue(0)
            self.cache_bar.setFormat("—")
        filled = cache["fill_reads"]
        self.cache_label.setText(f"hits {cache['hits']} · misses {cache['misses']} · evictions "
                                 f"{cache['evictions']} · hit rate {_percent(cache['hit_rate'])}"
                                 + (f" · {filled} filled ahead" if filled else ""))

    def _update_plots(self, only_turn: int | None = None) -> None:
        """Every plot, or only the one whose turn it is (`only_turn` counts refreshes): the plots take turns, so
        that a refresh paints one plot (3-5 ms with 60 s of history), not all four (11-20 ms in one go); each
        still moves 2.5 times a second while the engine works, and every 4 s while it waits."""
        h = self.history
        times = h.values("time_s")
        if not times:
            return
        x = [t - times[-1] for t in times]          # seconds before now
        plots = [(self.hit_plot, [(self.hit_curves["interval"], "hit_rate", 100)]),   # (curve, history name, scale)
                 (self.disk_plot, [(self.disk_curves["engine"], "disk_gbps", GB),      # bytes/s: SI axis
                                   (self.disk_curves["system"], "system_disk_gbps", GB)]),
                 (self.h2d_plot, [(self.h2d_curves["h2d"], "h2d_gbps", GB)]),
                 (self.tok_plot, [(self.tok_curves["decode"], "decode_tok_s", 1),
                                  (self.tok_curves["prefill"], "prefill_tok_s", 1)])]
        for plot, curves in plots if only_turn is None else [plots[only_turn % len(plots)]]:
            shown = []
            for curve, name, scale in curves:
                values = [scale * v for v in h.values(name)]
                curve.setData(x, values)
                shown += values
            if plot is not self.hit_plot:                 # the hit rate's axis is fixed at 0-100 %
                _fit_from_zero(plot, shown)

    def last_value(self, name: str) -> float:
        values = [v for v in self.history.values(name) if not math.isnan(v)]
        return values[-1] if values else 0.0
