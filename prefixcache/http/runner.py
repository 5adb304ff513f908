"""The uvicorn server that runs every app (server, router, gateway): header-read timeout,
access log and draining shutdown.

* :func:`header_timeout_protocol`: uvicorn's h11 protocol with a deadline on reading a
  request's headers. uvicorn times out idle keep-alive connections only; a connection
  that sends part of a header and then nothing would stay open forever (slowloris).
  Here a connection whose request headers are not complete ``timeout_s`` after its
  first byte (or after it was opened) is closed. Header size is bounded by h11's
  ``h11_max_incomplete_event_size``.
* :class:`DrainingServer`: on SIGTERM / SIGINT, starts the app's
  :class:`~prefixcache.http.drain.Drain` before uvicorn stops accepting connections
  and waits for the running ones.
"""
from __future__ import annotations

import asyncio
import logging
from types import FrameType
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from prefixcache.http.drain import Drain
from prefixcache.progress import since_start

log = logging.getLogger(__name__)

DEFAULT_HEADER_TIMEOUT_S = 10.0


class _HeaderTimeoutH11(H11Protocol):
    header_timeout_s = DEFAULT_HEADER_TIMEOUT_S
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._watch_headers()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_header_timer()
        super().connection_lost(exc)

    def _watch_headers(self) -> None:
        """Armed while the client owes us request headers; disarmed once they are in."""
        if self.conn.their_state is not h11.IDLE or self.transport.is_closing():
            self._stop_header_timer()
        elif self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s,
                                                      self._header_timeout)

    def _stop_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timeout(self) -> None:
        self._header_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            log.debug("closing a connection whose request headers did not arrive in %.1f s",
                      self.header_timeout_s)
            self.transport.close()


def header_timeout_protocol(timeout_s: float = DEFAULT_HEADER_TIMEOUT_S) -> type[H11Protocol]:
    """uvicorn's h11 protocol class (``uvicorn.Config(http=...)``) that closes a
    connection whose request headers take longer than ``timeout_s`` seconds.

    Raises:
        ValueError: ``timeout_s`` is not positive.
    """
    if not timeout_s > 0:
        raise ValueError(f"header timeout must be > 0 s, got {timeout_s}")
    return type("HeaderTimeoutH11", (_HeaderTimeoutH11,), {"header_timeout_s": timeout_s})


class DrainingServer(uvicorn.Server):
    """``uvicorn.Server`` whose exit signals start ``drain`` first.

    Give its config ``timeout_graceful_shutdown`` a few seconds more than the drain's
    grace period, so the drain (not uvicorn's task cancellation) ends the requests.
    """

    def __init__(self, config: uvicorn.Config, drain: Drain):
        super().__init__(config)
        self.drain = drain

    async def startup(self, sockets: list | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            where = ", ".join(f"http://{h}:{p}" if ":" not in h else f"http://[{h}]:{p}"
                              for h, p in self._bound())
            log.info("start-up: listening on %s, %.2f s after start", where, since_start())

    def _bound(self) -> list[tuple[str, int]]:
        out = []
        for server in getattr(self, "servers", []):
            for sock in server.sockets:
                host, port = sock.getsockname()[:2]
                out.append((host, port))
        return out

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.should_exit:
            self.drain.begin_threadsafe()
        super().handle_exit(sig, frame)


def make_server(app: Any, *, host: str, port: int, drain: Drain,
                header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S, log_level: str = "info",
                access_log: bool = True) -> DrainingServer:
    """The :class:`DrainingServer` for ``app`` (``port`` 0: any free port, read it from
    ``server.servers[0].sockets`` once started). Call ``.run()`` to serve (blocks), or
    ``.handle_exit(signal.SIGTERM, None)`` from another thread to drain and stop.

    Raises:
        ValueError: ``header_timeout_s`` is not positive.
    """
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                            access_log=access_log, http=header_timeout_protocol(header_timeout_s),
                            timeout_graceful_shutdown=int(drain.grace_s) + 5)
    return DrainingServer(config, drain)


def serve(app: Any, *, host: str, port: int, drain: Drain,
          header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S, log_level: str = "info",
          access_log: bool = True) -> None:
    """Run ``app`` until SIGTERM / SIGINT, then drain (blocks)."""
    make_server(app, host=host, port=port, drain=drain, header_timeout_s=header_timeout_s,
                log_level=log_level, access_log=access_log).run()
