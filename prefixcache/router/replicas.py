"""The replicas behind the router: their load, health, event streams, and the index.

One :class:`ReplicaSet` holds everything routing reads and writes, behind one lock (KV
event subscribers apply events from their own threads):

- per replica a :class:`~.policy.ReplicaLoad` (router-side counts: what it sent there
  and what came back), its health, its :class:`~.event_stream.EventSubscriber`;
- the :class:`~.index.PageIndex` fed by the events and by the router's own routing
  decisions (approximate entries).

A replica that fails a health check or a connection has its index entries dropped, as
one whose event stream restarts or has an unfillable gap (DESIGN: a replica that
restarts or leaves keeps no stale affinity).
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

from prefixcache.router.event_stream import EventSubscriber
from prefixcache.router.index import PageIndex
from prefixcache.router.policy import Decision, Policy, ReplicaLoad
from prefixcache.router.specs import ReplicaSpec

__all__ = ["ReplicaSet", "ReplicaSpec", "Routed"]

MAX_SESSIONS = 65536  # sessions remembered (least recently routed forgotten first)


@dataclass
class Routed:
    """A request placed on a replica: what :meth:`ReplicaSet.release` undoes."""

    decision: Decision
    queued_tokens: int
    prefilled: bool = False
    done: bool = False


@dataclass
class ReplicaSet:
    """Replicas, their loads and the shared page index (thread-safe)."""

    specs: Sequence[ReplicaSpec]
    index: PageIndex = field(default_factory=PageIndex)
    policy: Policy = field(default_factory=Policy)
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        if not self.specs:
            raise ValueError("--replica: at least one replica is needed")
        self.loads = [ReplicaLoad() for _ in self.specs]
        self.verified = [True] * len(self.specs)  # its GET /v1/cache/info agrees
        self.lock = threading.Lock()
        self.subscribers: list[EventSubscriber | None] = [None] * len(self.specs)
        # (tenant, session id) -> the replica its last call went to (bounded, LRU)
        self.sessions: OrderedDict[tuple[Hashable, str], int] = OrderedDict()

    # -- events ------------------------------------------------------------------------
    def start_events(self) -> None:
        """Subscribe to every replica that has an events endpoint."""
        for i, spec in enumerate(self.specs):
            if spec.events and self.subscribers[i] is None:
                sub = EventSubscriber(spec.events, spec.replay, self._applier(i))
                self.subscribers[i] = sub
                sub.start()

    def stop_events(self) -> None:
        for sub in self.subscribers:
            if sub is not None:
                sub.close()
        self.subscribers = [None] * len(self.specs)

    def _applier(self, i: int) -> Callable[[str, list[bytes]], None]:
        def apply(kind: str, hashes: list[bytes]) -> None:
            self.apply_event(i, kind, hashes)
        return apply

    def apply_event(self, replica: int, kind: str, hashes: list[bytes]) -> None:
        """One KV event of ``replica``: ``stored``, ``removed`` or ``cleared``."""
        with self.lock:
            self.index.apply(replica, kind, hashes)

    # -- health ------------------------------------------------------------------------
    def set_health(self, replica: int, healthy: bool) -> None:
        """Record a health check; a replica that goes down has its entries dropped. One
        not verified (:meth:`set_verified`) stays down."""
        with self.lock:
            healthy = healthy and self.verified[replica]
            was = self.loads[replica].healthy
            self.loads[replica].healthy = healthy
            if was and not healthy:
                self.index.clear(replica)

    def set_verified(self, replica: int, verified: bool) -> None:
        """Whether the replica reported the model and page keys of the others; one that
        did not takes no request."""
        with self.lock:
            self.verified[replica] = verified
        if not verified:
            self.set_health(replica, False)

    def shed(self, replica: int, seconds: float) -> None:
        """The replica refused a request (429/503): no new traffic for ``seconds``."""
        with self.lock:
            self.loads[replica].shed_until = self.clock() + seconds

    @property
    def any_healthy(self) -> bool:
        return any(r.healthy for r in self.loads)

    # -- routing -----------------------------------------------------------------------
    def route(self, hashes: Sequence[bytes], prompt_tokens: int, block_size: int,
              exclude: Sequence[int] = (),
              session: tuple[Hashable, str] | None = None) -> Routed | None:
        """Choose a replica for a prompt with these page hashes and count the request
        there; ``None`` when no replica is available.

        Args:
            hashes: the prompt's full-page hashes (every full page, in order).
            prompt_tokens: its length, tokens.
            block_size: tokens per page.
            exclude: replicas already tried for this request.
            session: ``(tenant, session id)`` of an agent session's call: it goes to
                the replica its last call went to unless that one is overloaded
                (:meth:`.policy.Policy.choose`).
        """
        limit = max(0, (prompt_tokens - 1) // block_size)  # the last token is computed
        with self.lock:
            now = self.clock()
            loads = [ReplicaLoad(0, 0, False) if i in exclude else r
                     for i, r in enumerate(self.loads)]
            pages = self.index.match(hashes[:limit], range(len(loads)), now)
            hit = {i: n * block_size for i, n in pages.items()}
            prefer = None if session is None else self.sessions.get(session)
            decision = self.policy.choose(prompt_tokens, hit, loads, now, prefer)
            if decision is None:
                return None
            if session is not None:
                self.sessions[session] = decision.replica
                self.sessions.move_to_end(session)
                if len(self.sessions) > MAX_SESSIONS:
                    self.sessions.popitem(last=False)
            load = self.loads[decision.replica]
            queued = prompt_tokens - decision.hit_tokens
            load.queued_tokens += queued
            load.running += 1
            self.index.approximate(decision.replica, hashes, now)
            return Routed(decision, queued)

    def prefilled(self, routed: Routed) -> None:
        """The replica started answering: the request's prefill is done."""
        with self.lock:
            if not routed.prefilled:
                routed.prefilled = True
                self.loads[routed.decision.replica].queued_tokens -= routed.queued_tokens

    def release(self, routed: Routed) -> None:
        """The request finished (or failed) there. Idempotent."""
        self.prefilled(routed)
        with self.lock:
            if not routed.done:
                routed.done = True
                self.loads[routed.decision.replica].running -= 1
