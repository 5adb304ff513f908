"""Two real ``prefixcache serve`` replicas (builtin:tiny, KV events on, one key file) and
a router in front of them, run in-process on a uvicorn thread."""
from __future__ import annotations

import argparse
import json
import threading

import httpx
import pytest
import uvicorn

from prefixcache.router.cli import add_parser, build_router_app
from tests.helpers.wait import wait_until
from tests.server.live import KEYS, LiveServer, free_port, unique_prompt

HEALTH_TIMEOUT_S = 30.0


class RouterThread:
    """``prefixcache router`` on a uvicorn thread (its app is inspectable)."""

    def __init__(self, argv: list[str]):
        sub = argparse.ArgumentParser().add_subparsers()
        port = free_port()
        # no --model, --block-size, --dtype: the router reads them from the replicas
        args = add_parser(sub).parse_args(["--port", str(port), "--health-interval-s", "0.2",
                                           "--startup-timeout-s", "5", *argv])
        self.app = build_router_app(args)
        # a health check's budget no loaded machine exceeds by accident (a failed check
        # takes a replica out of routing until the next one)
        self.app.state.router.settings.health_timeout_s = HEALTH_TIMEOUT_S
        self.base = f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=port,
                                                    log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_until(lambda: self.server.started, "the router to start")

    @property
    def replicas(self):
        return self.app.state.router.replicas

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("router-keys") / "keys.json"
    path.write_text(json.dumps(KEYS))
    return path


@pytest.fixture(scope="module")
def replicas(tmp_path_factory, keys_file):
    servers = []
    for i in range(2):
        ep, rep = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
        srv = LiveServer(["--api-keys", str(keys_file), "--kv-events-endpoint", ep,
                          "--kv-events-replay-endpoint", rep],
                         tmp_path_factory.mktemp(f"replica{i}") / "server.log")
        srv.events, srv.replay = ep, rep
        servers.append(srv)
    try:
        for srv in servers:
            srv.wait_ready()
        yield servers
    finally:
        for srv in servers:
            srv.stop()


def wait_for_events(router: RouterThread, i: int, replica: LiveServer) -> None:
    """Wait until the router receives replica ``i``'s KV events: its SUB socket gets only
    what is published after it joined, so prompts are sent to the replica itself until
    their pages show up in the router's index."""
    def arrived() -> bool:
        with router.replicas.lock:
            if any(i in holders for holders in router.replicas.index._entries.values()):
                return True
        r = httpx.post(replica.v1 + "/completions", timeout=60,
                       headers={"Authorization": "Bearer sk-alice"},
                       json={"model": "builtin:tiny", "prompt": unique_prompt(10),
                             "max_tokens": 1})
        assert r.status_code == 200, r.text
        return False

    wait_until(arrived, f"replica {i}'s KV events at the router", poll_s=0.1)


@pytest.fixture(scope="module")
def router(replicas, keys_file):
    argv = ["--api-keys", str(keys_file)]
    for srv in replicas:
        argv += ["--replica", f"{srv.base},events={srv.events},replay={srv.replay}"]
    r = RouterThread(argv)
    try:
        for i, srv in enumerate(replicas):
            wait_for_events(r, i, srv)
        yield r
    finally:
        r.stop()
