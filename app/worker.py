"""The engine thread: one long-lived QThread owns the engine through an EngineWorker moved onto it.

GUI -> engine: EngineHost's request signals, queued into the worker's slots (run in order).
Engine -> GUI: worker signals, re-emitted by EngineHost on the GUI thread.
Cancel and telemetry() are called directly from the GUI thread (the engine makes them thread-safe),
since the worker's event loop is busy while a generation runs.
"""
from __future__ import annotations

import logging
import threading
import time
import weakref
from pathlib import Path

from PySide6.QtCore import QObject, QThread, Signal, Slot

log = logging.getLogger("sluice.app")

CHUNK_INTERVAL_S = 1 / 40   # tokens are coalesced into chunks at most this often (the GUI repaints per chunk)


class LoadCancelled(Exception):
    pass


def user_message(exc: BaseException) -> str:
    """One sentence for a dialog: SluiceError texts as they are, anything else as an engine failure."""
    from engine.errors import user_sentence
    known = user_sentence(exc)          # SluiceError, a full/read-only disk naming the path, memory running out
    if known:
        return known
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"The engine failed ({detail}); the details are in the log file."


def _log_failure(exc: BaseException, message: str, *args) -> None:
    """User errors get one log line; anything else its traceback (the dialog points to the log)."""
    from engine import SluiceError
    if isinstance(exc, SluiceError):
        log.warning(message + ": %s", *args, exc)
    else:
        log.exception(message, *args)


