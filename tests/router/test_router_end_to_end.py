"""The router in front of two real replicas: routing by the replicas' own KV events,
usage passed through, streaming, tenants, and the failure answers."""
from __future__ import annotations

import json

import httpx

from tests.helpers.wait import wait_until
from tests.router.conftest import RouterThread
from tests.server.live import expected_hit, free_port, labelled, scrape, unique_prompt

ALICE = {"Authorization": "Bearer sk-alice"}
BOB = {"Authorization": "Bearer sk-bob"}


def _complete(router, prompt: str, headers=ALICE, **extra) -> httpx.Response:
    return httpx.post(router.base + "/v1/completions", headers=headers, timeout=60,
                      json={"model": "builtin:tiny", "prompt": prompt, "max_tokens": 2,
                            "temperature": 0, **extra})


def _metrics(router) -> dict[str, float]:
    return scrape(router.base)


def _wait_confirmed(router, replica: int, hashes: list[bytes]) -> None:
    """Wait until the replica's KV events confirmed these pages in the index."""
    idx = router.replicas.index

    def confirmed() -> bool:
        with router.replicas.lock:
            holders = [idx._entries.get(h, {}).get(replica) for h in hashes]
        return all(e is not None and e[1] == float("inf") for e in holders)

    wait_until(confirmed, "the replica's KV events confirming its pages")


