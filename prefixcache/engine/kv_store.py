"""The shared KV tier (L4, Redis) seen from the engine: publication-time stores and
cross-replica followers.

Lookups and loads go through :class:`~.kv_tiers.KVTiers` like the host and disk tiers
(the chain match continues L1 -> L2 -> L3 -> L4, and what verifies is loaded into the
pool). This module adds what only a shared tier needs:

- **Stores after local publication.** After every step the pages the step published
  (the cache's event log, :mod:`prefixcache.cache.events`) are copied out of the pool and
  queued for the store worker, which writes them with ``SET NX``: other replicas can hit
  them at once, not only after this pool evicts them. Every page not stored is counted by
  reason (``redis_tier_store_dropped_<reason>``, pages): ``queue_full`` (the bounded queue
  dropped it), ``refused`` and ``unavailable`` (:meth:`RedisTier.put`), ``error`` (the
  store raised).
- **Cold stampede across replicas.** Before admitting a request whose prefix is cold
  here and in Redis, the replica takes the compute lock of its first cold page
  (``SET lock:... NX PX``). If another replica holds it, the request waits (it stays in
  the waiting queue; nothing blocks the engine) until the leader's pages are in Redis
  up to the request's hit limit, the lock is gone, or ``kv_store_lock_wait_s`` (capped
  by the estimated time to recompute) passed; then it is admitted and loads what is
  there, computing the rest itself.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from prefixcache.cache.events import CacheEvent, PageStored
from prefixcache.cache.manager import KVCacheManager
from prefixcache.cache.page_table import PageTable
from prefixcache.cache.tiers.format import PageGroup
from prefixcache.cache.tiers.redis_store import RedisTier
from prefixcache.cache.tiers.store_queue import StoreQueue
from prefixcache.config import EngineConfig
from prefixcache.engine.tier_estimates import LoadEstimator
from prefixcache.model.kv_pool import KVPool

POLL_S = 0.01  # a waiting follower asks Redis at most this often


@dataclass
class _Wait:
    page_hash: bytes
    deadline: float
    next_poll: float = 0.0


class SharedKVStore:
    """Publication-time stores into, and cross-replica followers of, one Redis tier.

    Args:
        config: reads ``kv_store_lock_wait_s`` and ``tier_store_queue``.
        kv: the KV pool (pages are exported from it).
        remote: the :class:`RedisTier` (also one of ``KVTiers``' tiers, for loads).
        estimates: the engine's load/recompute estimates (caps a follower's wait).
        clock: monotonic seconds (tests).

    The pool's manager (hashes, hit limits, the index) is given by :meth:`bind`, when it
    is built with the engine's connector (``engine/kv_connector.py``).
    """

    cache: KVCacheManager  # set by bind()

    def __init__(self, config: EngineConfig, kv: KVPool, remote: RedisTier,
                 estimates: LoadEstimator, clock: Callable[[], float] = time.monotonic):
        self.kv, self.remote, self.estimates = kv, remote, estimates
        self.clock = clock
        self.lock_wait_s = config.kv_store_lock_wait_s
        self.queue = StoreQueue([remote], config.tier_store_queue)
        self.dtype_name = kv.dtype_name
        self._waits: dict[str, _Wait] = {}
        self._decided: set[str] = set()
        self.lock_waits = 0        # requests that waited for another replica
        self.lock_wait_hits = 0    # ... and found the leader's pages
        self.lock_timeouts = 0     # ... and gave up (deadline or lock gone, pages absent)
        self.published_pages = 0

    def bind(self, cache: KVCacheManager) -> None:
        self.cache = cache

    # -- stores ------------------------------------------------------------------------
    def publish(self, events: list[CacheEvent]) -> None:
        """Queue the pages these events say were published (still in the pool)."""
        index = self.cache.index
        pages, hashes, tokens = [], [], []
        for ev in events:
            if not isinstance(ev, PageStored):
                continue
            ids = ev.token_ids
            bs = ev.block_size
            for j, h in enumerate(ev.page_hashes):
                page = index.get(h)
                if page is None or self.remote.contains(h):
                    continue
                pages.append(page)
                hashes.append(h)
                tokens.append(tuple(ids[j * bs:(j + 1) * bs]))
        if not pages:
            return
        data = self.kv.export_pages(pages)
        payload = data.cpu().contiguous().view(torch.uint8).numpy().tobytes()
        self.queue.submit(PageGroup(self.remote.fingerprint, tuple(hashes), tuple(tokens),
                                    self.dtype_name, self.kv.page_shape, payload))
        self.published_pages += len(pages)

    # -- cross-replica followers -------------------------------------------------------
    def should_wait(self, pt: PageTable) -> bool:
        """Before admission: whether ``pt``'s request keeps waiting for another replica
        computing its cold prefix (see the module docstring)."""
        rid = pt.request_id
        if self.lock_wait_s <= 0 or rid in self._decided or self.remote.degraded:
            return False
        now = self.clock()
        wait = self._waits.get(rid)
        if wait is None:
            return self._first_look(pt, now)
        if now < wait.next_poll:
            return True
        wait.next_poll = now + POLL_S
        limit = self.cache.hit_limit_pages(pt)
        hit = len(self.cache.probe(pt).hit_pages)
        hashes = self.cache.page_hashes(pt, limit)
        have = self.remote.lookup_run(hashes[hit:limit])
        if hit + have >= limit or not self.remote.locked(wait.page_hash) \
                or now >= wait.deadline:
            if hashes.index(wait.page_hash) < hit + have:
                self.lock_wait_hits += 1
            else:
                self.lock_timeouts += 1
            self._done(rid)
            return False
        return True

    def _first_look(self, pt: PageTable, now: float) -> bool:
        rid = pt.request_id
        self._decided.add(rid)
        limit = self.cache.hit_limit_pages(pt)
        hit = len(self.cache.probe(pt).hit_pages)
        if hit >= limit:
            return False
        hashes = self.cache.page_hashes(pt, limit)
        cold = hit + self.remote.lookup_run(hashes[hit:limit])
        if cold >= limit:
            return False
        tokens = (limit - cold) * self.cache.block_size
        per_token = self.estimates.prefill_s_per_token
        # the leader's lock outlives its estimated compute (slack for a busy step); a
        # follower never waits longer than computing the pages itself would take
        recompute = self.lock_wait_s if per_token is None else min(
            self.lock_wait_s, per_token * tokens)
        lock_ttl = self.lock_wait_s if per_token is None else min(
            self.lock_wait_s, 1.5 * per_token * tokens + 0.05)
        got = self.remote.try_lock(hashes[cold], int(lock_ttl * 1000))
        if got is not False:
            return False  # this replica leads (or Redis is away): compute it
        self._decided.discard(rid)
        self._waits[rid] = _Wait(hashes[cold], now + recompute, now + POLL_S)
        self.lock_waits += 1
        return True

    def _done(self, rid: str) -> None:
        self._waits.pop(rid, None)
        self._decided.add(rid)

    def forget(self, request_id: str) -> None:
        """The request finished or was aborted."""
        self._waits.pop(request_id, None)
        self._decided.discard(request_id)

    @property
    def waiting(self) -> int:
        """Requests now waiting for another replica."""
        return len(self._waits)

    # -- introspection -----------------------------------------------------------------
    def stats(self) -> dict[str, int | float]:
        d: dict[str, int | float] = {f"redis_tier_{k}": v
                                     for k, v in self.remote.extra_stats().items()}
        d.update(redis_tier_lock_waits=self.lock_waits,
                 redis_tier_lock_wait_hits=self.lock_wait_hits,
                 redis_tier_lock_timeouts=self.lock_timeouts,
                 redis_tier_published_pages=self.published_pages,
                 redis_tier_store_dropped_queue_full=self.queue.dropped_pages,
                 redis_tier_store_dropped_error=self.queue.error_pages)
        return d

    def close(self) -> None:
        self.queue.close()
