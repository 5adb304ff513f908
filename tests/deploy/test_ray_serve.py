"""prefixcache on a real local Ray cluster (127.0.0.1): builtin:tiny, 2 engine replicas
behind the ingress, routed by the cache-aware request router; the same key file as the
server's tests. One cluster for the module (starting Ray and two engines is the cost)."""
from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

from starlette.testclient import TestClient  # noqa: E402

from prefixcache.config import EngineConfig  # noqa: E402
from prefixcache.deploy.ray.app import DeploySettings, build_application  # noqa: E402
from prefixcache.deploy.ray.ingress import REPLICA_FAILED  # noqa: E402
from prefixcache.deploy.ray.messages import PREDICTED_HEADER, REPLICA_HEADER  # noqa: E402
from prefixcache.http.auth import Authenticator  # noqa: E402
from prefixcache.server.app import ServerSettings  # noqa: E402
from tests.helpers.wait import wait_until  # noqa: E402
from tests.server.live import KEYS, expected_hit, free_port, unique_prompt  # noqa: E402

ALICE = {"Authorization": "Bearer sk-alice"}
BOB = {"Authorization": "Bearer sk-bob"}
MODEL = "builtin:tiny"
# plain torch ops: the replicas do not queue on the CPU kernels' build lock, which every
# process on the machine shares (the kernels have their own tests)
CONFIG = EngineConfig(model=MODEL, compute_backend="torch")
START_DEADLINE_S = 600.0  # Ray and two engines on a loaded two-core machine


def _settings() -> ServerSettings:
    return ServerSettings(model_names=[MODEL], model_root=MODEL, auth=Authenticator(KEYS))


