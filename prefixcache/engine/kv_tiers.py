"""The KV tiers under the page pool, seen from the engine: write-back, lookup and load.

DESIGN: "one KV-connector object, passed in at construction, is the one place that moves
page contents between the pool and the tiers": this module is the tiers' part of that
connector (``engine/kv_connector.py``), which calls it. It copies pages out of the pool
(:meth:`KVPool.export_pages`) when the cache core evicts them (write-back) or when they are
hit (selective write-through), and queues them for the asynchronous store worker; at a
request's admission it continues the chain match past the pool into host RAM (L2) and then
disk (L3), loads the verified pages into freshly allocated pool pages
(:meth:`KVPool.import_pages`) and publishes them as if the step had computed them. Keys are
the pool's own chain hashes (rooted in model fingerprint, tenant and ``cache_salt``), so a
tier can never serve one namespace's pages to another. Loaded pages count in
``cached_tokens`` and in the hit counters; nothing stays pinned in a tier after a load.

TTL pins cross the tiers (``cache/pins.py``): with write-back, a pinned page evicted from
the pool is demoted, not lapsed; the tiers are told which page hashes are pinned, keep
them evicted last within ``max_pinned_fraction`` of their budgets, and a load puts the
pages back under their pin in the pool. Unpin and expiry release the tiers' pins too.

===================  ==============================================================
region of a prompt   where it comes from
===================  ==============================================================
L1 hit               ``KVCacheManager.take_hits`` (pages shared, ref counted)
tier hit             pages loaded here, published under the request's own pages
rest                 computed by the model step (the last token always is)
===================  ==============================================================
"""
from __future__ import annotations

import logging
import struct
import time

import torch

from prefixcache.cache.allocation import EvictedPage
from prefixcache.cache.identity import tier_fingerprint
from prefixcache.cache.manager import KVCacheManager
from prefixcache.cache.page_table import PageTable
from prefixcache.cache.tiers.base import Tier
from prefixcache.cache.tiers.disk_tier import DiskTier
from prefixcache.cache.tiers.format import PageGroup, PageLayout
from prefixcache.cache.tiers.host_tier import HostTier
from prefixcache.cache.tiers.store_queue import StoreQueue
from prefixcache.config import GIB, EngineConfig
from prefixcache.engine.tier_estimates import LoadEstimator
from prefixcache.model.kv_pool import KVPool

log = logging.getLogger(__name__)

GROUP_PAGES = 32  # most pages per stored group (one disk file)


def check_tier_budgets(config: EngineConfig, page_bytes: int) -> None:
    """Refuse a tier budget that cannot hold one KV page (``page_bytes``): every store
    would be dropped. Raises ValueError naming the field and the minimum."""
    budgets = [("host_cache_bytes", config.host_cache_bytes)] if config.host_cache_bytes \
        else []
    if config.disk_cache_dir:
        budgets.append(("disk_cache_bytes", config.disk_cache_bytes))
    for name, value in budgets:
        if value < page_bytes:
            raise ValueError(f"{name}: {value} bytes is less than one KV page of this model; "
                             f"the minimum is {page_bytes} bytes ({page_bytes / GIB:.6f} GiB)")


