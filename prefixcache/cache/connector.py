"""The KV connector: the one object that moves page contents between the pool and
anything beyond it (host RAM, disk, a shared store).

DESIGN: "one KV-connector object, passed in at construction, is the one place that moves
page contents between the pool and the tiers". The cache manager takes it at
construction and binds it (:meth:`KVConnector.bind`); the scheduler and the engine reach
it as ``cache.connector``. Nothing else is wired in after construction.

==========================  ========================================================
who calls                   what the connector does
==========================  ========================================================
scheduler, admission        :meth:`~KVConnector.should_wait` (another replica computes
                            the cold prefix: keep waiting), then
                            :meth:`~KVConnector.load` (continue the pool's hit into
                            the tiers, load and publish what verifies)
allocation evicts pages     :meth:`~KVConnector.on_evict` (write-back), only when
                            :attr:`~KVConnector.writes_back`
pins change                 :meth:`~KVConnector.on_pinned` (the tiers keep pinned
                            pages last), only when :attr:`~KVConnector.writes_back`
engine, after a step        :meth:`~KVConnector.on_published` (store at publication),
                            only when :attr:`~KVConnector.records_events`
engine, request finished    :meth:`~KVConnector.on_finished`
engine, shutdown            :meth:`~KVConnector.close` (write the cached pages down,
                            finish the queued stores); :meth:`~KVConnector.flush`
==========================  ========================================================

:class:`NullConnector` is the connector of an engine without tiers: every call does
nothing, and the lookups it answered are counted (``kv_connector_null_lookups``). The
engine's tiers are ``engine/kv_connector.py``. This module knows no torch and no tier.
"""
from __future__ import annotations

from typing import Any

from prefixcache.cache.allocation import EvictedPage
from prefixcache.cache.events import CacheEvent
from prefixcache.cache.page_table import PageTable


class KVConnector:
    """What the cache manager, the scheduler and the engine ask of what lies beyond the
    pool. The defaults do nothing; a connector overrides what it serves.

    Attributes:
        writes_back: evicted pages go to :meth:`on_evict`, and a pinned page evicted from
            the pool is demoted with its pins rather than lapsing them
            (``cache/pin_demotion.py``). Read once, when the manager is built.
        records_events: the engine records the index's changes and hands them to
            :meth:`on_published` after each step. Read once, when the engine is built.
    """

    writes_back = False
    records_events = False

    def bind(self, cache: Any) -> None:
        """Called once by the :class:`~prefixcache.cache.manager.KVCacheManager` being
        built with this connector (``cache`` is that manager).

        Raises:
            ValueError: the connector is already bound to another manager.
        """

    # -- lookups and loads -------------------------------------------------------------
    def should_wait(self, pt: PageTable) -> bool:
        """Before admitting ``pt``'s request (not a follower of a running request):
        whether it stays waiting because another replica computes its cold prefix (the
        stampede lock). Polled at each step while it returns ``True``; the connector
        bounds the wait."""
        return False

    def load(self, pt: PageTable) -> int:
        """At admission, after the pool's hits were taken: continue ``pt``'s hit beyond
        the pool, load what verifies into newly allocated pages and publish them.
        Returns the tokens loaded (whole pages; never the page of the last token)."""
        return 0

    def tier_of(self, hashes: list[bytes]) -> str | None:
        """The lowest tier holding every one of ``hashes`` (``"host"``, ``"disk"``...),
        or ``None`` when one of them is nowhere beyond the pool."""
        return None

    # -- stores ------------------------------------------------------------------------
    def on_evict(self, evicted: list[EvictedPage]) -> None:
        """Pages an allocation evicts: their index entries are gone, their contents are
        intact until the caller's step runs. Must not call back into the manager."""

    def on_pinned(self, hashes: list[bytes], pinned: bool) -> None:
        """Page hashes that became pinned (their first live pin) or stopped being
        pinned (their last one gone)."""

    def on_published(self, events: list[CacheEvent]) -> None:
        """The index changes of the last step (pages published and removed), in order;
        published pages are still in the pool."""

    def on_finished(self, request_id: str) -> None:
        """The request finished or was aborted (its page table is freed)."""

    def observe_prefill(self, seconds: float, tokens: int) -> None:
        """A step that prefilled ``tokens`` tokens took ``seconds`` (the estimate a
        load is weighed against)."""

    # -- state and shutdown ------------------------------------------------------------
    @property
    def waiting(self) -> int:
        """Requests now kept waiting by :meth:`should_wait`."""
        return 0

    @property
    def closed(self) -> bool:
        return False

    def flush(self) -> None:
        """Wait until every queued store completed (tests, benchmarks)."""

    def close(self) -> None:
        """Write down what should outlive the process, finish the queued stores and stop
        the workers (idempotent). Afterwards every call does nothing: the engine serves
        from the pool alone, and :meth:`stats` stays readable."""

    def stats(self) -> dict[str, int | float]:
        """Counters and gauges, flat, for ``LLMEngine.stats()``."""
        return {}


class NullConnector(KVConnector):
    """No tier: nothing beyond the pool. Zero work; counts the lookups it answered
    (``kv_connector_null_lookups``), so a test can tell the tiers were never asked."""

    def __init__(self) -> None:
        self.lookups = 0

    def load(self, pt: PageTable) -> int:
        self.lookups += 1
        return 0

    def stats(self) -> dict[str, int | float]:
        return {"kv_connector_null_lookups": self.lookups}
