"""How smooth the chat window stays while a long answer streams: the real main window (offscreen), a fake engine
that streams a Markdown answer of N words (think block, code fences, lists, tables) at a given token rate, and a
GUI-thread tick every 5 ms. Prints, per fifth of the answer, the longest stretch of the GUI thread's own work
between two ticks (its CPU time, which is what the app costs), the longest wall-clock gap between ticks (that
also holds the machine's scheduling) and the GUI thread's CPU time in that fifth.

    .venv/bin/python -m bench gui-stream [--words 5000] [--tok-s 400] [--no-panels] [--shots DIR]

--shots DIR saves the window halfway through the answer and at its end, then scrolled to the answer's start
(DIR/stream-{half,end,start}.png), to look at what the user saw.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path


SECTION = """## Step {n}: reading the blocks

The engine reads each expert block with one `pread` into a pinned slot, then copies it to the device while the
previous layer computes. Here is what step {n} does, in order:

1. Route the token: the router picks the top experts of this layer.
2. Look each expert up in the RAM cache:
   - a hit costs one copy over PCIe,
   - a miss costs a read from disk first.
3. Compute the experts that are ready and sum their outputs.

```python
def step_{n}(layer, hidden, cache):
    experts = layer.router(hidden).topk(8).indices
    blocks = [cache.get(layer.index, int(e)) for e in experts]
    return sum(block.forward(hidden) for block in blocks)
```

| where the expert is | cost per token | note |
|---|---|---|
| VRAM slot | ~0 | computed at once |
| RAM cache | 0.2 ms | one copy of {n} MB |
| disk | 1.5 ms | read, then copy |

> Prefetching the next layer's experts during this one hides most of the disk time.

Run it with `sluice generate MODEL --max-new-tokens {n}` and compare the speeds:

```bash
sluice generate ./model --prompt "hello" --max-new-tokens {n} --json
```

"""
THINK = ("<think>The user asks how the engine moves expert weights. I should explain the cache, the slots and the "
         "prefetch, with code and a table. Let me go step by step and keep each step short.</think>\n")


def answer_tokens(num_words: int) -> list[str]:
    """The answer as tokens (a word with the whitespace after it), about `num_words` words long."""
    text, n = THINK + "Here is how it works, step by step.\n\n", 1
    while len(text.split()) < num_words:
        text += SECTION.format(n=n)
        n += 1
    tokens, start = [], 0
    for index, char in enumerate(text):
        if char.isspace() and index + 1 < len(text) and not text[index + 1].isspace():
            tokens.append(text[start:index + 1])
            start = index + 1
    tokens.append(text[start:])
    return tokens


class StreamingFakeEngine:
    """Streams `tokens` at `tok_s` tokens per second, as the engine's generate() does."""
    info = {"name": "profile fake", "path": "/fake", "family": "fake", "quant": "none", "device": "cpu"}

    def __init__(self, tokens: list[str], tok_s: float):
        self.tokens, self.interval_s, self.generated = tokens, 1.0 / tok_s, 0

    def generate(self, messages, params):
        from engine import TokenEvent
        start = time.perf_counter()
        for i, piece in enumerate(self.tokens):
            while time.perf_counter() < start + i * self.interval_s:
                time.sleep(self.interval_s / 4)
            self.generated += 1
            is_last = i == len(self.tokens) - 1
            yield TokenEvent(i, piece, is_last, "length" if is_last else None)

    def cancel(self):
        pass

    def telemetry(self):
        return {"tokens": {"generated": self.generated}, "speed": {"decode_tok_s": 0.0}}

    def close(self):
        pass


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--words", type=int, default=5000)
    parser.add_argument("--tok-s", type=float, default=400)
    parser.add_argument("--no-panels", action="store_true", help="hide the live panels (the plots) while streaming")
    parser.add_argument("--shots", type=Path, help="save screenshots of the window into this folder")