def test_a_repeat_goes_where_its_pages_are_and_reports_the_replicas_cached_tokens(router):
    prompt = unique_prompt(40)
    first = _complete(router, prompt)
    assert first.status_code == 200, first.text
    where = int(first.headers["x-prefixcache-replica"])
    usage = first.json()["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0
    keys = router.app.state.router.settings.keys
    ids = router.app.state.router.settings.tokenizer.encode(prompt)
    assert len(ids) == usage["prompt_tokens"]
    hashes = keys.page_hashes(ids, "alice", None)
    _wait_confirmed(router, where, hashes)  # the replica's own events, same hashes
    before = _metrics(router)
    second = _complete(router, prompt)
    assert int(second.headers["x-prefixcache-replica"]) == where
    cached = second.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == expected_hit(usage["prompt_tokens"]) > 0
    after = _metrics(router)
    r = str(where)
    assert (labelled(after, "router_reported_cached_tokens_total", replica=r)
            - labelled(before, "router_reported_cached_tokens_total", replica=r)) == cached
    assert (labelled(after, "router_predicted_hit_tokens_total", replica=r)
            - labelled(before, "router_predicted_hit_tokens_total", replica=r)) == cached
    assert (labelled(after, "router_decisions_total", replica=r, reason="cache")
            - labelled(before, "router_decisions_total", replica=r, reason="cache")) == 1
    # another tenant's identical prompt is never scored as a hit on alice's pages
    before = after
    third = _complete(router, prompt, headers=BOB)
    assert third.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    after = _metrics(router)
    for i in ("0", "1"):
        assert (labelled(after, "router_predicted_hit_tokens_total", replica=i)
                == labelled(before, "router_predicted_hit_tokens_total", replica=i))


def test_streams_pass_through_with_usage(router):
    prompt = unique_prompt(30)
    body = {"model": "builtin:tiny", "prompt": prompt, "max_tokens": 3, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    for _ in range(2):
        with httpx.stream("POST", router.base + "/v1/completions", headers=ALICE, json=body,
                          timeout=60) as resp:
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            lines = [ln for ln in resp.iter_lines() if ln.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        usage = json.loads(lines[-2][6:])["usage"]
        assert usage["completion_tokens"] == 3
    assert usage["prompt_tokens_details"]["cached_tokens"] == expected_hit(
        usage["prompt_tokens"])
    with router.replicas.lock:
        assert all(r.running == 0 and r.queued_tokens == 0 for r in router.replicas.loads)


def test_a_stream_with_usage_in_every_chunk_counts_its_cached_tokens_once(router):
    prompt = unique_prompt(30)
    body = {"model": "builtin:tiny", "prompt": prompt, "max_tokens": 8, "temperature": 0,
            "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    _complete(router, prompt)  # its pages, then a streamed repeat that hits them
    before = _metrics(router)
    with httpx.stream("POST", router.base + "/v1/completions", headers=ALICE, json=body,
                      timeout=60) as resp:
        where = resp.headers["x-prefixcache-replica"]
        chunks = [json.loads(ln[6:]) for ln in resp.iter_lines()
                  if ln.startswith("data: {")]
    with_usage = [c for c in chunks if c.get("usage")]
    # every chunk repeats the usage (the server may coalesce tokens into fewer chunks under
    # load, so only the repetition itself is required)
    assert len(with_usage) >= 2
    cached = with_usage[-1]["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == expected_hit(with_usage[-1]["usage"]["prompt_tokens"]) > 0
    after = _metrics(router)
    assert (labelled(after, "router_reported_cached_tokens_total", replica=where)
            - labelled(before, "router_reported_cached_tokens_total", replica=where)) == cached


def test_errors_are_openai_objects(router):
    r = httpx.post(router.base + "/v1/completions", json={"prompt": "x"}, timeout=60)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = _complete(router, "x", max_tokens=-1)
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    r = _complete(router, "x", model="nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_503_when_no_replica_is_healthy_and_failover_when_one_is_down(replicas, keys_file):
    dead = f"http://127.0.0.1:{free_port()}"
    router = RouterThread(["--api-keys", str(keys_file), "--replica", dead,
                           "--replica", replicas[0].base, "--health-interval-s", "600",
                           "--startup-timeout-s", "1"])
    try:
        # the dead one never answered GET /v1/cache/info: it takes nothing
        assert router.replicas.verified == [False, True]
        router.replicas.set_health(1, False)
        r = _complete(router, "hello")
        assert r.status_code == 503
        assert r.json()["error"]["code"] == "no_healthy_replica"
        assert httpx.get(router.base + "/health", timeout=60).status_code == 503
        router.replicas.set_verified(0, True)  # as if it had answered, then died
        router.replicas.set_health(0, True)
        router.replicas.set_health(1, True)
        for _ in range(2):  # ties rotate: one of the two is tried on the dead one first
            r = _complete(router, unique_prompt(10))
            assert r.status_code == 200 and r.headers["x-prefixcache-replica"] == "1"
        assert not router.replicas.loads[0].healthy
        m = _metrics(router)
        assert labelled(m, "router_upstream_errors_total", replica="0") == 1
    finally:
        router.stop()


def test_chat_turns_follow_their_conversation(router):
    messages = [{"role": "system", "content": unique_prompt(30)},
                {"role": "user", "content": "first question " * 4}]
    seen = []
    for _turn in range(3):
        r = httpx.post(router.base + "/v1/chat/completions", headers=ALICE, timeout=60,
                       json={"model": "builtin:tiny", "messages": messages, "max_tokens": 2,
                             "temperature": 0})
        assert r.status_code == 200, r.text
        seen.append((int(r.headers["x-prefixcache-replica"]),
                     r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]))
        messages += [r.json()["choices"][0]["message"],
                     {"role": "user", "content": "and then? " * 4}]
    assert len({replica for replica, _ in seen}) == 1  # affinity over turns
    assert seen[0][1] == 0 and all(c > 0 for _, c in seen[1:])


def _direct_and_routed(router, replica, path: str, body: dict):
    """The same request sent to a replica itself and through the router."""
    return [httpx.post(base + path, headers=ALICE, json=body, timeout=60)
            for base in (replica.base, router.base)]


def test_models_are_listed_once_and_the_404_names_each_once(router, replicas):
    r = httpx.get(router.base + "/v1/models", headers=ALICE, timeout=60)
    assert r.status_code == 200
    assert [m["id"] for m in r.json()["data"]] == ["builtin:tiny"]
    direct, routed = _direct_and_routed(router, replicas[0], "/v1/completions",
                                        {"model": "nope", "prompt": "x", "max_tokens": 1})
    assert routed.status_code == direct.status_code == 404
    assert routed.json() == direct.json()
    assert routed.json()["error"] == {
        "message": "The model `nope` does not exist. Served: builtin:tiny",
        "type": "invalid_request_error", "param": "model", "code": "model_not_found"}


def test_bad_max_tokens_get_the_replicas_own_400(router, replicas):
    chat = {"model": "builtin:tiny", "messages": [{"role": "user", "content": "hi"}]}
    cases = [("/v1/chat/completions", {**chat, "max_tokens": -1}, "max_tokens"),
             ("/v1/chat/completions", {**chat, "max_tokens": 0}, "max_tokens"),
             ("/v1/chat/completions", {**chat, "max_completion_tokens": -1},
              "max_completion_tokens"),
             ("/v1/chat/completions", {**chat, "max_completion_tokens": 0},
              "max_completion_tokens"),
             ("/v1/completions", {"model": "builtin:tiny", "prompt": "x", "max_tokens": -1},
              "max_tokens")]
    for path, body, param in cases:
        direct, routed = _direct_and_routed(router, replicas[0], path, body)
        assert routed.status_code == direct.status_code == 400, (body, routed.text)
        assert routed.json() == direct.json(), body
        assert routed.json()["error"]["param"] == param
        assert routed.json()["error"]["type"] == "invalid_request_error"
        if path == "/v1/chat/completions":  # chat: at least 1 (0 prefills on completions)
            assert routed.json()["error"]["message"].startswith(
                f"{param} must be at least 1 here, got {body[param]}")


def test_a_session_stays_on_the_replica_that_served_it(router, replicas):
    sid = f"job-{unique_prompt(1).split()[0][1:9]}"
    before = _metrics(router)
    served = []
    for _ in range(4):  # unrelated prompts: only the session ties them together
        r = _complete(router, unique_prompt(30), headers={**ALICE, "X-Session-Id": sid})
        assert r.status_code == 200, r.text
        served.append(int(r.headers["x-prefixcache-replica"]))
    home = served[0]
    assert served == [home] * 4
    after = _metrics(router)
    assert (labelled(after, "router_decisions_total", replica=str(home), reason="session")
            - labelled(before, "router_decisions_total", replica=str(home),
                       reason="session")) == 3
    # The header reached the replica: it holds the session (alice's only).
    info = httpx.get(f"{replicas[home].base}/v1/sessions/{sid}", headers=ALICE, timeout=60)
    assert info.status_code == 200 and info.json()["calls"] == 4, info.text
    assert httpx.get(f"{replicas[1 - home].base}/v1/sessions/{sid}", headers=ALICE,
                     timeout=60).status_code == 404
    assert httpx.get(f"{replicas[home].base}/v1/sessions/{sid}", headers=BOB,
                     timeout=60).status_code == 404
