"""One engine, one generation at a time: a bounded FIFO of requests and the thread that runs them.

    queue = GenerationQueue(engine, max_waiting=8)
    job = queue.submit(prompt, params)          # QueueFull when max_waiting requests already wait
    for event in job: ...                       # TokenEvents, as Engine.generate yields them
    job.cancel()                                # leaves the queue, or stops the engine within one token

The HTTP server and the app's own chats submit to the same queue, so they share the engine in
arrival order. A job can also deliver its events through a callback (`sink`), which is how the
asyncio server receives them without blocking its event loop.
"""
from __future__ import annotations

import itertools
import logging
import queue as stdqueue
import threading
import time
from collections import deque
from typing import Callable

from engine.params import GenerationParams, TokenEvent

log = logging.getLogger("sluice.serve")

END = object()                        # the last item a sink receives


class QueueFull(Exception):
    def __init__(self, retry_after_s: int):
        super().__init__(f"the generation queue is full; retry in {retry_after_s} s")
        self.retry_after_s = retry_after_s


class Job:
    """One request: waits, runs, ends. Items go to `sink`: TokenEvents, then an exception if it failed, then END."""
    _ids = itertools.count(1)

    def __init__(self, prompt, params: GenerationParams, sink: Callable | None, origin: str):
        self.id = next(self._ids)
        self.prompt, self.params, self.origin = prompt, params, origin
        self.state = "waiting"            # waiting | running | done
        self.cancelled = threading.Event()
        self.submitted_s = time.perf_counter()
        self.started_s: float | None = None
        self._items: stdqueue.Queue | None = None
        if sink is None:
            self._items = stdqueue.Queue()
            sink = self._items.put
        self.sink = sink
        self._queue: GenerationQueue | None = None

    def cancel(self) -> None:
        self.cancelled.set()
        if self._queue is not None:
            self._queue._on_cancel(self)

    def __iter__(self):
        """Blocking iteration (only without a sink): the events, then the generation's exception if any."""
        assert self._items is not None, "this job delivers to its sink"
        while True:
            item = self._items.get()
            if item is END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item


class GenerationQueue:
    def __init__(self, engine, max_waiting: int = 8, on_change: Callable[[], None] | None = None):
        self.engine = engine
        self.max_waiting = max_waiting
        self.on_change = on_change        # called (on any thread) when queued/active/served change
        self._cond = threading.Condition()
        self._waiting: deque[Job] = deque()
        self._active: Job | None = None
        self._served = 0
        self._recent_s: deque[float] = deque(maxlen=8)     # durations of recent generations (Retry-After)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="sluice-generate", daemon=True)
        self._thread.start()

    # any thread ------------------------------------------------------------------------------------
    def submit(self, prompt, params: GenerationParams, sink: Callable | None = None, origin: str = "",
               bounded: bool = True) -> Job:
        """Queue a generation; QueueFull if max_waiting already wait (unless not `bounded`: the app's own chats)."""
        job = Job(prompt, params, sink, origin)
        with self._cond:
            if self._closed:
                raise QueueFull(self._retry_after_locked())
            if bounded and len(self._waiting) >= self.max_waiting:
                raise QueueFull(self._retry_after_locked())
            job._queue = self
            self._waiting.append(job)
            self._cond.notify_all()
        self._changed()
        return job

    def counters(self) -> dict:
        """The `server` telemetry keys (DESIGN.md)."""
        with self._cond:
            return {"queued": len(self._waiting), "active": int(self._active is not None), "served": self._served}

    def close(self, timeout_s: float = 10.0) -> None:
        """Cancel everything and end the thread (the engine stays open: its owner closes it)."""
        with self._cond:
            self._closed = True
            waiting, self._waiting = list(self._waiting), deque()
            active = self._active
            self._cond.notify_all()
        for job in waiting:
            job.cancelled.set()
            self._finish_unstarted(job)
        if active is not None:
            active.cancel()
        self._thread.join(timeout_s)

    def _on_cancel(self, job: Job) -> None:
        with self._cond:
            unstarted = job in self._waiting
            if unstarted:
                self._waiting.remove(job)
            elif self._active is job:
                # under the lock: the next job cannot have started, so this cancel cannot reach it (a
                # generation clears a cancel that came before it began)
                self.engine.cancel()
        if unstarted:
            self._finish_unstarted(job)
            self._changed()

    def _retry_after_locked(self) -> int:
        per_job = sum(self._recent_s) / len(self._recent_s) if self._recent_s else 5.0
        return max(1, min(600, round(per_job * (len(self._waiting) + 1))))

    def _changed(self) -> None:
        if self.on_change is not None:
            try:
                self.on_change()
            except Exception:       # a display hook must never stop generation
                log.exception("queue change hook failed")

    @staticmethod
    def _finish_unstarted(job: Job) -> None:
        job.state = "done"
        job.sink(TokenEvent(None, "", True, "cancelled"))
        job.sink(END)

    # the generation thread -------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            from engine.plan import hardware
            hardware.pin_current_thread_to_performance_cores()
        except Exception:           # pinning is an optimisation
            log.debug("pinning the generation thread failed", exc_info=True)
        while True:
            with self._cond:
                while not self._waiting and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                job = self._active = self._waiting.popleft()
                job.state, job.started_s = "running", time.perf_counter()
            self._changed()
            started = time.perf_counter()
            try:
                self._generate(job)
            finally:
                with self._cond:
                    self._active = None
                    self._served += 1
                    self._recent_s.append(time.perf_counter() - started)
                job.state = "done"
                self._deliver(job, END)
                self._changed()

    def _generate(self, job: Job) -> None:
        try:
            for event in self.engine.generate(job.prompt, job.params):
                if job.cancelled.is_set() and not event.finished:
                    self.engine.cancel()     # the cancel came before the engine started listening for it
                self._deliver(job, event)
                if event.finished:
                    return
        except Exception as exc:             # delivered to the requester, who reports it
            if not getattr(exc, "__module__", "").startswith("engine"):
                log.exception("generation failed")
            self._deliver(job, exc)

    def _deliver(self, job: Job, item) -> None:
        """A requester that cannot take items any more (its event loop closed) gets its generation stopped,
        never this thread."""
        try:
            job.sink(item)
        except Exception:
            log.warning("a requester went away mid-generation", exc_info=True)
            if not job.cancelled.is_set():
                job.cancelled.set()
                self.engine.cancel()
