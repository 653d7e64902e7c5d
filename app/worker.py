"""The engine thread: one long-lived WorkThread (app.work) runs every engine call, one after another.

EngineWorker holds the engine and does the work on that thread; EngineHost, on the GUI thread,
submits each call as a Work and turns its outcome into the signals the window and the chat
controller use (keyed by request or job id). Cancel and telemetry() are called directly from the
GUI thread (the engine makes them thread-safe), since the engine thread is busy while a generation runs.
"""
from __future__ import annotations

import logging
import threading
import time
import weakref
from pathlib import Path
from typing import NamedTuple

from PySide6.QtCore import QCoreApplication, QEvent, QObject, Signal

from .work import Work, WorkStopped, WorkThread

log = logging.getLogger("sluice.app")

CHUNK_INTERVAL_S = 1 / 40   # tokens are coalesced into chunks at most this often (the GUI repaints per chunk)
ENGINE_FAILED = "The engine failed"          # opens the sentence shown for an unexpected engine error


class Chunk(NamedTuple):
    """Reported by a generation: new text and the number of tokens so far."""
    text: str
    num_tokens: int


class ContextFit(NamedTuple):
    """Reported by a generation before it starts: what the context could not hold (app.context_policy)."""
    dropped: list           # message indexes left out
    prompt_tokens: int
    max_context: int
    max_new_tokens: int


class _TokenStream:
    """Coalesces a generation's text into Chunks (at most every CHUNK_INTERVAL_S; the first token at once)
    and times its tokens."""

    def __init__(self, report):
        self._report = report
        self.pending = ""
        self.num_tokens = 0
        self._last_report_s = 0.0
        self._start_s = time.perf_counter()
        self._first_s = self._last_s = None
        self.finish_reason: str | None = None

    def add(self, event) -> None:
        now = time.perf_counter()
        if event.token_id is not None:
            self.num_tokens += 1
            self._last_s = now
            self._first_s = self._first_s or now
        self.pending += event.text
        if event.finished:
            self.finish_reason = event.finish_reason
        if self.pending and (now - self._last_report_s >= CHUNK_INTERVAL_S or event.finished or self.num_tokens == 1):
            self.flush()
            self._last_report_s = now

    def flush(self) -> None:
        if self.pending:
            self._report(Chunk(self.pending, self.num_tokens))
            self.pending = ""

    def stats(self) -> dict:
        """num_tokens, tok_s (decode rate, TTFT excluded), ttft_s, finish_reason (None while unknown)."""
        tok_s = None
        if self.num_tokens > 1 and self._last_s > self._first_s:
            tok_s = (self.num_tokens - 1) / (self._last_s - self._first_s)
        ttft_s = self._first_s - self._start_s if self._first_s is not None else None
        return {"num_tokens": self.num_tokens, "tok_s": tok_s, "ttft_s": ttft_s, "finish_reason": self.finish_reason}