class KVTiers:
    """Host-RAM and disk tiers of one engine (and the lookups of a shared one): the
    tiers' part of the engine's KV connector (``engine/kv_connector.py``), which calls
    it; bound to the pool's manager by :meth:`bind` when that manager is built.

    Args:
        config: reads ``host_cache_bytes``, ``disk_cache_dir``, ``disk_cache_bytes``,
            ``tier_write_policy``, ``tier_load_policy``, ``tier_store_queue``,
            ``max_pinned_fraction`` (the pin cap of each tier).
        kv: the KV pool whose pages are copied.
        fingerprint: :func:`~prefixcache.cache.identity.model_fingerprint`.

    Raises:
        ValueError: ``host_cache_bytes`` (when not 0) or ``disk_cache_bytes`` (with a disk
            tier) smaller than one KV page of this model; ``disk_cache_dir`` not a
            writable directory (:class:`DiskTier`).
        OSError: the disk directory cannot be created."""

    cache: KVCacheManager  # set by bind()

    def __init__(self, config: EngineConfig, kv: KVPool, fingerprint: str):
        self.kv = kv
        self.fingerprint = tier_fingerprint(fingerprint)
        self.tiers: list[Tier] = []
        check_tier_budgets(config, kv.page_nbytes)
        if config.host_cache_bytes:
            self.tiers.append(HostTier(config.host_cache_bytes, config.max_pinned_fraction))
        if config.disk_cache_dir:
            self.tiers.append(DiskTier(config.disk_cache_dir, config.disk_cache_bytes,
                                       self.fingerprint,
                                       max_pinned_fraction=config.max_pinned_fraction,
                                       layout=self.layout))
        self.local: list[HostTier | DiskTier] = list(self.tiers)  # type: ignore[arg-type]
        self.queue = StoreQueue(self.tiers, config.tier_store_queue)
        self.estimates = LoadEstimator(config.tier_load_policy)
        self.write_through = config.tier_write_policy == "write_through"
        # evicted pages are written back (a shared tier stores at publication instead),
        # and pins are demoted with them rather than lapsing
        self.writes_back = bool(self.local) and not self.write_through
        self.hit_tokens = {t.name: 0 for t in self.tiers}
        self.remote: list[Tier] = []  # shared tiers (L4): asked by lookup_run, not contains
        self.token_mismatches = 0
        self.export_bytes = 0
        self.closed = False
        for tier in self.local:
            log.info("KV tier %s: on, %s", tier.name, _describe(tier))

    def bind(self, cache: KVCacheManager) -> None:
        """The pool's manager (hashes, hit limits, allocation, pins)."""
        self.cache = cache

    def set_pinned(self, hashes: list[bytes], pinned: bool) -> None:
        """Page hashes that became pinned (or not): the tiers keep them last."""
        for tier in self.local:
            tier.set_pinned(hashes, pinned)

    def holds(self, page_hash: bytes) -> bool:
        """Whether a local tier holds the page, or its store is still queued."""
        return bool(self.queue.pending) or any(t.contains(page_hash) for t in self.local)

    def tier_of(self, hashes: list[bytes]) -> str | None:
        """The lowest tier holding any of ``hashes`` (each taken from the fastest tier
        holding it), or ``None`` when one is in no tier and no store is pending."""
        worst = -1
        for h in hashes:
            i = next((i for i, t in enumerate(self.local) if t.contains(h)), None)
            if i is None:
                if not self.queue.pending:
                    return None
                i = 0  # its store is queued: it goes to every local tier
            worst = max(worst, i)
        return self.local[worst].name if worst >= 0 else None

    def add_remote(self, tier: Tier) -> None:
        """Append a shared tier (L4) to the lookup chain. It is not in the write-back
        queue: ``engine/kv_store.py`` stores into it at publication."""
        log.info("KV tier %s: on (shared store)", tier.name)
        self.tiers.append(tier)
        self.remote.append(tier)
        self.hit_tokens[tier.name] = 0

    @property
    def dtype_name(self) -> str:
        return self.kv.dtype_name

    @property
    def layout(self) -> PageLayout:
        """The pool's page layout: what every tier entry read back must hold."""
        return PageLayout(self.dtype_name, tuple(self.kv.page_shape))

    # -- stores ------------------------------------------------------------------------
    def write_back(self, evicted: list[EvictedPage]) -> None:
        """Copy evicted pages not yet held by every tier out of the pool and queue them,
        pinned pages in groups of their own (a disk file is pinned as a whole). Expired
        pins are collected first, so the tiers are not told to keep them."""
        pins = self.cache.pins
        pins.expire()
        todo = [e for e in evicted if not all(t.contains(e.page_hash) for t in self.local)]
        for pinned in (True, False):
            part_all = [e for e in todo if pins.demotion.is_pinned(e.page_hash) == pinned]
            for i in range(0, len(part_all), GROUP_PAGES):
                part = part_all[i:i + GROUP_PAGES]
                self._submit([e.page for e in part], [e.page_hash for e in part],
                             [_tokens(e.token_bytes) for e in part])

    def write_back_cached(self) -> int:
        """Queue every cached-free page of the pool not yet in every tier (at shutdown, so
        a restart hits). Returns the groups queued."""
        index = self.cache.index
        todo = []
        for page in self.cache.pool.cached_pages():
            h, key = index.page_hash[page], index.page_key[page]
            if h is not None and key is not None:
                todo.append(EvictedPage(page, h, key[1]))
        before = self.queue.submitted
        self.write_back(todo)
        return self.queue.submitted - before

    def write_through_hits(self, pt: PageTable, first: int, last: int) -> None:
        """Selective write-through: queue pages ``[first, last)`` of ``pt`` (just hit)."""
        bs = self.cache.block_size
        hashes = self.cache.page_hashes(pt, last)
        todo = [i for i in range(first, last)
                if not all(t.contains(hashes[i]) for t in self.local)]
        if todo:
            self._submit([pt.pages[i] for i in todo], [hashes[i] for i in todo],
                         [tuple(pt.token_ids[i * bs:(i + 1) * bs]) for i in todo])

    def _submit(self, pages: list[int], hashes: list[bytes],
                tokens: list[tuple[int, ...]]) -> None:
        data = self.kv.export_pages(pages)
        payload = data.cpu().contiguous().view(torch.uint8).numpy().tobytes()
        self.export_bytes += len(payload)
        self.queue.submit(PageGroup(self.fingerprint, tuple(hashes), tuple(tokens),
                                    self.dtype_name, self.kv.page_shape, payload))

    # -- loads -------------------------------------------------------------------------
    def extend_hit(self, pt: PageTable) -> int:
        """At admission, after the pool's hits were taken: write the hit pages through
        (``write_through`` policy), then :meth:`load`. Returns the tokens loaded."""
        if self.write_through and pt.pages:
            self.write_through_hits(pt, 0, len(pt.pages))
        return self.load(pt)

    def load(self, pt: PageTable) -> int:
        """Continue ``pt``'s hit into the tiers; load and publish what verifies. Call at
        admission, after the pool's hits were taken. Returns the tokens loaded (whole
        pages; never the page of the last token)."""
        cache, bs = self.cache, self.cache.block_size
        first, limit = len(pt.pages), cache.hit_limit_pages(pt)
        if (first >= limit or pt.num_computed_tokens != first * bs
                or len(pt.chain_refs) != first or None in pt.chain_refs[-1:]):
            return 0
        hashes = cache.page_hashes(pt, limit)
        # Read and verify first: allocating evicts pool pages, whose write-back may
        # evict from the tiers the very pages planned here.
        fetched: list[tuple[Tier, torch.Tensor, float]] = []
        at = first
        for tier, run in self._worth_loading(self._plan(hashes[first:limit])):
            t0 = time.perf_counter()
            data = self._fetch(pt, tier, run, at)
            if data is None:
                break
            fetched.append((tier, data, time.perf_counter() - t0))
            at += data.shape[0]
            if data.shape[0] < len(run):  # what verified up to a missing or bad page
                break
        total = at - first
        if not total or not cache.allocate(pt, total * bs):
            return 0
        at = first
        for tier, data, seconds in fetched:
            n = data.shape[0]
            t0 = time.perf_counter()
            self.kv.import_pages(pt.pages[at:at + n], data)
            self.estimates.observe_load(tier.name, seconds + time.perf_counter() - t0, n)
            self.hit_tokens[tier.name] += n * bs
            at += n
        cache.commit(pt, total * bs)
        cache.repin(pt.pages[first:first + total])  # demoted pins return to the pool
        pt.num_cached_tokens += total * bs
        return total * bs

    def _plan(self, hashes: list[bytes]) -> list[tuple[Tier, list[bytes]]]:
        """The leading pages any tier holds, each from the fastest tier holding it, as
        runs of consecutive pages from one tier (host RAM may hold a chain's tail while
        only the disk still holds its head). The local tiers answer ``contains`` from
        memory; where they stop, each shared tier is asked once for its run
        (``lookup_run``: one pipelined round trip)."""
        plan: list[tuple[Tier, list[bytes]]] = []
        i = 0
        for i, h in enumerate(hashes):  # noqa: B007 (i is the first page no local tier has)
            tier = next((t for t in self.local if t.contains(h)), None)
            if tier is None:
                break
            if plan and plan[-1][0] is tier:
                plan[-1][1].append(h)
            else:
                plan.append((tier, [h]))
        else:
            return plan
        for remote in self.remote:
            n = remote.lookup_run(hashes[i:])
            if n:
                plan.append((remote, list(hashes[i:i + n])))
                break
        return plan

    def _worth_loading(self, plan: list[tuple[Tier, list[bytes]]]
                       ) -> list[tuple[Tier, list[bytes]]]:
        out = []
        for tier, run in plan:
            if not self.estimates.should_load(tier.name, len(run),
                                              len(run) * self.cache.block_size):
                break
            out.append((tier, run))
        return out

    def _fetch(self, pt: PageTable, tier: Tier, run: list[bytes], at: int
               ) -> torch.Tensor | None:
        """The leading pages of ``run`` that ``tier`` holds and verifies (its own checks
        include the page hashes, the layout and ``pt``'s token ids), as a
        ``[n, *page_shape]`` CPU tensor for positions ``at..`` of ``pt``, ``n <= len(run)``;
        ``None`` when the first page is missing or fails."""
        bs = self.cache.block_size
        want = [tuple(pt.token_ids[(at + j) * bs:(at + j + 1) * bs]) for j in range(len(run))]
        group = tier.get(run, want)
        if group is None:
            return None
        n = group.num_pages
        # the tier checked these; a tier that did not is still never loaded from
        if group.hashes != tuple(run[:n]) or group.dtype != self.dtype_name \
                or group.page_shape != self.kv.page_shape:
            return None
        if group.token_ids != tuple(want[:n]):
            self.token_mismatches += 1
            return None
        data = torch.frombuffer(bytearray(group.payload), dtype=torch.uint8)
        return data.view(self.kv.dtype).view(n, *self.kv.page_shape)

    # -- introspection -----------------------------------------------------------------
    def flush(self) -> None:
        """Wait until every queued store completed (tests, benchmarks, shutdown)."""
        self.queue.flush()

    def stats(self) -> dict[str, int | float]:
        """Per-tier counters (``host_tier_*``, ``disk_tier_*``), the store queue and the
        load/recompute estimates."""
        d: dict[str, int | float] = {
            "host_tier_hit_tokens": self.hit_tokens.get("host", 0),
            "disk_tier_hit_tokens": self.hit_tokens.get("disk", 0),
            **({"redis_tier_hit_tokens": self.hit_tokens["redis"]}
               if "redis" in self.hit_tokens else {}),
            "tier_store_dropped": self.queue.dropped,
            "tier_store_pending": self.queue.pending,
            "tier_store_errors": self.queue.errors,
            "tier_token_mismatches": self.token_mismatches,
            "tier_export_bytes": self.export_bytes}
        for tier in self.tiers:
            for k, v in tier.stats().as_dict().items():
                d[f"{tier.name}_tier_{k}"] = v
        d.update(self.estimates.as_dict())
        return d

    def close(self) -> None:
        """Write the pool's cached pages down, finish queued stores, stop the worker; logs
        per tier the pages written at shutdown and the pages it holds."""
        if self.closed:
            return
        self.closed = True
        before = {t.name: t.stats() for t in self.tiers}
        self.write_back_cached()
        self.queue.close()
        for t in self.tiers:
            now, was = t.stats(), before[t.name]
            log.info("KV tier %s: %d pages written at shutdown (%d store failures), %d pages "
                     "held", t.name, (now.store_bytes - was.store_bytes) // self.kv.page_nbytes,
                     now.failures - was.failures, now.pages)
            t.close()


def _describe(tier: Tier) -> str:
    """A tier's budget and, for disk, what it indexed at start."""
    budget = getattr(tier, "capacity_bytes", None)
    text = f"budget {budget / 2**30:.2f} GiB" if budget else "no budget"
    if isinstance(tier, DiskTier):
        text += (f", {tier.directory}: {tier.stats().pages} pages indexed from "
                 f"{tier.rebuilt_files} files")
    return text


def _tokens(token_bytes: bytes) -> tuple[int, ...]:
    return struct.unpack(f"<{len(token_bytes) // 4}I", token_bytes)
