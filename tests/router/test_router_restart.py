"""A replica killed with SIGKILL and restarted on the same ports: the router drops its
index entries as soon as the new process's KV events arrive (before any request and
with health checks too rare to notice), counts the restart, and asks the new process
what it serves (one that serves another model name is shut out)."""
from __future__ import annotations

import os
import signal

import httpx

from tests.helpers.wait import wait_until
from tests.router.conftest import RouterThread
from tests.server.live import LiveServer, free_port, labelled, scrape, unique_prompt

ALICE = {"Authorization": "Bearer sk-alice"}


def _metrics(router) -> dict[str, float]:
    return scrape(router.base)


def _complete(router, prompt: str) -> httpx.Response:
    r = httpx.post(router.base + "/v1/completions", headers=ALICE, timeout=60,
                   json={"model": "builtin:tiny", "prompt": prompt, "max_tokens": 1,
                         "temperature": 0})
    assert r.status_code == 200, r.text
    return r


def test_a_replica_restarted_on_the_same_ports_loses_its_index_entries_at_once(
        tmp_path, keys_file):
    port = free_port()
    ep, rep = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    args = ["--api-keys", str(keys_file), "--kv-events-endpoint", ep,
            "--kv-events-replay-endpoint", rep]
    replica = LiveServer(args, tmp_path / "first.log", port=port)
    router = None
    try:
        replica.wait_ready()
        router = RouterThread(["--api-keys", str(keys_file), "--health-interval-s", "600",
                               "--replica", f"{replica.base},events={ep},replay={rep}"])
        rs = router.replicas
        prompt = unique_prompt(50)
        usage = _complete(router, prompt).json()["usage"]
        s = router.app.state.router.settings
        hashes = s.keys.page_hashes(s.tokenizer.encode(prompt), "alice", None)
        limit = (usage["prompt_tokens"] - 1) // s.keys.block_size
        assert limit >= 10

        def held() -> int:
            """Leading pages the index says replica 0 holds, by its KV events."""
            with rs.lock:
                return rs.index.match(hashes[:limit], [0], rs.clock() + 3600)[0]

        wait_until(lambda: held() == limit, "the replica's KV events did not confirm its pages")
        os.killpg(replica.proc.pid, signal.SIGKILL)
        replica.proc.wait(10)
        replica.stop()
        replica = LiveServer(args, tmp_path / "second.log", port=port)
        replica.wait_ready()
        # the new incarnation is known without a request and without a health check
        wait_until(lambda: labelled(_metrics(router), "router_kv_event_restarts_total",
                               replica="0") == 1, "the restart was not seen")
        assert held() == 0
        assert rs.loads[0].healthy
        before = _metrics(router)
        again = _complete(router, prompt)
        assert again.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        after = _metrics(router)
        for name in ("router_predicted_hit_tokens_total", "router_reported_cached_tokens_total"):
            assert labelled(after, name, replica="0") == labelled(before, name, replica="0")
        assert labelled(after, "router_kv_event_restarts_total", replica="0") == 1
        # restarted under another name: asked again at once, and shut out
        os.killpg(replica.proc.pid, signal.SIGKILL)
        replica.proc.wait(10)
        replica.stop()
        replica = LiveServer([*args, "--served-model-name", "renamed"],
                             tmp_path / "third.log", port=port)
        replica.wait_ready()
        wait_until(lambda: not rs.verified[0], "the renamed replica was not shut out")
        assert rs.subscribers[0].stream.restarts == 2 and not rs.loads[0].healthy
        r = httpx.post(router.base + "/v1/completions", headers=ALICE, timeout=60,
                       json={"model": "builtin:tiny", "prompt": prompt, "max_tokens": 1})
        assert r.status_code == 503 and r.json()["error"]["code"] == "no_healthy_replica"
    finally:
        if router is not None:
            router.stop()
        replica.stop()
