"""One engine replica: an engine behind the server's own FastAPI app, called in-process.

:class:`EngineReplica` builds an ``LLMEngine`` from an :class:`~prefixcache.config.EngineConfig`
and the server's app around it (:func:`prefixcache.server.app.create_app`: the same
routes, authentication, request parsing, response and error code as ``prefixcache
serve``), and answers each :class:`~.messages.ReplicaRequest` by calling that app as an
ASGI application: no second API layer. The answer streams back as a
:class:`~.messages.ResponseHead` and then the body's bytes.

The replica publishes its KV events over ZeroMQ on two ports it picks on its node's
address (the request router subscribes, see :mod:`.request_router`) and reports them in
:meth:`EngineReplica.record_routing_stats`. The shared KV tier (``kv_store_url``) and its
cross-replica stampede lock work as for replicas started by hand: every replica gets the
same config.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import socket
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

from prefixcache.config import EngineConfig
from prefixcache.deploy.ray.messages import REPLICA_HEADER, ReplicaRequest, ResponseHead
from prefixcache.deploy.ray.request_router import (
    STATS_BLOCK_SIZE,
    STATS_EVENTS,
    STATS_INCARNATION,
    STATS_REPLAY,
)
from prefixcache.server.app import ServerSettings, create_app

log = logging.getLogger(__name__)


def free_port(host: str) -> int:
    """A TCP port free on ``host`` now (bound and released; another process may take it
    before it is bound again, in which case the engine's bind fails and names it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def node_address() -> str:
    """This node's address as Ray knows it (the one other nodes reach)."""
    import ray

    return str(ray.util.get_node_ip_address())


class EngineReplica:
    """A Ray Serve deployment class: one engine per replica.

    Args:
        config: the engine's configuration; its ``kv_events_endpoint`` and
            ``kv_events_replay_endpoint`` are replaced by ports picked here when
            ``publish_events`` is true.
        settings: the server app's settings (served names, key file, limits).
        publish_events: publish KV events for the request router.
    """

    async def __init__(self, config: EngineConfig,  # type: ignore[misc]
                       settings: ServerSettings, publish_events: bool = True) -> None:
        from prefixcache.engine.engine import LLMEngine

        if publish_events:
            host = node_address()
            config = dataclasses.replace(
                config, kv_events_endpoint=f"tcp://{host}:{free_port(host)}",
                kv_events_replay_endpoint=f"tcp://{host}:{free_port(host)}")
        self.config = config
        self.engine = LLMEngine(config)
        self.name = _replica_name()
        # the replica's app answers whatever Host the ingress forwards
        self.app = create_app(self.engine, dataclasses.replace(settings, allowed_hosts=None))
        self._lifespan = self.app.router.lifespan_context(self.app)
        await self._lifespan.__aenter__()  # starts the engine thread, waits for warm-up

    def record_routing_stats(self) -> dict[str, Any]:
        """Ray's routing stats: where this replica's KV events are published."""
        pub = self.engine.kv_events
        if pub is None:
            return {STATS_BLOCK_SIZE: self.config.block_size}
        return {STATS_EVENTS: pub.endpoint, STATS_REPLAY: pub.replay_endpoint,
                STATS_INCARNATION: pub.incarnation, STATS_BLOCK_SIZE: self.config.block_size}

    def check_health(self) -> None:
        """Ray's health check: raises when the engine thread has stopped."""
        if not self.app.state.engine.is_alive():
            raise RuntimeError("the engine thread is not running")

    def cache_info(self) -> dict[str, Any]:
        """What the ingress needs to hash prompts as this engine does."""
        return {"model_fingerprint": self.engine.fingerprint,
                "block_size": self.config.block_size,
                "hash_root_seed": self.config.hash_root_seed,
                "max_model_len": self.engine.max_model_len}

    async def handle(self, request: ReplicaRequest) -> AsyncIterator[ResponseHead | bytes]:
        """Serve one HTTP request through the server's app: a :class:`ResponseHead`,
        then the body in chunks as the app sends them (SSE events one by one)."""
        path, _, query = request.path.partition("?")
        scope = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1", "method": request.method, "scheme": "http",
            "path": path, "raw_path": path.encode(), "query_string": query.encode(),
            "root_path": "", "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 80),
            "headers": [(k.lower().encode("latin-1"), v.encode("latin-1"))
                        for k, v in request.headers],
            "state": {},
        }
        sent: asyncio.Queue[MutableMapping[str, Any]] = asyncio.Queue()
        gone = asyncio.Event()
        body_read = False

        async def receive() -> MutableMapping[str, Any]:
            nonlocal body_read
            if not body_read:
                body_read = True
                return {"type": "http.request", "body": request.body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: MutableMapping[str, Any]) -> None:
            await sent.put(message)

        async def run() -> None:
            try:
                await self.app(scope, receive, send)
            finally:
                await sent.put({"type": "done"})

        task = asyncio.create_task(run())
        try:
            while True:
                msg = await sent.get()
                kind = msg["type"]
                if kind == "http.response.start":
                    headers = [(k.decode("latin-1"), v.decode("latin-1"))
                               for k, v in msg.get("headers", [])]
                    yield ResponseHead(int(msg["status"]), headers + [(REPLICA_HEADER,
                                                                       self.name)])
                elif kind == "http.response.body":
                    if msg.get("body"):
                        yield bytes(msg["body"])
                    if not msg.get("more_body", False):
                        break
                elif kind == "done":
                    break
        finally:
            gone.set()  # the client left (or the answer is complete): the app aborts
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(task, timeout=10.0)


def _replica_name() -> str:
    """This replica's Ray actor name (``ray.get_actor(name, namespace="serve")``)."""
    try:
        from ray import serve

        return str(serve.get_replica_context().replica_id.to_full_id_str())
    except Exception:  # outside a Serve replica (tests of the class itself)
        return "local"
