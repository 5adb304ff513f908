"""A Ray Serve ``RequestRouter`` that places requests with the router's policy.

The ranking is :class:`prefixcache.router.policy.Policy` over
:class:`prefixcache.router.index.PageIndex`, the same objects ``prefixcache router`` uses:
for each candidate replica, the tokens to prefill there (the prompt less its leading pages
the index says the replica holds, keyed by the tenant-rooted page hashes the ingress
computed) plus the work already queued there, with the balance thresholds. The chosen
replica is ranked first, the others after it by the same cost, so Ray falls back to them
when the first one is full.

Where the index learns what a replica holds: every replica publishes its KV events over
ZeroMQ (``engine/kv_events.py``, the same stream ``prefixcache router`` consumes) on a
port it picks, and reports that address and its event stream's incarnation in its Ray
routing stats (``record_routing_stats``). This router subscribes to each replica it is
given (:class:`prefixcache.router.event_stream.EventSubscriber`). The routing stats alone
would not do: Ray polls them every ``request_routing_stats_period_s`` and broadcasts them
through the controller, seconds late and too coarse for page lists, while an event batch
arrives after the engine step that stored the pages. Between the request and its
events, the router's own placement is an approximate entry, as in ``prefixcache router``.

Replicas are Ray replica ids, each mapped to a slot of the index that is never reused. A
replica that Ray replaces (its actor died) is a new replica id, hence a new, empty slot;
the old slot is cleared as soon as Ray reports the death or drops the replica from the
set. A new incarnation in a stream clears the slot too (the event stream's rule).

Load (router-side counts, as in ``prefixcache router``): a request counts its tokens to
prefill and one running request on its first-ranked replica from the moment it is
ranked (Ray may rank a whole burst before sending any of it), moved to the replica Ray
sends it to, until Ray reports it completed (Ray gives no prefill-done signal, so
queued tokens stay counted until the request ends).
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ray.serve.request_router import (
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)

from prefixcache.deploy.ray.messages import Prediction, ReplicaRequest
from prefixcache.router.event_stream import EventSubscriber
from prefixcache.router.index import DEFAULT_APPROX_TTL_S, DEFAULT_MAX_PAGES, PageIndex
from prefixcache.router.policy import (
    DEFAULT_BALANCE_ABS_TOKENS,
    DEFAULT_BALANCE_REL,
    DEFAULT_DECODE_WEIGHT,
    Policy,
    ReplicaLoad,
)

log = logging.getLogger(__name__)

STATS_EVENTS = "kv_events"          # routing stats: the replica's PUB address
STATS_REPLAY = "kv_events_replay"   # its replay address
STATS_INCARNATION = "incarnation"   # its event stream's incarnation
STATS_BLOCK_SIZE = "block_size"     # its page size, tokens


def request_of(pending: PendingRequest | None) -> ReplicaRequest | None:
    """The :class:`ReplicaRequest` among a pending request's arguments, if any."""
    if pending is None:
        return None
    for arg in pending.args:
        if isinstance(arg, ReplicaRequest):
            return arg
    return None


@dataclass
class _Placed:
    slot: int
    queued_tokens: int