@pytest.fixture(scope="module")
def cluster():
    os.environ.setdefault("RAY_raylet_start_wait_time_s", str(int(START_DEADLINE_S)))
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a throwaway cluster on loopback
    port = free_port()
    ray.init(address="local", num_cpus=3, include_dashboard=False, log_to_driver=False,
             _node_ip_address="127.0.0.1")
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = build_application(CONFIG, _settings(),
                                DeploySettings(replicas=2, cpus_per_replica=1,
                                               router_kwargs={"balance_abs_tokens": 64}))
        serve.run(app, name="prefixcache", route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


def _complete(base: str, prompt: str, headers=ALICE, **extra) -> httpx.Response:
    r = httpx.post(base + "/v1/completions", headers=headers, timeout=120,
                   json={"model": MODEL, "prompt": prompt, "max_tokens": 2, "temperature": 0,
                         **extra})
    assert r.status_code == 200, r.text
    return r


def _cached(r: httpx.Response) -> int:
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_repeats_go_to_the_replica_holding_the_prefix_and_tenants_stay_apart(cluster):
    prompt = unique_prompt(40)
    first = _complete(cluster, prompt)
    where = first.headers[REPLICA_HEADER]
    tokens = first.json()["usage"]["prompt_tokens"]
    assert _cached(first) == 0 and first.headers[PREDICTED_HEADER] == "0"
    for _ in range(2):
        again = _complete(cluster, prompt)
        assert again.headers[REPLICA_HEADER] == where
        assert _cached(again) == expected_hit(tokens) > 0
        assert int(again.headers[PREDICTED_HEADER]) == _cached(again)
    bob = _complete(cluster, prompt, headers=BOB)  # same text, another tenant's namespace
    assert bob.headers[PREDICTED_HEADER] == "0" and _cached(bob) == 0


def test_a_shared_system_prompt_is_spread_over_both_replicas(cluster):
    system = unique_prompt(60)

    def ask(u: int) -> httpx.Response:
        return httpx.post(cluster + "/v1/chat/completions", headers=ALICE, timeout=300, json={
            "model": MODEL, "max_tokens": 100, "ignore_eos": True, "temperature": 0,
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": f"question {u} " + unique_prompt(3)}]})

    with ThreadPoolExecutor(8) as pool:  # concurrent: each one decodes a while
        answers = list(pool.map(ask, range(8)))
    seen: dict[str, int] = {}
    for r in answers:
        assert r.status_code == 200, r.text
        seen[r.headers[REPLICA_HEADER]] = seen.get(r.headers[REPLICA_HEADER], 0) + 1
    assert len(seen) == 2 and max(seen.values()) <= 6  # no monopoly
    # each replica's first request there is a miss, every later one a predicted hit
    # (a burst is counted as it is ranked, before Ray sends any of it)
    predicted = sorted(int(r.headers[PREDICTED_HEADER]) for r in answers)
    assert predicted[:2] == [0, 0] and all(p > 0 for p in predicted[2:])
    assert sum(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
               for r in answers) >= 1
    repeat = ask(0)  # now both replicas hold it: a repeat hits wherever it goes
    assert repeat.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == int(
        repeat.headers[PREDICTED_HEADER]) > 0


def test_same_answers_as_serve(cluster):
    from prefixcache.engine.engine import LLMEngine
    from prefixcache.server.app import create_app

    bodies = [
        ("/v1/completions", {"model": MODEL, "prompt": "The quick brown fox", "max_tokens": 8,
                             "temperature": 0, "logprobs": 1, "ignore_eos": True}),
        ("/v1/chat/completions", {"model": MODEL, "max_tokens": 6, "temperature": 0,
                                  "messages": [{"role": "user", "content": "hello there"}]}),
        ("/v1/messages", {"model": MODEL, "max_tokens": 6,
                          "messages": [{"role": "user", "content": "hello there"}]}),
    ]
    app = create_app(LLMEngine(CONFIG), _settings())
    with TestClient(app) as local:
        for path, body in bodies:
            want = local.post(path, headers=ALICE, json=body)
            got = httpx.post(cluster + path, headers=ALICE, json=body, timeout=120)
            assert got.status_code == want.status_code == 200, got.text
            w, g = want.json(), got.json()
            if path == "/v1/completions":
                assert g["choices"][0]["logprobs"]["tokens"] == (
                    w["choices"][0]["logprobs"]["tokens"])
                assert len(g["choices"][0]["logprobs"]["tokens"]) == 8
            if path == "/v1/messages":
                assert g["content"] == w["content"] and g["stop_reason"] == w["stop_reason"]
            else:
                assert g["choices"][0]["text" if "prompt" in body else "message"] == (
                    w["choices"][0]["text" if "prompt" in body else "message"])
    bad = httpx.post(cluster + "/v1/completions", headers=ALICE, timeout=60,
                     json={"model": MODEL, "prompt": "x", "max_tokens": -1})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"
    anon = httpx.post(cluster + "/v1/completions", json={"model": MODEL, "prompt": "x"},
                      timeout=60)
    assert anon.status_code == 401


def test_a_killed_replica_fails_its_stream_and_the_next_requests_are_served(cluster):
    prompt = unique_prompt(40)
    held = _complete(cluster, prompt)  # its pages are on that replica only
    victim = held.headers[REPLICA_HEADER]
    assert _complete(cluster, prompt).headers[REPLICA_HEADER] == victim
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 2000, "temperature": 0,
            "ignore_eos": True, "stream": True}
    events = []
    with httpx.stream("POST", cluster + "/v1/completions", headers=ALICE, json=body,
                      timeout=120) as resp:
        assert resp.status_code == 200 and resp.headers[REPLICA_HEADER] == victim
        lines = resp.iter_lines()
        for line in lines:
            if line.startswith("data: {"):
                events.append(json.loads(line[6:]))
                break
        ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
        events += [json.loads(ln[6:]) for ln in lines if ln.startswith("data: {")]
    assert events[-1]["error"]["code"] == REPLICA_FAILED
    assert all("choices" in e for e in events[:-1])
    for _ in range(3):  # the next requests are served (by the survivor, then the new one)
        assert _complete(cluster, unique_prompt(5)).status_code == 200

    def replaced() -> bool:
        names = {_complete(cluster, unique_prompt(5)).headers[REPLICA_HEADER]
                 for _ in range(2)}
        return len(names) == 2 and victim not in names

    wait_until(replaced, "Ray to replace the killed replica", deadline_s=START_DEADLINE_S,
               poll_s=0.5)
    again = _complete(cluster, prompt)  # nobody holds it now, and nobody is predicted to
    assert again.headers[PREDICTED_HEADER] == "0" and _cached(again) == 0
