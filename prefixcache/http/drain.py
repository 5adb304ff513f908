"""Graceful shutdown: on SIGTERM an app drains instead of dropping requests.

:class:`Drain` is the state of one app. When the process is asked to stop
(:meth:`Drain.begin`, called from uvicorn's signal handling), uvicorn stops accepting
connections, new requests on open connections get 503 ``server_shutting_down`` and
``/health`` answers 503, while requests already accepted keep running for ``grace_s``
seconds. Apps whose requests run on an engine (the server) register their output
queues with :meth:`Drain.track`; when the grace period runs out, every
such request still running receives :class:`ShuttingDown` through its output queue: a
stream ends with an OpenAI error event and ``data: [DONE]``, a non-streaming request
gets a JSON 503 error object, and the engine requests are aborted (their pages return
to the pool). Only then does uvicorn close the connections.
"""
from __future__ import annotations

import asyncio
import logging

log = logging.getLogger(__name__)

DEFAULT_GRACE_S = 30.0


class ShuttingDown(Exception):
    """The server stopped before this request finished (its grace period ran out)."""


class Drain:
    """Shutdown state of one app and the output queues of its running requests.

    Args:
        grace_s: how long running requests may continue after :meth:`begin`, seconds.
    """

    def __init__(self, grace_s: float = DEFAULT_GRACE_S):
        if not grace_s >= 0:
            raise ValueError(f"grace_s must be >= 0, got {grace_s}")
        self.grace_s = grace_s
        self.draining = False
        self.expired = False
        self.in_flight = 0  # HTTP requests being answered (the foundation's middleware)
        self._queues: set[asyncio.Queue] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Remember the app's event loop (at start-up) for :meth:`begin_threadsafe`."""
        self._loop = loop

    def track(self, queue: asyncio.Queue) -> None:
        """A running request's output queue: it is told when the grace period ends."""
        self._queues.add(queue)
        if self.expired:
            queue.put_nowait((-1, ShuttingDown("the server is shutting down")))

    def untrack(self, queue: asyncio.Queue) -> None:
        self._queues.discard(queue)

    def begin(self) -> None:
        """Stop admitting and start the grace period (event-loop thread; idempotent)."""
        if self.draining:
            return
        self.draining = True
        log.warning("shutting down: %d requests in flight, %.1f s grace period",
                    max(self.in_flight, len(self._queues)), self.grace_s)
        asyncio.get_running_loop().call_later(self.grace_s, self._expire)

    def begin_threadsafe(self) -> None:
        """:meth:`begin` from a signal handler or another thread (no-op before
        :meth:`bind`)."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self.begin)

    def _expire(self) -> None:
        self.expired = True
        if self._queues:
            log.warning("grace period over: ending %d running requests", len(self._queues))
        for queue in list(self._queues):
            queue.put_nowait((-1, ShuttingDown(
                f"the server is shutting down and its {self.grace_s:g} s grace period "
                "is over; retry on another server")))
