"""SIGTERM drains a real ``prefixcache serve`` process: running requests go on for the
grace period; what is still running then ends with an OpenAI error (an SSE error event
and ``[DONE]`` for a stream, a JSON 503 otherwise), never a dropped connection."""
from __future__ import annotations

import json
import os
import signal
import threading
import time

import httpx

from tests.helpers.wait import wait_until
from tests.server.live import LiveServer, unique_prompt

GRACE_S = 8.0  # far longer than the short request needs, even on a loaded machine


def test_sigterm_drains_then_ends_what_is_left(tmp_path):
    srv = LiveServer(["--served-model-name", "tiny", "--shutdown-grace-s", str(GRACE_S)],
                     tmp_path / "server.log")
    results: dict = {}
    long = {"model": "tiny", "max_tokens": 3000, "ignore_eos": True}  # far past the grace

    got: list[tuple[float, str]] = []

    def stream() -> None:
        with httpx.stream("POST", srv.v1 + "/completions", timeout=120,
                          json={**long, "prompt": unique_prompt(), "stream": True}) as r:
            results["stream_status"] = r.status_code
            for line in r.iter_lines():
                if line:
                    got.append((time.monotonic(), line))
        results["stream"] = got

    def post(name: str, max_tokens: int) -> None:
        results[name] = httpx.post(srv.v1 + "/completions", timeout=120,
                                   json={**long, "prompt": unique_prompt(),
                                         "max_tokens": max_tokens})

    try:
        srv.wait_ready()
        threads = [threading.Thread(target=stream),
                   threading.Thread(target=post, args=("long", 3000)),
                   threading.Thread(target=post, args=("short", 24))]
        for t in threads:
            t.start()
        # the stream is producing, the long request runs beside it, and the short one
        # runs too (or, on a fast machine, is already done)
        def started() -> bool:
            running = srv.metrics()["requests_running"]
            return len(got) >= 3 and (running >= 3 or (running >= 2 and "short" in results))

        wait_until(started, "the three requests running")
        signalled = time.monotonic()
        os.killpg(srv.proc.pid, signal.SIGTERM)
        for t in threads:
            t.join(90)
        srv.proc.wait(30)
    finally:
        srv.stop()

    # finished within the grace period: a normal answer
    short = results["short"]
    assert short.status_code == 200, short.text
    assert short.json()["usage"]["completion_tokens"] == 24
    # outlived it, not streaming: a JSON 503
    r = results["long"]
    assert r.status_code == 503, r.text
    assert r.headers["content-type"].startswith("application/json")
    assert r.json()["error"]["code"] == "server_shutting_down"
    assert r.json()["error"]["type"] == "server_error"
    # outlived it, streaming: tokens kept coming after SIGTERM, then an error event, [DONE]
    assert results["stream_status"] == 200
    lines = results["stream"]
    assert lines[-1][1] == "data: [DONE]"
    last = json.loads(lines[-2][1][len("data: "):])
    assert last["error"]["code"] == "server_shutting_down"
    tokens_after = [t for t, line in lines[:-2] if t > signalled]
    assert len(tokens_after) > 0
    assert srv.proc.returncode is not None
