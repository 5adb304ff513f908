"""The router on the HTTP foundation: the server's limits (body size, malformed JSON,
header-read timeout, draining on SIGTERM, /health, /metrics), against a router served on
a thread with a gated replica behind it."""
from __future__ import annotations

import httpx
import pytest

from prefixcache.cache.page_keys import PromptKeys
from prefixcache.model.loader import load_tokenizer
from prefixcache.router.app import RouterSettings, create_router_app
from prefixcache.router.replicas import ReplicaSet
from prefixcache.router.specs import ReplicaSpec
from tests.helpers import http_checks as hc
from tests.helpers.wait import DEADLINE_S, wait_until

LIMIT = 4096
BODY = {"model": "tiny", "prompt": "the quick brown fox", "max_tokens": 1}


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("builtin:tiny")[0]


@pytest.fixture
def router(tokenizer):
    upstream = hc.GatedUpstream()
    with hc.upstream_served(upstream) as url:
        settings = RouterSettings(model_names=["tiny"], tokenizer=tokenizer,
                                  keys=PromptKeys("tiny-id", "seed", 16),
                                  max_body_bytes=LIMIT, health_interval_s=0.2,
                                  shutdown_grace_s=30)
        replicas = ReplicaSet([ReplicaSpec(url)])
        with hc.served(create_router_app(replicas, settings)) as s:
            wait_until(lambda: replicas.any_healthy, "the replica to be healthy")
            yield s, upstream


def test_router_limits_match_the_servers(router):
    s, upstream = router
    hc.check_oversized_body(s.base, "/v1/completions", LIMIT)
    hc.check_malformed_json(s.base, "/v1/completions")
    hc.check_unknown_route(s.base)
    hc.check_slow_headers_are_closed(s.port)
    hc.check_health_and_metrics(s.base, "router_replica_healthy")
    assert upstream.seen == 0  # none of these reached the replica


def test_router_drains_an_in_flight_request_on_sigterm(router):
    s, upstream = router
    hc.check_sigterm_drains(s, upstream, "/v1/completions", BODY)
    assert upstream.seen == 1


def test_the_router_takes_an_absent_model_as_the_replicas_one(router):
    """The replicas serve one model: ``model`` may be left out (the replica answers with
    its name); a name they do not serve is 404 naming ``model``, before any replica."""
    s, upstream = router
    r = httpx.post(s.base + "/v1/completions", json={**BODY, "model": "gpt-4o"},
                   timeout=DEADLINE_S)
    assert r.status_code == 404
    assert (r.json()["error"]["param"], r.json()["error"]["code"]) == ("model",
                                                                       "model_not_found")
    assert upstream.seen == 0
    upstream.gate.set()
    body = {k: v for k, v in BODY.items() if k != "model"}
    r = httpx.post(s.base + "/v1/completions", json=body, timeout=DEADLINE_S)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "done"
    assert upstream.seen == 1
