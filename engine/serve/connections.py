"""The server's connections: bounded in number, and each must send its request headers in time; the noise a
flood of bad connections makes in the log is one line per kind of fault.

uvicorn waits forever for the headers of a connection that sends none (it only times out idle keep-alive
connections), so a few hundred half-open connections would hold every file descriptor.
"""
from __future__ import annotations

import logging
import time

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

MAX_CONNECTIONS = 256
HEADER_TIMEOUT_S = 10.0          # from connect (or the end of the previous request) to a complete request head
LOG_REPEAT_S = 60.0              # a fault of a kind already logged is logged again at most this often
NOISY_LOGGERS = ("asyncio", "uvicorn.error")


class GuardedH11Protocol(H11Protocol):
    """h11 with a header deadline and a connection cap: over the cap, the connection that has waited longest
    without sending a request is closed (a flood of idle connections cannot lock a real client out), or the
    new one when every connection is busy with a request."""

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._header_timer = None
        self.connected_s = time.monotonic()
        if len(self.connections) > MAX_CONNECTIONS:
            idle = [c for c in self.connections if isinstance(c, GuardedH11Protocol) and c is not self and c.is_idle]
            victim = min(idle, key=lambda c: c.connected_s) if idle else self
            victim.transport.close()
            if victim is self:
                return
        self._arm_header_timer()

    @property
    def is_idle(self) -> bool:
        """No request is being read or answered on this connection."""
        return self.conn.their_state is h11.IDLE and (self.cycle is None or self.cycle.response_complete)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE:       # between requests, or a request head not yet complete
            self._arm_header_timer()

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state is not h11.IDLE and self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def connection_lost(self, exc) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        super().connection_lost(exc)

    def _arm_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(HEADER_TIMEOUT_S, self._on_header_timeout)

    def _on_header_timeout(self) -> None:
        self._header_timer = None
        if self.is_idle and not self.transport.is_closing():
            self.transport.close()


class OncePerKind(logging.Filter):
    """Passes the first record of each kind (logger and message template) and then one per LOG_REPEAT_S with
    the count left out; a traceback shrinks to its last line."""

    def __init__(self):
        super().__init__()
        self._seen: dict[tuple[str, str], list] = {}     # kind -> [last logged at, records left out since]

    def filter(self, record: logging.LogRecord) -> bool:
        kind, now = (record.name, str(record.msg)), time.monotonic()
        seen = self._seen.get(kind)
        if seen is not None and now - seen[0] < LOG_REPEAT_S:
            seen[1] += 1
            return False
        left_out = seen[1] if seen else 0
        self._seen[kind] = [now, 0]
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            detail = f" ({type(exc).__name__}: {exc})".replace("%", "%%")
            record.msg, record.exc_info, record.exc_text = f"{record.msg}{detail}", None, None
        if left_out:
            record.msg = f"{record.msg} [{left_out} more like this in the last {LOG_REPEAT_S:.0f} s]"
        return True


_filter = OncePerKind()


def quiet_connection_noise() -> None:
    """Install the filter on the loggers a connection flood writes to (once per process)."""
    for name in NOISY_LOGGERS:
        logger = logging.getLogger(name)
        if _filter not in logger.filters:
            logger.addFilter(_filter)
