"""Continuous batching with chunked prefill, prefix-cache hits, followers and preemption.

Each :meth:`Scheduler.schedule` call plans one model step under a token budget
(``max_num_batched_tokens``):

1. Running requests, in admission order. A request in prefill first takes any pages
   published since it last looked (:meth:`KVCacheManager.take_hits`): that is how a
   follower takes a leader's pages one by one, as soon as each publishes. If its next
   page is in flight, owned by another running request, it waits this step (it is a
   *follower*); otherwise it computes a chunk (chunk boundaries may fall inside pages).
   Decoding requests compute one token. When the pool runs dry, the most recently
   admitted request is preempted (recompute: its pages are freed, published ones stay
   cached, and it goes back to the waiting queue).
2. Waiting requests are admitted while budget, ``max_num_seqs`` and pages allow (and
   the cache's KV connector does not keep them waiting for another replica's pages;
   on admission it continues their hit beyond the pool: ``cache/connector.py``), in
   cache-aware order: a request counts as having arrived up to
   ``cache_aware_window_s`` seconds earlier in proportion to the share of its prompt
   that is cached or in flight. A cold request is passed only by requests that arrived
   within that window after it, so no request waits without bound (aging).

Each request's view of the cache (its hit pages, how many of them are cached-free, and
who computes the page after them) is :meth:`KVCacheManager.probe`, whose match is
memoised on the page table until the table or the index changes: a step in which the
index did not change re-matches no waiting request.

Why followers cannot deadlock: a request registers pages as in flight only in a step
that computes them, and a request holding a partial page of its own never waits. So an
owner is never itself waiting, and every wait ends when the owner's step completes, or
when the owner is preempted or aborted (its registrations are withdrawn and a follower
takes over by computing the page itself).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from prefixcache.cache.manager import KVCacheManager
from prefixcache.config import EngineConfig
from prefixcache.engine.request import Request, RequestStatus


@dataclass
class ScheduledSeq:
    """A request's part of the step: ``num_tokens`` new tokens from
    ``num_computed_tokens`` on; ``samples`` when the last of them yields the next token."""

    request: Request
    num_tokens: int
    samples: bool


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)


class Scheduler:
    """Plans model steps. Owns the waiting and running queues; requests' pages are
    managed through ``cache``."""

    def __init__(self, config: EngineConfig, cache: KVCacheManager,
                 clock: Callable[[], float] = time.perf_counter):
        self.config = config
        self.cache = cache
        self.clock = clock
        self.waiting: list[Request] = []
        self.running: dict[str, Request] = {}  # by request id, in admission order
        self._admit_counter = 0
        self.num_preemptions = 0
        # what lies beyond the pool (cache/connector.py), given to the manager at
        # construction: loads at admission, and the wait for another replica's pages
        self.connector = cache.connector

    # -- queue operations ------------------------------------------------------------
    def add(self, req: Request) -> None:
        """Queue a new request (it gets an empty page table, so its hashes are ready
        for cache-aware ordering)."""
        self._new_page_table(req)
        req.status = RequestStatus.WAITING
        self.waiting.append(req)

    def fork(self, parent: Request, child: Request) -> list[tuple[int, int]]:
        """Queue ``child``, a parallel sample of ``parent`` whose prefill just completed
        (``engine/sample_group.py``), with a page table forked from the parent's
        (:meth:`KVCacheManager.fork`): it runs from the next step on, admitted after
        every running request (the first preemption victim). Returns the page pairs
        the caller copies (source, destination). Without pages for the fork, or with
        ``max_num_seqs`` requests running, it waits at the head of the queue instead and
        recomputes its partial page from the cache when admitted (no pairs then)."""
        self._new_page_table(child)
        copies = None
        if len(self.running) < self.config.max_num_seqs:
            copies = self.cache.fork(parent.table, child.table)
        if copies is None:
            child.status = RequestStatus.WAITING
            self.waiting.insert(0, child)
            return []
        child.status = RequestStatus.RUNNING
        self.running[child.request_id] = child
        self._admit_counter += 1
        child.admit_seq = self._admit_counter
        if child.metrics.first_scheduled_time is None:
            child.metrics.first_scheduled_time = self.clock()
        return copies

    def _new_page_table(self, req: Request) -> None:
        req.page_table = self.cache.new_page_table(
            req.request_id, req.all_token_ids, tenant=req.tenant, cache_salt=req.cache_salt,
            extra_keys=req.extra_keys, read_cache=req.read_cache)

    def remove(self, req: Request) -> None:
        """Take a request out of the queues and release its pages (finish, abort, error)."""
        if self.running.pop(req.request_id, None) is None and req in self.waiting:
            self.waiting.remove(req)
        if req.page_table is not None:
            self.cache.free(req.page_table)
            req.page_table = None

    def preempt(self, req: Request) -> None:
        """Preempt by recompute: free the pages, go back to the waiting queue."""
        del self.running[req.request_id]
        self.cache.free(req.table)
        req.num_preemptions += 1
        req.freeze_cached()  # what it read from the cache is fixed at first admission
        self.num_preemptions += 1
        self._new_page_table(req)
        req.status = RequestStatus.WAITING
        self.waiting.insert(0, req)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    # -- planning ----------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        for req in list(self.running.values()):
            if req.status != RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            n = self._tokens_to_schedule(req, budget)
            if n == 0:
                continue
            if not self._allocate_or_preempt(req, n, out):
                continue
            out.scheduled.append(self._planned(req, n))
            budget -= n
        if not out.preempted:
            self._admit(out, budget)
        return out

    def _planned(self, req: Request, n: int) -> ScheduledSeq:
        pt = req.table
        return ScheduledSeq(req, n, pt.num_computed_tokens + n == len(req.all_token_ids))

    def _tokens_to_schedule(self, req: Request, budget: int) -> int:
        """Tokens ``req`` computes this step: 0 while it follows a running leader or
        when the budget is spent (a follower still takes newly published pages)."""
        remaining = req.num_tokens_to_compute
        if remaining > 1:
            self._take_cached(req)
            if self._leader_running(req):
                return 0
            remaining = req.num_tokens_to_compute
        return min(remaining, budget)

    def _take_cached(self, req: Request) -> None:
        """Take the pages published since the request last looked (the first call also
        marks the admission)."""
        pt = req.table
        if not self.cache.probe(pt).hit_pages and pt.admitted:
            return
        self.cache.take_hits(pt)

    def _leader_running(self, req: Request) -> bool:
        """Whether the page after the request's hits is computed by a running request."""
        return self.cache.probe(req.table).next_owner in self.running

    def _allocate_or_preempt(self, req: Request, n: int, out: SchedulerOutput) -> bool:
        """Allocate pages for ``n`` tokens, preempting the most recently admitted
        running requests (possibly ``req`` itself) until they fit."""
        scheduled: set[int] | None = None  # built only when a preemption is needed
        while not self.cache.allocate(req.table, n):
            if scheduled is None:
                scheduled = {id(s.request) for s in out.scheduled}
            victims = [r for r in self.running.values() if id(r) not in scheduled]
            victim = max(victims, key=lambda r: r.admit_seq)
            self.preempt(victim)
            out.preempted.append(victim)
            if victim is req:
                return False
        return True

    def _admit(self, out: SchedulerOutput, budget: int) -> None:
        """Admit waiting requests in :meth:`_waiting_order`. A request whose next page is
        in flight is admitted as a follower even when the token budget is spent: it
        computes nothing this step, but takes the leader's pages as they publish."""
        if len(self.running) >= self.config.max_num_seqs:
            return
        for req in self._waiting_order():
            if len(self.running) >= self.config.max_num_seqs:
                return
            pt = req.table
            probe = self.cache.probe(pt)
            follows = probe.next_owner in self.running
            if budget <= 0 and not follows:
                continue
            if not follows and self.connector.should_wait(pt):
                continue  # another replica computes its cold prefix: stay waiting
            hit = len(probe.hit_pages) * self.cache.block_size
            n = min(len(req.all_token_ids) - hit, budget)
            pages = -(-(hit + n) // self.cache.block_size) - len(probe.hit_pages)
            # new pages, plus the hit pages that are cached-free now (a hit takes them off
            # the LRU)
            if not follows and not self.cache.can_allocate(pages + probe.num_cached_free):
                return  # keep FCFS order under memory pressure: nobody jumps the queue
            self._take_cached(req)
            self.waiting.remove(req)
            self.running[req.request_id] = req
            req.status = RequestStatus.RUNNING
            self._admit_counter += 1
            req.admit_seq = self._admit_counter
            if req.metrics.first_scheduled_time is None:
                req.metrics.first_scheduled_time = self.clock()
            if follows:  # the page after its hits is computed by a running request
                continue
            self.connector.load(pt)  # continue the hit beyond the pool
            n = min(req.num_tokens_to_compute, budget)
            if n <= 0 or not self.cache.allocate(pt, n):
                # Cannot compute now after all: undo the admission, keep its place.
                del self.running[req.request_id]
                self.cache.free(pt)
                self._new_page_table(req)
                req.status = RequestStatus.WAITING
                self.waiting.insert(0, req)
                return
            out.scheduled.append(self._planned(req, n))
            budget -= n

    def _waiting_order(self) -> list[Request]:
        """FCFS, or cache-aware with aging when ``cache_aware_window_s > 0``."""
        window = self.config.cache_aware_window_s
        if window <= 0 or not self.cache.enable_prefix_caching or len(self.waiting) < 2:
            return list(self.waiting)

        def key(req: Request) -> float:
            share = self._cached_share(req)
            return req.arrival_time - window * share

        return sorted(self.waiting, key=key)

    def _cached_share(self, req: Request) -> float:
        """Share of the request's tokens that it would read from the cache now (or
        follow, if its next page is in flight), in [0, 1]."""
        pt = req.table
        n = len(req.all_token_ids)
        probe = self.cache.probe(pt)
        hit = len(probe.hit_pages) * self.cache.block_size
        if hit + pt.num_computed_tokens < n - 1 and probe.next_owner is not None:
            return 1.0
        return hit / n