class EngineWorker:
    """The engine and the calls that run on the engine thread (each the body of one Work)."""

    def __init__(self, load_fn=None):
        self._load_fn = load_fn                    # engine.load, injectable for tests of the thread itself
        self.engine = None
        self.native_thread_id: int | None = None
        self.pinned_cores: list[int] | None = None
        self.compute_threads: int | None = None    # torch's threads for the engine thread's ops (set when pinned)
        self.queue = None                          # the Local server's GenerationQueue while it serves this engine
        self._running_stop: threading.Event | None = None   # the running generation's stop_event
        self._stop_running = None                  # stops it: engine.cancel or its queue job's cancel

    # engine thread ----------------------------------------------------------------------------
    def start(self, _report, _stop) -> None:
        """Pins the engine thread to the performance cores (panels show them and the thread's core)."""
        self.native_thread_id = threading.get_native_id()
        try:
            from engine.setup import pin_current_thread_to_performance_cores
            self.pinned_cores = pin_current_thread_to_performance_cores()
            import torch
            self.compute_threads = torch.get_num_threads()       # as this thread sees it (its parallel ops)
        except Exception:   # pinning is an optimisation: never fail the app for it
            log.exception("pinning the engine thread failed")

    def load_model(self, model_dir: str, options: dict, report, stop: threading.Event) -> dict:
        """Loads the model (closing the one before); returns engine.info. A remote model is connected first,
        so an endpoint that cannot be reached leaves the loaded engine as it was."""
        def progress(done: int, total: int, message: str = "") -> None:
            if stop.is_set():
                raise WorkStopped()
            report((int(done), int(total), str(message)))

        load = self._load_fn
        is_remote = load is None and model_dir.startswith("remote:")      # an OpenAI-compatible endpoint
        if is_remote:
            from .remote import RemoteEngine
            engine = RemoteEngine.connect(model_dir, progress=progress, **options)
            self._close_engine()
            self.engine = engine
        else:
            self._close_engine()
            if load is None:
                from engine import load
            self.engine = load(model_dir, progress=progress, **options)
        if stop.is_set():
            self._close_engine()
            raise WorkStopped()
        return dict(self.engine.info)

    def generate(self, messages: list, params: dict, report, stop: threading.Event) -> dict:
        """Streams an answer as Chunks (a ContextFit first); returns its stats: num_tokens, tok_s, ttft_s,
        finish_reason. A stop asked before it starts ends it at once ("cancelled")."""
        from engine import SluiceError
        from engine.setup import response_format_for_setting
        if self.engine is None:
            raise SluiceError("No model is loaded; pick one in the model list first.")
        if stop.is_set():
            return {"num_tokens": 0, "tok_s": None, "ttft_s": None, "finish_reason": "cancelled"}
        messages, params, asked_max_new_tokens = self._fit_to_context(messages, params, report)
        stream = _TokenStream(report)
        self._running_stop = stop
        try:
            response_format = response_format_for_setting(params.pop("structured_output", ""))   # the chat's setting
            events = self._start_generation(messages, params, response_format)
            for event in events:
                stream.add(event)
                if not event.finished and stop.is_set():
                    self._stop_running()     # Stop came before the engine had started listening for it
                if event.finished:
                    break
        finally:
            stream.flush()                   # keep what was generated, a failure included
            self._running_stop = self._stop_running = None
        return stats_with_reason(stream.stats(), params.get("max_new_tokens", 0), asked_max_new_tokens)

    def _start_generation(self, messages: list, params: dict, response_format: dict | None):
        """The events of a new generation; shares the engine with the Local server's requests, in turn.
        A local engine follows the response format through its grammar; a remote endpoint is sent it."""
        from engine import GenerationParams
        from engine.setup import grammar_for
        if self.engine.info.get("device") == "remote":
            self._stop_running = self.engine.cancel
            return self.engine.generate(messages, GenerationParams(**params), response_format)
        params = GenerationParams(**params, grammar=grammar_for(response_format))
        if self.queue is not None:
            job = self.queue.submit(messages, params, origin="app", bounded=False)
            self._stop_running = job.cancel
            return iter(job)
        self._stop_running = self.engine.cancel
        return self.engine.generate(messages, params)

    def _fit_to_context(self, messages: list, params: dict, report):
        """Leave out turns the context cannot hold (app.context_policy) and lower max_new_tokens to the room
        left; reports what was left out (ContextFit). Returns (messages, params, the asked max_new_tokens)."""
        from .context_policy import DEFAULT_POLICY, fit_chat
        params = dict(params)
        policy = params.pop("context_overflow", None)
        asked = params.get("max_new_tokens", 0)
        max_context = self.engine.info.get("max_context")
        encode = getattr(self.engine, "encode", None)
        if not max_context or encode is None or not isinstance(messages, list):
            return messages, params, asked
        fitted = fit_chat(messages, lambda chat: len(encode(chat)[0]), max_context, asked, policy or DEFAULT_POLICY)
        report(ContextFit(fitted.dropped, fitted.num_prompt_tokens, max_context, fitted.max_new_tokens))
        return fitted.messages, {**params, "max_new_tokens": fitted.max_new_tokens}, asked

    def build_demo(self, dst: str, report, stop: threading.Event) -> str:
        """Builds the demo model (random weights) at dst; returns its path."""
        from engine.setup import build_demo_model

        def progress(done, total, message: str = "") -> None:
            if stop.is_set():
                raise WorkStopped()
            report((int(done), int(total), str(message)))

        result = build_demo_model(dst, progress=progress)
        if stop.is_set():
            raise WorkStopped()
        return str(result)

    def estimate_speed(self, hit_rates: list) -> dict | None:
        """The roofline prediction (engine.plan.estimate) for the loaded model with its real budgets and the hit
        rates measured so far, to show beside the measured speed. Probes the disk once per run (~1 s)."""
        engine = self.engine
        if engine is None or "path" not in engine.info or engine.info.get("device") == "remote":
            return None
        try:
            from engine.setup import estimate_model_dir
            from .setup.common import machine_for
            info = engine.info
            device = "cuda" if str(info.get("device", "cpu")).startswith("cuda") else "cpu"
            machine, _hardware = machine_for(Path(info["path"]).parent, device)
            prediction = estimate_model_dir(info["path"], machine, vram_budget=info.get("vram_budget_bytes"),
                                            ram_cache=info.get("ram_cache_bytes"), hit_rates=tuple(hit_rates),
                                            dense_quant=None if info.get("dense_quant", "none") == "none" else info["dense_quant"])
        except Exception:      # a prediction is a nicety: never an error dialog for it
            log.exception("speed estimate failed")
            return None
        return {"tok_s": prediction.tok_s, "verdict": prediction.verdict, "reason": prediction.reason}

    def _close_engine(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.close()

    # any thread --------------------------------------------------------------------------------
    def interrupt(self, stop: threading.Event) -> None:
        """Stops the generation whose stop_event this is, if it is the one running."""
        stop_running = self._stop_running
        if stop_running is not None and self._running_stop is stop:
            stop_running()

    def telemetry(self) -> dict | None:
        engine = self.engine
        return engine.telemetry() if engine is not None else None


def stats_with_reason(stats: dict, max_new_tokens: int, asked_max_new_tokens: int) -> dict:
    """A generation without a finish reason ended at eos; one cut at a max_new_tokens lowered to fit the
    context ended because the answer filled the context, not at the asked limit."""
    reason = stats["finish_reason"] or "eos"
    if reason == "length" and max_new_tokens < asked_max_new_tokens:
        reason = "context_full"
    return {**stats, "finish_reason": reason}


LIVE_HOSTS: "weakref.WeakSet[EngineHost]" = weakref.WeakSet()   # tests check none is left running


class EngineHost(QObject):
    """GUI-thread handle on the engine thread. Create once; call shutdown() before the app quits."""
    load_progress = Signal(int, int, str)          # done, total, message
    loaded = Signal(dict)                          # engine.info
    load_failed = Signal(str)                      # one sentence ("" when cancelled)
    chunk = Signal(int, str, int)                  # request id, new text, tokens so far
    finished = Signal(int, dict)                   # request id, stats: num_tokens, tok_s, ttft_s, finish_reason
    failed = Signal(int, str)                      # request id, one sentence
    context_fitted = Signal(int, dict)             # request id, {dropped (message indexes), prompt_tokens, max_context, max_new_tokens}
    job_progress = Signal(int, int, int, str)      # job id, done, total, message
    job_finished = Signal(int, str)                # job id, result path
    job_failed = Signal(int, str)                  # job id, one sentence ("" when cancelled)
    estimated = Signal(dict)                       # {"tok_s", "verdict", "reason"}: the roofline prediction

    def __init__(self, parent: QObject | None = None, load_fn=None):
        super().__init__(parent)
        self.worker = EngineWorker(load_fn)
        self._engine_thread = WorkThread("sluice-engine", self)
        self.thread = self._engine_thread.thread
        self._next_id = 0
        self._load: Work | None = None
        self._requests: dict[int, Work] = {}       # generations and jobs not finished yet, by id
        self._submit(Work(self.worker.start, "pinning the engine thread"))
        LIVE_HOSTS.add(self)

    def _submit(self, work: Work, request_id: int | None = None) -> Work:
        if request_id is not None:
            self._requests[request_id] = work
            work.finished.connect(lambda: self._requests.pop(request_id, None))
        return self._engine_thread.submit(work)

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def load(self, model_dir: str, **options) -> None:
        work = Work(lambda report, stop: self.worker.load_model(str(model_dir), options, report, stop),
                    f"loading {model_dir}", ENGINE_FAILED)
        self._load = self._submit(work.on(progress=lambda progress: self.load_progress.emit(*progress),
                                          result=lambda info: self.loaded.emit(info),
                                          failed=lambda message: self.load_failed.emit(message),
                                          stopped=lambda: self.load_failed.emit("")))

    def generate(self, messages: list[dict], params: dict) -> int:
        request_id = self._new_id()
        work = Work(lambda report, stop: self.worker.generate(messages, dict(params), report, stop),
                    "generation", ENGINE_FAILED)
        self._submit(work.on(progress=lambda item: self._on_generation_progress(request_id, item),
                             result=lambda stats: self.finished.emit(request_id, stats),
                             failed=lambda message: self.failed.emit(request_id, message)), request_id)
        return request_id

    def _on_generation_progress(self, request_id: int, item: Chunk | ContextFit) -> None:
        if isinstance(item, ContextFit):
            self.context_fitted.emit(request_id, item._asdict())
        else:
            self.chunk.emit(request_id, item.text, item.num_tokens)

    def run_job(self, kind: str, **args) -> int:
        """Long jobs on the engine thread: "demo" (build the demo model at args["dst"])."""
        if kind != "demo":
            raise ValueError(f"unknown job {kind}")
        job_id = self._new_id()
        work = Work(lambda report, stop: self.worker.build_demo(args["dst"], report, stop), "demo job", ENGINE_FAILED)
        self._submit(work.on(progress=lambda progress: self.job_progress.emit(job_id, *progress),
                             result=lambda path: self.job_finished.emit(job_id, path),
                             failed=lambda message: self.job_failed.emit(job_id, message),
                             stopped=lambda: self.job_failed.emit(job_id, "")), job_id)
        return job_id

    def estimate_speed(self, slot_hit_rate: float, ram_hit_rate: float) -> None:
        work = Work(lambda _report, _stop: self.worker.estimate_speed([slot_hit_rate, ram_hit_rate]), "speed estimate")
        self._submit(work.on(result=self._on_estimated))

    def _on_estimated(self, prediction: dict | None) -> None:
        if prediction is not None:
            self.estimated.emit(prediction)

    def cancel_generation(self, request_id: int) -> None:
        work = self._requests.get(request_id)
        if work is not None:
            work.stop()
            self.worker.interrupt(work.stop_event)

    def cancel_load(self) -> None:
        if self._load is not None:
            self._load.stop()

    def cancel_job(self, job_id: int) -> None:
        work = self._requests.get(job_id)
        if work is not None:
            work.stop()

    def telemetry(self) -> dict | None:
        return self.worker.telemetry()

    @property
    def native_thread_id(self) -> int | None:
        return self.worker.native_thread_id

    def shutdown(self, timeout_ms: int = 10000) -> bool:
        """Stop whatever runs, close the engine on its thread, and join the thread. True if it ended."""
        if not self.thread.isRunning():
            return True
        self.cancel_load()
        for request_id in list(self._requests):
            self.cancel_generation(request_id)       # stops a job as well
        self._submit(Work(lambda _report, _stop: self.worker._close_engine(), "closing the engine"))
        ended = self._engine_thread.quit_and_wait(timeout_ms)   # after the queued close
        # The engine thread's last chunks and "finished" are still queued for this thread: deliver them
        # now, so that an answer is saved complete before the window closes the database.
        QCoreApplication.sendPostedEvents(None, QEvent.Type.MetaCall)
        return ended
