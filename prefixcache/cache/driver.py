"""Drive requests through the cache core the way the engine does, without a model.

One request at a time (or a window of ``concurrency`` running requests), in order::

    pt = mgr.new_page_table(request_id, prompt, tenant=..., cache_salt=...)
    hit = mgr.take_hits(pt)              # whole pages, never the last prompt token
    (free the oldest running requests until the rest fits)
    mgr.allocate(pt, rest); mgr.commit(pt, rest)     # prefill publishes full pages
    mgr.record_query(len(prompt), hit)
    (response tokens appended, allocated and committed: decode pages are published)
    mgr.free(pt)                         # pages become cached-free (LRU-evictable)

The engine writes KV for every generated token but the last (the last sampled token is
never fed back), so ``len(response) - 1`` response tokens are committed. A request
larger than the whole pool cannot run: it counts as a query with 0 cached tokens and
``fits=False``. With an :class:`~.expiry.IdleExpiry` and timestamps, pages idle longer
than the TTL are dropped before each request. Used by ``analyze`` and ``bench-cache``.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from prefixcache.cache.expiry import IdleExpiry
from prefixcache.cache.manager import KVCacheManager
from prefixcache.cache.page_table import PageTable


@dataclass
class Served:
    """One request's outcome. Tokens; ``table`` is its page table (freed once it left
    the running window; its ``hashes`` stay readable)."""

    table: PageTable
    cached_tokens: int
    response_tokens_published: int = 0
    fits: bool = True


class ReplayDriver:
    """Runs requests through ``mgr`` in order.

    Args:
        concurrency: requests kept running (holding their pages) at once (>= 1).
        expiry: optional TTL expiry over the same manager.

    Raises:
        ValueError: ``concurrency < 1``, or ``expiry`` is over another manager.
    """

    def __init__(self, mgr: KVCacheManager, concurrency: int = 1,
                 expiry: IdleExpiry | None = None):
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        if expiry is not None and expiry.mgr is not mgr:
            raise ValueError("expiry must be over the driver's manager")
        self.mgr, self.concurrency, self.expiry = mgr, concurrency, expiry
        self._running: deque[tuple[PageTable, float | None]] = deque()

    def serve(self, request_id: str, prompt: list[int], *, tenant: str | None = None,
              cache_salt: str | None = None, extra_keys: tuple = (),
              response: list[int] | tuple = (), now: float | None = None) -> Served:
        """Admit, prefill and (after ``response``, if longer than one token) decode one
        request; it stays running until ``concurrency`` newer ones ran. ``extra_keys``
        enter every page key (see :meth:`KVCacheManager.new_page_table`).

        Raises:
            ValueError: ``request_id`` is still running.
        """
        mgr = self.mgr
        if self.expiry is not None and now is not None:
            self.expiry.expire(now)
        pt = mgr.new_page_table(request_id, list(prompt), tenant=tenant,
                                cache_salt=cache_salt, extra_keys=extra_keys)
        hit = mgr.take_hits(pt)
        rest = len(prompt) - pt.num_computed_tokens
        # Make room like a scheduler would: finish the oldest running requests first.
        while self._running and mgr.pages_needed(pt, rest) > mgr.pool.num_allocatable:
            self._finish_oldest()
        if not mgr.allocate(pt, rest):
            mgr.free(pt)
            mgr.record_query(len(prompt), 0)
            return Served(pt, 0, 0, fits=False)
        mgr.commit(pt, rest)
        mgr.record_query(len(prompt), hit)
        published = 0
        if len(response) > 1:
            pt.token_ids.extend(response)
            if mgr.allocate(pt, len(response) - 1):
                mgr.commit(pt, len(response) - 1)
                published = len(response) - 1
        self._running.append((pt, now))
        while len(self._running) >= self.concurrency:
            self._finish_oldest()
        return Served(pt, hit, published)

    def finish(self) -> None:
        """Finish every running request (their pages become cached-free)."""
        while self._running:
            self._finish_oldest()

    def _finish_oldest(self) -> None:
        pt, now = self._running.popleft()
        if self.expiry is not None and now is not None:
            self.expiry.touch(pt, now)
        self.mgr.free(pt)
