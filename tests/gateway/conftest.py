"""Fixtures of the gateway tests: emulated providers served by uvicorn on loopback (real
sockets, so a broken stream really breaks), and gateways talked to in-process."""
from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable

import httpx
import pytest
import uvicorn

from prefixcache.gateway.app import create_app, make_client
from prefixcache.gateway.emulator import Emulator
from prefixcache.gateway.policy import TenantPolicy
from prefixcache.gateway.service import Gateway
from prefixcache.gateway.singleflight import SingleFlight
from prefixcache.gateway.store import MemoryStore
from prefixcache.gateway.upstreams import Upstream, UpstreamSpec
from prefixcache.http.auth import Authenticator
from tests.helpers.wait import wait_until
from tests.server.live import free_port

KEYS = {"sk-a": {"tenant": "alice", "admin": False},
        "sk-b": {"tenant": "bob", "admin": False},
        "sk-ops": {"tenant": "ops", "admin": True}}
A = {"Authorization": "Bearer sk-a"}
B = {"Authorization": "Bearer sk-b"}


class ThreadServer:
    """An ASGI app served by uvicorn on a thread of this process."""

    def __init__(self, app):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port,
                                                    log_level="critical", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_until(lambda: self.server.started, "uvicorn to start", poll_s=0.01)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(10)


def held(app, hold: Callable[[int], bool]):
    """``app`` behind a gate: its ``n``-th request (from 0) is passed on once ``hold(n)``
    is true (polled from a worker thread, so the server keeps accepting meanwhile)."""
    calls = itertools.count()

    async def gated(scope, receive, send):
        if scope["type"] == "http":
            n = next(calls)
            await asyncio.to_thread(wait_until, lambda: hold(n), f"the gate of call {n}")
        await app(scope, receive, send)

    return gated


class CountingFlights(SingleFlight):
    """A gateway's single-flight table that counts its claims (one per request that
    missed the store: the first leads, the others follow until it finishes)."""

    def __init__(self) -> None:
        super().__init__()
        self.claims = 0

    def claim(self, key: bytes):
        self.claims += 1
        return super().claim(key)


@pytest.fixture
def emulators():
    """Start emulators on demand: ``emulators("anthropic", delay_s=...)``; ``hold=`` puts
    the emulator behind :func:`held`."""
    started = []

    def start(provider: str, *, hold: Callable[[int], bool] | None = None,
              **kw) -> tuple[Emulator, str]:
        emu = Emulator(provider, **kw)
        srv = ThreadServer(emu.app if hold is None else held(emu.app, hold))
        started.append(srv)
        return emu, srv.url

    yield start
    for srv in started:
        srv.stop()


def make_gateway(upstreams: list[tuple[str, str, str, tuple[str, ...]]], *,
                 policies: dict | None = None, store=None, semantic=None,
                 timeout_s: float = 10.0) -> Gateway:
    """``upstreams``: ``(name, url, provider, models)``."""
    client = make_client()
    ups = [Upstream(UpstreamSpec(n, u, p, m, timeout_s=timeout_s), client)
           for n, u, p, m in upstreams]
    return Gateway(ups, store if store is not None else MemoryStore(),
                   policies={"*": TenantPolicy(), **(policies or {})}, semantic=semantic)


def run(coro_fn, gateway: Gateway):
    """Run ``coro_fn(client)`` against ``gateway``'s app, in-process."""
    app = create_app(gateway, Authenticator(KEYS))

    async def main():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw",
                                     timeout=30) as c:
            try:
                return await coro_fn(c)
            finally:
                for u in gateway.upstreams:
                    await u.client.aclose()

    return asyncio.run(main())


def chat(model: str, user: str, *, system: str | None = None, **kw) -> dict:
    msgs = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": user}]
    return {"model": model, "messages": msgs, "temperature": 0, "max_tokens": 16, **kw}


def sse_data(text: str) -> list[dict]:
    return [__import__("json").loads(ln[6:]) for ln in text.split("\n")
            if ln.startswith("data: ") and ln != "data: [DONE]"]