class EngineWorker(QObject):
    started = Signal(object, int)                  # pinned cores (list) or None, native thread id
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

    def __init__(self, load_fn=None):
        super().__init__()
        self._load_fn = load_fn                    # engine.load, injectable for tests of the thread itself
        self.engine = None
        self.native_thread_id: int | None = None
        self.pinned_cores: list[int] | None = None
        self._cancel_load = threading.Event()
        self._cancelled_requests: set[int] = set()
        self._running_request: int | None = None
        self._stop_running = None                  # stops the running request: engine.cancel or its job's cancel
        self.queue = None                          # the Local server's GenerationQueue while it serves this engine
        self._job_cancels: dict[int, threading.Event] = {}

    # engine thread ----------------------------------------------------------------------------
    @Slot()
    def start(self) -> None:
        self.native_thread_id = threading.get_native_id()
        try:
            from engine.plan import hardware
            self.pinned_cores = hardware.pin_current_thread_to_performance_cores()
        except Exception:   # pinning is an optimisation: never fail the app for it
            log.exception("pinning the engine thread failed")
        self.started.emit(self.pinned_cores, self.native_thread_id)

    @Slot(str, dict)
    def load_model(self, model_dir: str, options: dict) -> None:
        self._cancel_load.clear()
        self._close_engine()

        def progress(done: int, total: int, message: str = "") -> None:
            if self._cancel_load.is_set():
                raise LoadCancelled()
            self.load_progress.emit(int(done), int(total), str(message))

        try:
            load = self._load_fn
            if load is None and model_dir.startswith("remote:"):     # a model on an OpenAI-compatible endpoint
                from .remote import RemoteEngine
                load = RemoteEngine.connect
            elif load is None:
                from engine import load
            self.engine = load(model_dir, progress=progress, **options)
        except LoadCancelled:
            self.load_failed.emit("")
            return
        except Exception as exc:
            _log_failure(exc, "loading %s failed", model_dir)
            self.load_failed.emit(user_message(exc))
            return
        if self._cancel_load.is_set():
            self._close_engine()
            self.load_failed.emit("")
            return
        self.loaded.emit(dict(self.engine.info))

    @Slot(int, list, dict)
    def generate(self, request_id: int, messages: list, params: dict) -> None:
        from engine import GenerationParams
        stats = {"num_tokens": 0, "tok_s": None, "ttft_s": None, "finish_reason": None}
        if self.engine is None:
            self.failed.emit(request_id, "No model is loaded; pick one in the model list first.")
            return
        if request_id in self._cancelled_requests:
            stats["finish_reason"] = "cancelled"
            self.finished.emit(request_id, stats)
            return
        self._running_request = request_id
        policy = params.pop("context_overflow", None)
        try:
            messages, params, asked_max_new_tokens = self._fit_to_context(request_id, messages, params, policy)
        except Exception as exc:
            self._running_request = None
            self._cancelled_requests.discard(request_id)
            _log_failure(exc, "fitting the chat to the context failed")
            self.failed.emit(request_id, user_message(exc))
            return
        t_start = time.perf_counter()
        t_first = t_last = None
        pending, last_emit = "", 0.0
        queue = self.queue
        try:
            if queue is not None:                # share the engine with the Local server's requests, in turn
                job = queue.submit(messages, GenerationParams(**params), origin="app", bounded=False)
                events, self._stop_running = iter(job), job.cancel
            else:
                events, self._stop_running = self.engine.generate(messages, GenerationParams(**params)), self.engine.cancel
            for event in events:
                now = time.perf_counter()
                if event.token_id is not None:
                    stats["num_tokens"] += 1
                    t_last = now
                    if t_first is None:
                        t_first = now
                        stats["ttft_s"] = now - t_start
                pending += event.text
                if event.finished:
                    stats["finish_reason"] = event.finish_reason
                elif request_id in self._cancelled_requests:
                    self._stop_running()     # Stop came before the engine had started listening for it
                if pending and (now - last_emit >= CHUNK_INTERVAL_S or event.finished or stats["num_tokens"] == 1):
                    self.chunk.emit(request_id, pending, stats["num_tokens"])
                    pending, last_emit = "", now
                if event.finished:
                    break
            if pending:
                self.chunk.emit(request_id, pending, stats["num_tokens"])
        except Exception as exc:
            _log_failure(exc, "generation failed")
            if pending:                                  # keep what was generated before the failure
                self.chunk.emit(request_id, pending, stats["num_tokens"])
            self.failed.emit(request_id, user_message(exc))
            return
        finally:
            self._running_request = None
            self._stop_running = None
            self._cancelled_requests.discard(request_id)
        if stats["num_tokens"] > 1 and t_last > t_first:
            stats["tok_s"] = (stats["num_tokens"] - 1) / (t_last - t_first)   # decode rate, TTFT excluded
        stats["finish_reason"] = stats["finish_reason"] or "eos"
        if stats["finish_reason"] == "length" and params.get("max_new_tokens", 0) < asked_max_new_tokens:
            stats["finish_reason"] = "context_full"      # the answer filled the context, not the asked limit
        self.finished.emit(request_id, stats)

    def _fit_to_context(self, request_id: int, messages: list, params: dict, policy: str | None):
        """Leave out turns the context cannot hold (app.context_policy) and lower max_new_tokens to the room
        left; reports what was left out (context_fitted). Returns (messages, params, the asked max_new_tokens)."""
        from .context_policy import DEFAULT_POLICY, fit_chat
        asked = params.get("max_new_tokens", 0)
        max_context = self.engine.info.get("max_context")
        encode = getattr(self.engine, "encode", None)
        if not max_context or encode is None or not isinstance(messages, list):
            return messages, params, asked
        fitted = fit_chat(messages, lambda chat: len(encode(chat)[0]), max_context, asked, policy or DEFAULT_POLICY)
        self.context_fitted.emit(request_id, {"dropped": fitted.dropped, "prompt_tokens": fitted.num_prompt_tokens,
                                              "max_context": max_context, "max_new_tokens": fitted.max_new_tokens})
        return fitted.messages, {**params, "max_new_tokens": fitted.max_new_tokens}, asked

    @Slot(int, str, dict)
    def run_job(self, job_id: int, kind: str, args: dict) -> None:
        """Long jobs on the engine thread: "demo" (build the demo model)."""
        cancel = self._job_cancels.setdefault(job_id, threading.Event())

        def progress(done, total, message: str = "") -> None:
            if cancel.is_set():
                raise LoadCancelled()
            self.job_progress.emit(job_id, int(done), int(total), str(message))

        try:
            if kind == "demo":
                from engine.tools.demo import build_demo_model
                result = build_demo_model(args["dst"], progress=progress)
            else:
                raise ValueError(f"unknown job {kind}")
            if cancel.is_set():
                self.job_failed.emit(job_id, "")
            else:
                self.job_finished.emit(job_id, str(result))
        except LoadCancelled:
            self.job_failed.emit(job_id, "")
        except Exception as exc:
            _log_failure(exc, "job %s failed", kind)
            self.job_failed.emit(job_id, "" if cancel.is_set() else user_message(exc))
        finally:
            self._job_cancels.pop(job_id, None)

    @Slot(list)
    def estimate_speed(self, hit_rates: list) -> None:
        """The roofline prediction (engine.plan.estimate) for the loaded model with its real budgets and the hit
        rates measured so far, to show beside the measured speed. Probes the disk once per run (~1 s)."""
        engine = self.engine
        if engine is None or "path" not in engine.info or engine.info.get("device") == "remote":
            return
        try:
            from engine.plan.estimate import estimate_model_dir
            from .setup.common import machine_for
            info = engine.info
            device = "cuda" if str(info.get("device", "cpu")).startswith("cuda") else "cpu"
            machine, _hardware = machine_for(Path(info["path"]).parent, device)
            prediction = estimate_model_dir(info["path"], machine, vram_budget=info.get("vram_budget_bytes"),
                                            ram_cache=info.get("ram_cache_bytes"), hit_rates=tuple(hit_rates))
        except Exception:      # a prediction is a nicety: never an error dialog for it
            log.exception("speed estimate failed")
            return
        self.estimated.emit({"tok_s": prediction.tok_s, "verdict": prediction.verdict, "reason": prediction.reason})

    @Slot()
    def shutdown(self) -> None:
        self._close_engine()

    def _close_engine(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.close()

    # any thread --------------------------------------------------------------------------------
    def cancel_generation(self, request_id: int) -> None:
        self._cancelled_requests.add(request_id)
        stop = self._stop_running
        if stop is not None and self._running_request == request_id:
            stop()

    def cancel_load(self) -> None:
        self._cancel_load.set()

    def cancel_job(self, job_id: int) -> None:
        self._job_cancels.setdefault(job_id, threading.Event()).set()

    def telemetry(self) -> dict | None:
        engine = self.engine
        return engine.telemetry() if engine is not None else None


LIVE_HOSTS: "weakref.WeakSet[EngineHost]" = weakref.WeakSet()   # tests check none is left running


class EngineHost(QObject):
    """GUI-thread handle on the engine thread. Create once; call shutdown() before the app quits."""
    started = Signal(object, int)
    load_progress = Signal(int, int, str)
    loaded = Signal(dict)
    load_failed = Signal(str)
    chunk = Signal(int, str, int)
    finished = Signal(int, dict)
    failed = Signal(int, str)
    context_fitted = Signal(int, dict)
    job_progress = Signal(int, int, int, str)
    job_finished = Signal(int, str)
    job_failed = Signal(int, str)
    estimated = Signal(dict)

    _request_load = Signal(str, dict)
    _request_generate = Signal(int, list, dict)
    _request_job = Signal(int, str, dict)
    _request_shutdown = Signal()
    _request_estimate = Signal(list)

    def __init__(self, parent: QObject | None = None, load_fn=None):
        super().__init__(parent)
        self.thread = QThread()
        self.thread.setObjectName("sluice-engine")
        self.worker = EngineWorker(load_fn)
        self.worker.moveToThread(self.thread)
        for name in ("started", "load_progress", "loaded", "load_failed", "chunk", "finished", "failed",
                     "context_fitted", "job_progress", "job_finished", "job_failed", "estimated"):
            getattr(self.worker, name).connect(getattr(self, name))     # signal -> signal, queued to GUI
        self._request_load.connect(self.worker.load_model)
        self._request_generate.connect(self.worker.generate)
        self._request_job.connect(self.worker.run_job)
        self._request_shutdown.connect(self.worker.shutdown)
        self._request_estimate.connect(self.worker.estimate_speed)
        self.thread.started.connect(self.worker.start)
        self.thread.finished.connect(self.worker.deleteLater)
        self._next_id = 0
        self._active_requests: set[int] = set()
        self._active_jobs: set[int] = set()
        self.finished.connect(lambda request_id, _stats: self._active_requests.discard(request_id))
        self.failed.connect(lambda request_id, _msg: self._active_requests.discard(request_id))
        self.job_finished.connect(lambda job_id, _path: self._active_jobs.discard(job_id))
        self.job_failed.connect(lambda job_id, _msg: self._active_jobs.discard(job_id))
        self.thread.start()
        LIVE_HOSTS.add(self)

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def load(self, model_dir: str, **options) -> None:
        self.worker._cancel_load.clear()
        self._request_load.emit(str(model_dir), options)

    def generate(self, messages: list[dict], params: dict) -> int:
        request_id = self._new_id()
        self._active_requests.add(request_id)
        self._request_generate.emit(request_id, messages, params)
        return request_id

    def run_job(self, kind: str, **args) -> int:
        job_id = self._new_id()
        self._active_jobs.add(job_id)
        self._request_job.emit(job_id, kind, args)
        return job_id

    def estimate_speed(self, slot_hit_rate: float, ram_hit_rate: float) -> None:
        self._request_estimate.emit([slot_hit_rate, ram_hit_rate])

    def cancel_generation(self, request_id: int) -> None:
        self.worker.cancel_generation(request_id)

    def cancel_load(self) -> None:
        self.worker.cancel_load()

    def cancel_job(self, job_id: int) -> None:
        self.worker.cancel_job(job_id)

    def telemetry(self) -> dict | None:
        return self.worker.telemetry()

    @property
    def native_thread_id(self) -> int | None:
        return self.worker.native_thread_id

    def shutdown(self, timeout_ms: int = 10000) -> bool:
        """Stop whatever runs, close the engine on its thread, and join the thread. True if it ended."""
        if not self.thread.isRunning():
            return True
        self.worker.cancel_load()
        for request_id in list(self._active_requests):
            self.worker.cancel_generation(request_id)
        for job_id in list(self._active_jobs):
            self.worker.cancel_job(job_id)
        self._request_shutdown.emit()
        self.thread.quit()                 # the event loop ends after the queued shutdown slot
        return self.thread.wait(timeout_ms)
