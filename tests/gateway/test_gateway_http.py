"""The gateway on the HTTP foundation: the server's limits (body size, malformed JSON,
header-read timeout, draining on SIGTERM, /health, /metrics), against a gateway served on
a thread and as a real ``prefixcache gateway`` process, with a gated upstream."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import httpx
import pytest

from prefixcache.gateway.app import create_app
from tests.gateway.conftest import make_gateway
from tests.helpers import http_checks as hc
from tests.helpers.wait import DEADLINE_S, wait_until
from tests.server.live import free_port

LIMIT = 4096
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
        "temperature": 0}


@pytest.fixture
def gateway():
    upstream = hc.GatedUpstream()
    with hc.upstream_served(upstream) as url:
        app = create_app(make_gateway([("up", url, "openai", ("m",))]), max_body_bytes=LIMIT,
                         shutdown_grace_s=30)
        with hc.served(app) as s:
            yield s, upstream


def test_gateway_limits_match_the_servers(gateway):
    s, upstream = gateway
    for path in ("/v1/chat/completions", "/v1/completions"):
        hc.check_oversized_body(s.base, path, LIMIT)
        hc.check_malformed_json(s.base, path)
    hc.check_unknown_route(s.base)
    hc.check_slow_headers_are_closed(s.port)
    hc.check_health_and_metrics(s.base, "prefixcache_gateway_requests_total")
    assert upstream.seen == 0


def test_gateway_messages_errors_are_anthropic_objects(gateway):
    s, _ = gateway
    r = httpx.post(s.base + "/v1/messages", content=b"x" * (LIMIT + 1), timeout=DEADLINE_S)
    assert r.status_code == 413
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "request_too_large"


def test_gateway_drains_an_in_flight_request_on_sigterm(gateway):
    s, upstream = gateway
    hc.check_sigterm_drains(s, upstream, "/v1/chat/completions", BODY)


def test_a_gateway_process_drains_on_sigterm_then_exits():
    upstream = hc.GatedUpstream()
    with hc.upstream_served(upstream) as url:
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "prefixcache", "gateway", "--upstream",
             f"up={url},provider=openai,models=m", "--port", str(port),
             "--header-timeout-s", "0.5"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=os.environ)
        base = f"http://127.0.0.1:{port}"
        try:
            wait_until(lambda: _healthy(base) or proc.poll() is not None, "the gateway")
            assert proc.poll() is None
            hc.check_slow_headers_are_closed(port)
            result: dict = {}
            client = threading.Thread(target=lambda: result.update(
                r=httpx.post(base + "/v1/chat/completions", json=BODY, timeout=DEADLINE_S)))
            client.start()
            wait_until(lambda: upstream.seen == 1, "the request to reach the upstream")
            proc.send_signal(signal.SIGTERM)
            wait_until(lambda: not hc.accepts(port), "the gateway to stop accepting")
            assert proc.poll() is None  # the request is still running
            upstream.gate.set()
            client.join(DEADLINE_S)
            assert result["r"].status_code == 200
            assert result["r"].json()["choices"][0]["message"]["content"] == "done"
            # uvicorn re-raises the signal it caught once it has drained
            assert proc.wait(DEADLINE_S) in (0, -signal.SIGTERM)
            out = proc.stdout.read() if proc.stdout else ""
            assert "shutting down: 1 requests in flight, 30.0 s grace period" in out
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _healthy(base: str) -> bool:
    try:
        return httpx.get(base + "/health", timeout=DEADLINE_S).status_code == 200
    except httpx.HTTPError:
        return False


def test_the_gateway_requires_model(gateway):
    """Several upstreams and providers sit behind a gateway: ``model`` picks one, so it
    is required (400 naming it), and one no upstream serves is 404."""
    s, upstream = gateway
    body = {k: v for k, v in BODY.items() if k != "model"}
    r = httpx.post(s.base + "/v1/chat/completions", json=body, timeout=DEADLINE_S)
    assert r.status_code == 400
    assert r.json()["error"] == {"message": "model is required", "type":
                                 "invalid_request_error", "param": "model", "code": None}
    r = httpx.post(s.base + "/v1/chat/completions", json={**BODY, "model": "other"},
                   timeout=DEADLINE_S)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert upstream.seen == 0