class PrefixCacheRouter(RequestRouter):
    """Ranks replicas by the router's cost (see the module docstring).

    ``request_router_kwargs`` (passed to :meth:`initialize_state`) are the router's
    flags: ``balance_abs_tokens``, ``balance_rel``, ``decode_weight``, ``approx_ttl_s``,
    ``max_pages``, and ``subscribe`` (``False``: no KV events, approximate entries only).
    """

    def initialize_state(self, balance_abs_tokens: int = DEFAULT_BALANCE_ABS_TOKENS,
                         balance_rel: float = DEFAULT_BALANCE_REL,
                         decode_weight: int = DEFAULT_DECODE_WEIGHT,
                         approx_ttl_s: float = DEFAULT_APPROX_TTL_S,
                         max_pages: int = DEFAULT_MAX_PAGES, subscribe: bool = True,
                         **kwargs: Any) -> None:
        if kwargs:
            raise ValueError(f"request_router_kwargs: unknown {', '.join(sorted(kwargs))}")
        self.policy = Policy(balance_abs_tokens, balance_rel, decode_weight)
        self.index = PageIndex(max_pages, approx_ttl_s)
        self.subscribe = subscribe
        self.lock = threading.Lock()  # event subscribers apply from their own threads
        self.slots: dict[str, int] = {}          # replica id -> index slot (never reused)
        self.loads: dict[int, ReplicaLoad] = {}  # slot -> router-side load
        self.subscribers: dict[int, EventSubscriber] = {}
        self.block_size: dict[int, int] = {}
        self._hits: dict[str, dict[int, int]] = {}  # internal request id -> slot -> hit
        self._placed: dict[str, _Placed] = {}

    # -- replicas ----------------------------------------------------------------------
    def _slot(self, replica_id: ReplicaID) -> int:
        key = replica_id.unique_id
        slot = self.slots.get(key)
        if slot is None:
            slot = self.slots[key] = len(self.slots)
            self.loads[slot] = ReplicaLoad()
        return slot

    def _watch(self, replica: RunningReplica) -> int:
        """The replica's slot; subscribes to its KV events once its stats name them."""
        slot = self._slot(replica.replica_id)
        if not self.subscribe or slot in self.subscribers:
            return slot
        stats = replica.routing_stats or {}
        endpoint = stats.get(STATS_EVENTS)
        if not endpoint:
            return slot
        self.block_size[slot] = int(stats.get(STATS_BLOCK_SIZE) or 0)

        def apply(kind: str, hashes: list[bytes]) -> None:
            with self.lock:
                self.index.apply(slot, kind, hashes)

        sub = EventSubscriber(endpoint, stats.get(STATS_REPLAY), apply)
        self.subscribers[slot] = sub
        sub.start()
        log.info("replica %s: KV events from %s", replica.replica_id.unique_id, endpoint)
        return slot

    def _forget(self, key: str) -> None:
        slot = self.slots.get(key)
        if slot is None:
            return
        with self.lock:
            self.index.clear(slot)
        sub = self.subscribers.pop(slot, None)
        if sub is not None:
            sub.close(timeout=0.0)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        gone = set(self.slots) - {r.replica_id.unique_id for r in replicas}
        for key in gone:
            self._forget(key)
        super().update_replicas(replicas)
        for r in replicas:
            self._watch(r)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        self._forget(replica_id.unique_id)
        super().on_replica_actor_died(replica_id)

    # -- routing -----------------------------------------------------------------------
    def predicted_hits(self, request: ReplicaRequest, slots: Sequence[int], now: float
                       ) -> dict[int, int]:
        """Predicted cached tokens of ``request`` on each of ``slots`` (the last prompt
        token is always computed, so at most ``prompt_tokens - 1`` rounded down to
        pages)."""
        bs = max(self.block_size.values(), default=0) or 16
        limit = max(0, (request.prompt_tokens - 1) // bs)
        with self.lock:
            pages = self.index.match(request.page_hashes[:limit], slots, now)
        return {s: n * bs for s, n in pages.items()}

    def rank(self, request: ReplicaRequest | None, slots: list[int], now: float
             ) -> tuple[list[int], dict[int, int]]:
        """``slots`` best first, and the predicted hit on each."""
        loads = [self.loads[s] for s in slots]
        if request is None or not request.page_hashes and request.prompt_tokens == 0:
            order = sorted(range(len(slots)), key=lambda i: self.policy.load(loads[i]))
            return [slots[i] for i in order], {}
        hit_by_slot = self.predicted_hits(request, slots, now)
        hits = {i: hit_by_slot.get(s, 0) for i, s in enumerate(slots)}
        decision = self.policy.choose(request.prompt_tokens, hits, loads, now)

        def cost(i: int) -> tuple[int, int]:
            load = self.policy.load(loads[i])
            return (request.prompt_tokens - hits[i] + load, load)

        rest = sorted((i for i in range(len(slots))
                       if decision is None or i != decision.replica), key=cost)
        first = [] if decision is None else [decision.replica]
        return [slots[i] for i in first + rest], hit_by_slot

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None
                              ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        by_slot = {self._watch(r): r for r in candidate_replicas}
        request = request_of(pending_request)
        now = time.monotonic()
        order, hits = self.rank(request, list(by_slot), now)
        if pending_request is not None and request is not None:
            rid = pending_request.metadata.internal_request_id
            self._hits[rid] = hits
            # Ray may route a burst's requests before any of them is sent: the first
            # choice is counted at once (load and approximate entries), and moved to
            # the replica Ray sends it to, if another (on_request_routed)
            self._reserve(rid, request, order[0], hits.get(order[0], 0), now)
        return [[by_slot[s]] for s in order]

    def _reserve(self, rid: str, request: ReplicaRequest, slot: int, hit: int,
                 now: float) -> None:
        self._release(rid)
        queued = max(0, request.prompt_tokens - hit)
        load = self.loads[slot]
        load.queued_tokens += queued
        load.running += 1
        self._placed[rid] = _Placed(slot, queued)
        with self.lock:
            self.index.approximate(slot, request.page_hashes, now)

    def _release(self, rid: str) -> None:
        placed = self._placed.pop(rid, None)
        if placed is not None:
            load = self.loads[placed.slot]
            load.queued_tokens -= placed.queued_tokens
            load.running -= 1

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID,
                          result: Any) -> None:
        request = request_of(pending_request)
        if request is None:
            return
        rid = pending_request.metadata.internal_request_id
        slot = self._slot(replica_id)
        hit = self._hits.pop(rid, {}).get(slot, 0)
        placed = self._placed.get(rid)
        if placed is None or placed.slot != slot:
            self._reserve(rid, request, slot, hit, time.monotonic())
        request.predicted = Prediction(replica_id.unique_id, hit,
                                       "balance" if hit == 0 else "cache")

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        self._hits.pop(internal_request_id, None)
        self._release(internal_request_id)
