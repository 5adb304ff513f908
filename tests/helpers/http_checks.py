"""The HTTP foundation's limits, checked the same way on every app (server, router,
gateway): real sockets, a real client (httpx), the app served by the foundation's
:class:`~prefixcache.http.runner.DrainingServer` on a thread of the test process."""
from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import uvicorn
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse

from prefixcache.http.runner import DrainingServer, make_server
from tests.helpers.wait import DEADLINE_S, wait_until
from tests.server.live import free_port

HEADER_TIMEOUT_S = 0.5


@dataclass
class Served:
    """An app served on a thread: ``base`` URL, its ``server`` and ``thread``."""

    base: str
    port: int
    server: DrainingServer
    thread: threading.Thread


@contextlib.contextmanager
def served(app, *, header_timeout_s: float = HEADER_TIMEOUT_S) -> Iterator[Served]:
    """``app`` (built on :func:`prefixcache.http.app.create_app`) on a free port, served
    like ``prefixcache serve|router|gateway`` serve it; stopped on exit."""
    port = free_port()
    server = make_server(app, host="127.0.0.1", port=port, drain=app.state.drain,
                         header_timeout_s=header_timeout_s, log_level="warning",
                         access_log=False)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started or not thread.is_alive(), "the app to start")
    assert server.started
    try:
        yield Served(f"http://127.0.0.1:{port}", port, server, thread)
    finally:
        server.should_exit = True
        thread.join(DEADLINE_S)


@dataclass
class GatedUpstream:
    """An OpenAI-compatible upstream (replica or provider) whose answers wait for
    :attr:`gate`: ``seen`` counts the requests it received."""

    gate: threading.Event = field(default_factory=threading.Event)
    seen: int = 0

    def app(self) -> FastAPI:
        app = FastAPI()

        async def answer(request: Request) -> JSONResponse:
            body = await request.json()
            self.seen += 1
            await asyncio.to_thread(self.gate.wait, DEADLINE_S)
            chat = "messages" in body
            choice = ({"index": 0, "message": {"role": "assistant", "content": "done"},
                       "finish_reason": "stop", "logprobs": None} if chat else
                      {"index": 0, "text": "done", "finish_reason": "stop", "logprobs": None})
            return JSONResponse({
                "id": "x-1", "object": "chat.completion" if chat else "text_completion",
                "created": 1, "model": body.get("model"), "choices": [choice],
                "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6,
                          "prompt_tokens_details": {"cached_tokens": 0}}})

        app.add_api_route("/v1/chat/completions", answer, methods=["POST"])
        app.add_api_route("/v1/completions", answer, methods=["POST"])
        app.add_api_route("/health", lambda: JSONResponse({"status": "ok"}), methods=["GET"])
        return app


@contextlib.contextmanager
def upstream_served(upstream: GatedUpstream) -> Iterator[str]:
    """``upstream`` on plain uvicorn on a thread; yields its base URL. Its gate opens
    on exit (nothing stays blocked)."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(upstream.app(), host="127.0.0.1", port=port,
                                           log_level="critical", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, "the upstream to start")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        upstream.gate.set()
        server.should_exit = True
        thread.join(DEADLINE_S)


def check_oversized_body(base: str, path: str, limit: int) -> None:
    """A body over ``limit`` bytes: 413 with an error object (declared length, then a
    chunked body that grows past it)."""
    big = b'{"model": "m", "prompt": "' + b"x" * limit + b'"}'
    r = httpx.post(base + path, content=big, headers={"content-type": "application/json"},
                   timeout=DEADLINE_S)
    assert r.status_code == 413, r.text
    err = r.json()["error"]
    assert err["code"] == "request_too_large" and err["type"] == "invalid_request_error"
    assert f"exceeds the limit of {limit} bytes" in err["message"]

    def chunks():
        yield b'{"model": "m", "prompt": "'
        for _ in range(limit // 4096 + 2):
            yield b"x" * 4096
        yield b'"}'

    r = httpx.post(base + path, content=chunks(), timeout=DEADLINE_S,
                   headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


def check_malformed_json(base: str, path: str) -> None:
    r = httpx.post(base + path, content=b'{"model": "m", "prompt": ',
                   headers={"content-type": "application/json"}, timeout=DEADLINE_S)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] is None
    assert err["message"].startswith("the request body is not valid JSON")


def check_slow_headers_are_closed(port: int) -> None:
    """A client that sends half a request line and then nothing is disconnected by the
    server (header-read timeout) instead of holding the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        assert sock.recv(1024) == b""  # closed by the server, no answer


def check_unknown_route(base: str) -> None:
    r = httpx.get(base + "/no/such/route", timeout=DEADLINE_S)
    assert r.status_code == 404
    assert r.json()["error"]["message"] == "no route GET /no/such/route"


def check_health_and_metrics(base: str, metric: str) -> None:
    r = httpx.get(base + "/health", timeout=DEADLINE_S)
    assert r.status_code == 200 and r.json()["status"] == "ok"
    r = httpx.get(base + "/metrics", timeout=DEADLINE_S)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert f"# TYPE {metric} " in r.text, r.text[:2000]


def check_sigterm_drains(s: Served, upstream: GatedUpstream, path: str, body: dict) -> None:
    """SIGTERM while a request is in flight: the app stops accepting, the request
    finishes with its answer, then the server exits."""
    result: dict = {}

    def send() -> None:
        result["r"] = httpx.post(s.base + path, json=body, timeout=DEADLINE_S)

    client = threading.Thread(target=send)
    client.start()
    wait_until(lambda: upstream.seen == 1, "the request to reach the upstream")
    drain = s.server.drain
    assert drain.in_flight == 1
    s.server.handle_exit(signal.SIGTERM, None)  # what uvicorn's signal handler calls
    wait_until(lambda: drain.draining, "the drain to begin")
    wait_until(lambda: not accepts(s.port), "the listening socket to close")
    assert s.thread.is_alive()  # still finishing the request
    upstream.gate.set()
    client.join(DEADLINE_S)
    r = result["r"]
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice.get("text") == "done" or choice["message"]["content"] == "done"
    s.thread.join(DEADLINE_S)
    assert not s.thread.is_alive() and drain.in_flight == 0


def accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S):
            return True
    except OSError:
        return False
