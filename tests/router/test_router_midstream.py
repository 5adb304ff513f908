"""A replica that fails once its answer has begun (killed mid-stream): the client gets a
clean end (an SSE error event, then ``[DONE]``; a JSON answer's 502), the replica is
marked down, no traceback is logged, and the router keeps serving on the others."""
from __future__ import annotations

import json
import logging

import httpx
import pytest

from tests.router.broken_upstream import BrokenUpstream
from tests.router.conftest import RouterThread
from tests.server.live import labelled, scrape, unique_prompt

ALICE = {"Authorization": "Bearer sk-alice"}


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def broken_router(replicas, keys_file):
    """A router over a replica that breaks its answers (0) and a real one (1)."""
    info = httpx.get(replicas[0].base + "/v1/cache/info", timeout=60,
                     headers={"Authorization": "Bearer sk-ops"}).json()
    upstream = BrokenUpstream(events=3, info=info)
    router = RouterThread(["--api-keys", str(keys_file), "--replica", upstream.base,
                           "--replica", replicas[0].base, "--health-interval-s", "600"])
    errors = _Records()
    logging.getLogger("uvicorn.error").addHandler(errors)
    try:
        yield router, upstream, errors
    finally:
        logging.getLogger("uvicorn.error").removeHandler(errors)
        router.stop()
        upstream.close()


def _metric(router, name: str, **labels) -> float:
    return labelled(scrape(router.base), name, **labels)


def _on_broken_replica(router, body: dict, stream: bool):
    """Send ``body`` until it lands on replica 0 (ties rotate: at most two tries); the
    answer that did, as ``(response, data lines or None)``."""
    for _ in range(2):
        with httpx.stream("POST", router.base + "/v1/completions", headers=ALICE,
                          json={**body, "prompt": unique_prompt(10)}, timeout=60) as resp:
            lines = [ln for ln in resp.iter_lines() if ln] if stream else None
            if not stream:
                resp.read()
        if resp.headers["x-prefixcache-replica"] == "0":
            return resp, lines
        assert resp.status_code == 200
    raise AssertionError("no request was routed to replica 0")


def test_a_stream_broken_mid_answer_ends_with_an_error_event_and_done(broken_router):
    router, upstream, errors = broken_router
    body = {"model": "builtin:tiny", "max_tokens": 3, "ignore_eos": True,
            "temperature": 0, "stream": True}  # short if it lands on the real replica
    resp, lines = _on_broken_replica(router, body, stream=True)
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/event-stream")
    # the complete events pass through, the half event is dropped, then the error
    assert lines[:-2] == upstream.sent_events()
    err = json.loads(lines[-2].removeprefix("data: "))["error"]
    assert (err["type"], err["code"], err["param"]) == ("server_error", "upstream_error", None)
    assert "replica 0 failed while answering (RemoteProtocolError)" in err["message"]
    assert lines[-1] == "data: [DONE]"
    assert upstream.broken == 1
    assert not router.replicas.loads[0].healthy
    assert _metric(router, "router_upstream_errors_total", replica="0") == 1
    assert _metric(router, "router_replica_healthy", replica="0") == 0
    with router.replicas.lock:
        assert [(r.running, r.queued_tokens) for r in router.replicas.loads] == [(0, 0)] * 2
    assert not [r for r in errors.records if r.levelno >= logging.ERROR]
    # the service keeps serving: the next stream goes to the healthy replica, complete
    with httpx.stream("POST", router.base + "/v1/completions", headers=ALICE, timeout=60,
                      json={**body, "prompt": unique_prompt(10)}) as r:
        assert r.status_code == 200 and r.headers["x-prefixcache-replica"] == "1"
        assert [ln for ln in r.iter_lines() if ln][-1] == "data: [DONE]"
    assert upstream.broken == 1


def test_a_json_answer_broken_mid_body_is_a_502_error_object(broken_router):
    router, upstream, errors = broken_router
    body = {"model": "builtin:tiny", "max_tokens": 2, "temperature": 0}
    resp, _ = _on_broken_replica(router, body, stream=False)
    assert resp.status_code == 502
    err = resp.json()["error"]
    assert (err["type"], err["code"], err["param"]) == ("server_error", "upstream_error", None)
    assert not router.replicas.loads[0].healthy
    assert _metric(router, "router_upstream_errors_total", replica="0") == 1
    with router.replicas.lock:
        assert [(r.running, r.queued_tokens) for r in router.replicas.loads] == [(0, 0)] * 2
    assert not [r for r in errors.records if r.levelno >= logging.ERROR]
    r = httpx.post(router.base + "/v1/completions", headers=ALICE, timeout=60,
                   json={**body, "prompt": unique_prompt(10)})
    assert r.status_code == 200 and r.headers["x-prefixcache-replica"] == "1"