def run(args) -> int:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    os.environ["SLUICE_DATA_DIR"] = tempfile.mkdtemp(prefix="sluice-profile-")
    from app.gui import create_application
    app = create_application()                                  # noqa: F841 - the QApplication lives for the run
    tokens = answer_tokens(args.words)
    engine = StreamingFakeEngine(tokens, args.tok_s)
    window = _open_window(engine, len(tokens), args.no_panels)
    camera = _Camera(window, args.shots)
    ticks, elapsed_s = _stream(window, engine, lambda: camera.halfway(engine.generated, len(tokens)))
    print(f"{len(ticks)} ticks; {len(tokens)} tokens ({args.words} words) at {args.tok_s:.0f} tok/s asked, "
          f"{len(tokens) / elapsed_s:.0f} tok/s shown; panels {'hidden' if args.no_panels else 'shown'}")
    print("\n".join(fifth_lines(ticks, len(tokens))))
    if args.shots:
        camera.end_and_start()
    window.shutdown()
    return 0


def _open_window(engine, num_tokens: int, no_panels: bool):
    """The real main window with the fake engine loaded, its answers long enough for every token."""
    from PySide6.QtCore import QEventLoop

    from app.store import ChatSettings
    from app.views.main_window import MainWindow
    window = MainWindow(autoload=False)
    window.host.worker._load_fn = lambda *_a, **_k: engine
    window.show()
    window.panels_dock.setVisible(not no_panels)
    loop = QEventLoop()
    window.model_loaded.connect(loop.quit)
    window.load_model("/fake")
    loop.exec()
    window.controller.set_chat_settings(ChatSettings(max_new_tokens=num_tokens + 10))
    return window


def _stream(window, engine, on_tick) -> tuple[list[tuple[float, float, int]], float]:
    """One answer streamed with a GUI-thread tick every 5 ms: (wall gap ms, GUI CPU ms in the gap, tokens so far)
    a tick, and the answer's seconds."""
    from PySide6.QtCore import QElapsedTimer, QEventLoop, QTimer
    ticks, clock, last_cpu = [], QElapsedTimer(), [time.thread_time()]

    def tick():
        now = time.thread_time()
        ticks.append((clock.restart(), (now - last_cpu[0]) * 1e3, engine.generated))
        last_cpu[0] = now
        on_tick()
    loop, probe = QEventLoop(), QTimer(interval=5)
    probe.timeout.connect(tick)
    window.controller.message_finished.connect(lambda _message: loop.quit())
    clock.start()
    probe.start()
    started = time.perf_counter()
    window.send("How does the engine move expert weights?")
    loop.exec()
    probe.stop()
    return ticks, time.perf_counter() - started


def fifth_lines(ticks: list[tuple[float, float, int]], num_tokens: int) -> list[str]:
    """Per fifth of the answer: the longest stretch of the GUI thread's own work, the longest gap, its CPU time."""
    lines = ["fifth  longest own work (ms)  longest gap (ms)  GUI CPU (s)"]
    for fifth in range(5):
        part = [t for t in ticks[1:] if fifth * num_tokens / 5 <= t[2] < (fifth + 1) * num_tokens / 5]
        if part:
            lines.append(f"{fifth + 1:>5}  {max(t[1] for t in part):>22.1f}  {max(t[0] for t in part):>16.0f}  "
                         f"{sum(t[1] for t in part) / 1e3:>11.2f}")
    return lines


class _Camera:
    """Screenshots of the window (with --shots): halfway through the answer, at its end, scrolled to its start."""

    def __init__(self, window, folder: Path | None):
        self.window, self.folder, self.taken = window, folder, []

    def shoot(self, name: str) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.window.grab().save(str(self.folder / f"{name}.png"))
        self.taken.append(self.folder / f"{name}.png")

    def halfway(self, generated: int, num_tokens: int) -> None:
        if self.folder and not self.taken and generated >= num_tokens // 2:
            self.shoot("stream-half")

    def end_and_start(self) -> None:
        from PySide6.QtCore import QEventLoop, QTimer
        loop = QEventLoop()
        QTimer.singleShot(500, loop.quit)           # let the last layout and the scroll to the end finish
        loop.exec()
        self.shoot("stream-end")
        self.window.chat_view.verticalScrollBar().setValue(0)
        self.window.chat_view.widget().layout().activate()
        self.shoot("stream-start")
        print("wrote", *self.taken)
