"""The KV cache manager: longest-prefix hits, allocation, publication, freeing.

It ties together the page pool (:mod:`.page_pool`), the page hashes (:mod:`.hashing`),
the prefix index (:mod:`.prefix_index`) and the in-flight registry (:mod:`.inflight`).
It knows nothing of torch or HTTP; the engine calls it around each model step:

1. :meth:`KVCacheManager.new_page_table` when a request is admitted (or re-admitted
   after preemption),
2. :meth:`~KVCacheManager.take_hits` to read the longest published prefix (also while
   following an in-flight leader: pages are taken as soon as they publish),
   :meth:`~KVCacheManager.next_page_owner` / :meth:`~KVCacheManager.wait` to follow,
3. :meth:`~KVCacheManager.allocate` before a step that writes new tokens,
4. :meth:`~KVCacheManager.commit` after the step completed without error (publishes full
   pages and wakes followers), or :meth:`~KVCacheManager.fail_step` if it failed,
5. :meth:`~KVCacheManager.free` on finish, abort or preemption.

Policy (DESIGN.md): only full pages are shared; a hit never covers the last token
(``num_cached_tokens <= len(token_ids) - 1``, whole-page reuse, so a 32-token prompt
sent twice reuses 16); pages filled during decode are published too.

Reset (:meth:`~KVCacheManager.reset`) drops only unreferenced (cached-free) pages;
pages held by running requests stay published and are unaffected.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from prefixcache.cache.hashing import HashFn, PageHasher, tokens_to_bytes
from prefixcache.cache.inflight import InflightRegistry, Wakeup
from prefixcache.cache.page_pool import PagePool, PageState
from prefixcache.cache.page_table import PageTable
from prefixcache.cache.prefix_index import PrefixIndex
from prefixcache.cache.stats import CacheCounters


@dataclass
class ResetReport:
    """What :meth:`KVCacheManager.reset` did, in pages."""

    dropped_pages: int
    kept_in_use_pages: int


class KVCacheManager:
    """Manages a pool of ``num_pages`` KV pages of ``block_size`` tokens.

    Args:
        num_pages: pool size in pages.
        block_size: tokens per page (default 16).
        enable_prefix_caching: if ``False`` nothing is indexed, hit or followed.
        model_id: part of every hash chain root.
        root_seed: hash root seed (see :mod:`.hashing`).
        hash_fn: override the page hash function (tests force collisions with it).
        shuffle_seed: start the free queue in random order (non-contiguous pages).

    Raises:
        ValueError: ``block_size < 1`` or ``num_pages < 1``.
    """

    def __init__(self, num_pages: int, block_size: int = 16, *,
                 enable_prefix_caching: bool = True, model_id: str = "",
                 root_seed: bytes | str | None = None, hash_fn: HashFn | None = None,
                 shuffle_seed: int | None = None):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = PagePool(num_pages, shuffle_seed=shuffle_seed)
        self.index = PrefixIndex(num_pages)
        self.inflight = InflightRegistry()
        self.hasher = PageHasher(model_id, root_seed, hash_fn)
        self.counters = CacheCounters()
        self.tables: dict[str, PageTable] = {}
        self._wakeups: list[Wakeup] = []
        self.generation = 0  # bumped when the index or in-flight set may change (memo key)

    # -- page tables -------------------------------------------------------------------
    def new_page_table(self, request_id: str, token_ids: list[int], *,
                       tenant: str | None = None, cache_salt: str | None = None,
                       extra_keys: tuple = (), mm_hashes: tuple = (),
                       read_cache: bool = True) -> PageTable:
        """Create (and track) an empty page table for a request.

        Args:
            token_ids: the request's token list; it may grow (decode) but never shrink.
            tenant, cache_salt: the namespace; different namespaces never share a page.
            extra_keys: e.g. ``("adapter", adapter_id, version)``; part of every page key.
            mm_hashes: ``(offset, length, content_hash)`` per multimodal input.
            read_cache: ``False`` to compute every position (still publishes).

        Raises:
            ValueError: ``request_id`` already has a live page table.
        """
        if request_id in self.tables:
            raise ValueError(f"request_id {request_id!r} already has a page table")
        root_key = self.hasher.root_key(tenant, cache_salt)
        pt = PageTable(
            request_id=request_id, token_ids=token_ids, root_key=root_key,
            root_hash=self.hasher.root_hash(root_key),
            page_extra=self.hasher.extra_bytes(tuple(extra_keys)),
            mm_hashes=tuple(mm_hashes), extra_keys=tuple(extra_keys),
            read_cache=read_cache, tenant=tenant)
        self.tables[request_id] = pt
        return pt

    def hit_limit_pages(self, pt: PageTable) -> int:
        """Most leading pages a table may read from the cache: the last token is always
        computed, so ``(len(token_ids) - 1) // block_size``."""
        if not (self.enable_prefix_caching and pt.read_cache) or not pt.token_ids:
            return 0
        return (len(pt.token_ids) - 1) // self.block_size

    # -- hashing -----------------------------------------------------------------------
    def _page_extra(self, pt: PageTable, i: int) -> bytes:
        if not pt.mm_hashes:
            return pt.page_extra
        lo, hi = i * self.block_size, (i + 1) * self.block_size
        # Each overlapping input with its placement relative to the page start.
        mm = tuple((off - lo, n, h) for off, n, h in pt.mm_hashes if off < hi and off + n > lo)
        if not mm:
            return pt.page_extra
        return self.hasher.extra_bytes(pt.extra_keys, mm)

    def _page_tokens(self, pt: PageTable, i: int) -> bytes:
        bs = self.block_size
        return tokens_to_bytes(pt.token_ids[i * bs:(i + 1) * bs])

    def page_hashes(self, pt: PageTable, num_pages: int) -> list[bytes]:
        """Hashes of the first ``num_pages`` full pages (computed once, then reused).

        Raises:
            ValueError: the tokens of those pages are not known yet.
        """
        bs = self.block_size
        if num_pages * bs > len(pt.token_ids):
            raise ValueError(f"page {num_pages - 1} is not full yet")
        hashes = pt.hashes
        if len(hashes) < num_pages:
            i = len(hashes)
            prev = hashes[-1] if hashes else pt.root_hash
            # One conversion for the whole range, then 4 * bs bytes per page.
            raw = tokens_to_bytes(pt.token_ids[i * bs:num_pages * bs])
            step = 4 * bs
            if pt.mm_hashes:
                page_hash = self.hasher.page_hash
                for j in range(num_pages - i):
                    prev = page_hash(prev, raw[j * step:(j + 1) * step],
                                     self._page_extra(pt, i + j))
                    hashes.append(prev)
            else:  # hot path: same framing as PageHasher.page_hash, inlined
                hash_fn, extra = self.hasher.hash_fn, pt.page_extra
                head = b"P" + struct.pack(">II", len(prev), step)
                for j in range(num_pages - i):
                    prev = hash_fn(head + prev + raw[j * step:(j + 1) * step] + extra)
                    hashes.append(prev)
        return hashes

    def _key(self, pt: PageTable, i: int, raw: bytes | None = None) -> tuple | None:
        parent = pt.root_key if i == 0 else pt.chain_refs[i - 1]
        if parent is None:
            return None
        return (parent, raw if raw is not None else self._page_tokens(pt, i),
                self._page_extra(pt, i))

    # -- hits and following ---------------------------------------------------------------
    def match_pages(self, pt: PageTable) -> list[int]:
        """Published pages that continue the table, longest run first to last (no side
        effects). Empty unless the table ends on a page boundary of finalized pages."""
        bs = self.block_size
        i = len(pt.pages)
        limit = self.hit_limit_pages(pt)
        if i >= limit or pt.num_computed_tokens != i * bs or len(pt.chain_refs) != i:
            return []
        parent = pt.root_key if i == 0 else pt.chain_refs[i - 1]
        if parent is None or (pt.dup_positions and not self._dups_alive(pt)):
            return []  # no chain, or a dead one (only orphans could continue it)
        hashes = self.page_hashes(pt, limit)
        raw = tokens_to_bytes(pt.token_ids[i * bs:limit * bs])
        step = 4 * bs
        lookup, entry_id = self.index.lookup, self.index.entry_id
        extra = None if pt.mm_hashes else pt.page_extra  # the same for every page
        pages: list[int] = []
        for j in range(limit - i):
            page = lookup(hashes[i + j], (parent, raw[j * step:(j + 1) * step],
                                          extra if extra is not None
                                          else self._page_extra(pt, i + j)))
            if page is None:
                break
            pages.append(page)
            parent = entry_id[page]
        return pages

    def peek_hits(self, pt: PageTable) -> int:
        """Tokens :meth:`take_hits` would take now (no side effects)."""
        return len(self.match_pages(pt)) * self.block_size

    def take_hits(self, pt: PageTable) -> int:
        """Extend the table with the longest run of published pages that continue it.

        Only possible while the table ends on a page boundary (no partial page of its
        own). At the first call this is the admission hit; later calls take pages a
        leader published meanwhile (in-flight hits). Never more than
        :meth:`hit_limit_pages` pages in all.

        Returns:
            Tokens taken (a multiple of ``block_size``).
        """
        first = not pt.admitted
        pt.admitted = True
        pages = self.match_pages(pt)
        if not pages:
            return 0
        for page in pages:
            self.pool.incref(page)
            pt.pages.append(page)
            pt.chain_refs.append(self.index.entry_id[page])
        tokens = len(pages) * self.block_size
        pt.num_computed_tokens += tokens
        pt.num_cached_tokens += tokens
        if not first:
            pt.num_inflight_hit_tokens += tokens
        self.inflight.remove_waiter(pt.request_id)
        return tokens

    def next_page_owner(self, pt: PageTable, ahead: int = 0) -> str | None:
        """The request computing this table's next needed page (``ahead`` pages past
        its end), if another request is.

        ``None`` when that page is not in flight, is owned by this request, lies beyond
        the hit limit, or the table holds a partial page of its own.
        """
        i = len(pt.pages) + ahead
        if (i >= self.hit_limit_pages(pt) or pt.num_computed_tokens != len(pt.pages) * self.block_size
                or len(pt.chain_refs) != len(pt.pages)):
            return None
        owner = self.inflight.owner(self.page_hashes(pt, i + 1)[i])
        return owner if owner != pt.request_id else None

    def peek_inflight(self, pt: PageTable, hit_tokens: int) -> bool:
        """Whether the page after a hit of ``hit_tokens`` (from :meth:`peek_hits`) is
        in flight, owned by another request."""
        return self.next_page_owner(pt, hit_tokens // self.block_size) is not None

    def wait(self, pt: PageTable) -> bool:
        """Attach the table as a waiter on its next in-flight page; a :class:`Wakeup`
        arrives (see :meth:`drain_wakeups`) when it publishes or its owner withdraws.
        Returns ``False`` if the next page is not in flight by another request."""
        if self.next_page_owner(pt) is None:
            return False
        return self.inflight.add_waiter(pt.hashes[len(pt.pages)], pt.request_id)

    def drain_wakeups(self) -> list[Wakeup]:
        """Wakeups since the last call, in order."""
        out, self._wakeups = self._wakeups, []
        return out

    # -- allocation ----------------------------------------------------------------------
    def pages_needed(self, pt: PageTable, num_new_tokens: int) -> int:
        """New pages :meth:`allocate` would take for ``num_new_tokens`` more tokens."""
        total = pt.num_computed_tokens + num_new_tokens
        return max(0, -(-total // self.block_size) - len(pt.pages))

    def can_allocate(self, num_pages: int) -> bool:
        return num_pages <= self.pool.num_allocatable

    def allocate(self, pt: PageTable, num_new_tokens: int) -> bool:
        """Make room for ``num_new_tokens`` tokens after ``num_computed_tokens``.

        New pages are private (``PENDING``); under pressure the least recently used
        cached-free pages are evicted (their hashes leave the index). Full prompt pages
        in the range are registered as in flight, owned by this request. A table that
        was waiting (:meth:`wait`) stops waiting: it computes now.

        Returns:
            ``False`` (and changes nothing) if the pool cannot supply the pages.

        Raises:
            ValueError: the range goes past the request's known tokens.
        """
        bs = self.block_size
        end = pt.num_computed_tokens + num_new_tokens
        if end > len(pt.token_ids):
            raise ValueError(f"cannot schedule {num_new_tokens} tokens: only "
                             f"{len(pt.token_ids) - pt.num_computed_tokens} are known")
        need = self.pages_needed(pt, num_new_tokens)
        if need > self.pool.num_allocatable:
            return False
        for _ in range(need):
            pt.pages.append(self._alloc_page())
        # A table that computes is no longer following: it must not be woken about
        # the pages it now computes (or publishes) itself.
        self.inflight.remove_waiter(pt.request_id)
        if self.enable_prefix_caching and None not in pt.chain_refs[-1:]:
            first = max(pt.num_computed_tokens // bs, len(pt.chain_refs))
            last = min(-(-end // bs), len(pt.token_ids) // bs)
            if last > first:
                hashes = self.page_hashes(pt, last)
                for i in range(first, last):
                    if hashes[i] not in self.index:
                        self.inflight.register(hashes[i], pt.request_id)
                        self.generation += 1
        return True

    def _alloc_page(self) -> int:
        page = self.pool.pop_free()
        if page is None:
            page = self.pool.pop_lru()
            assert page is not None  # caller checked num_allocatable
            self.index.remove(page)
            self.counters.evictions += 1
            self.generation += 1
        return page

    # -- after a step ------------------------------------------------------------------
    def commit(self, pt: PageTable, num_new_tokens: int) -> int:
        """The step that wrote ``num_new_tokens`` tokens completed without error.

        Advances ``num_computed_tokens`` and publishes every page that is now full
        (prompt or decode pages), waking requests that wait on them.

        Returns:
            Pages published by this call.

        Raises:
            ValueError: more tokens than were allocated or are known.
        """
        bs = self.block_size
        end = pt.num_computed_tokens + num_new_tokens
        if end > len(pt.pages) * bs or end > len(pt.token_ids):
            raise ValueError(f"commit of {num_new_tokens} tokens past the allocated pages")
        pt.num_computed_tokens = end
        full = end // bs
        if len(pt.chain_refs) >= full:
            return 0
        published = 0
        self.generation += 1
        if not self.enable_prefix_caching:
            pt.chain_refs.extend([None] * (full - len(pt.chain_refs)))
            return 0
        hashes = self.page_hashes(pt, full)
        index, pool, inflight = self.index, self.pool, self.inflight
        first = len(pt.chain_refs)
        raw = tokens_to_bytes(pt.token_ids[first * bs:full * bs])
        step = 4 * bs
        # A chain through another request's identical page dies when that page leaves
        # the index: what follows can no longer be found, so publishing it would only
        # plant orphans (which could displace reachable entries). Stop publishing.
        chain_alive = not pt.dup_positions or self._dups_alive(pt)
        while len(pt.chain_refs) < full:
            i = len(pt.chain_refs)
            h, page = hashes[i], pt.pages[i]
            key = (self._key(pt, i, raw[(i - first) * step:(i - first + 1) * step])
                   if chain_alive else None)
            ref = None
            if key is not None:
                existing = index.get(h)
                if existing is not None and index.page_key[existing] == key:
                    ref = index.entry_id[existing]  # identical page already published
                    pt.dup_positions.append(i)
                    self.counters.duplicate_pages += 1
                else:
                    if existing is not None and self._supersede(existing):
                        existing = None
                    if existing is None:
                        ref = index.insert(h, page, key)
                        pool.mark_published(page)
                        self.counters.published_pages += 1
                        published += 1
            pt.chain_refs.append(ref)
            if ref is not None:
                # Published (by us or, identically, by someone else): whoever registered
                # it as in flight, its waiters can read it now.
                self._wakeups.extend(inflight.complete(h))
            elif inflight.owner(h) == pt.request_id:
                # Computed but not publishable: waiters must take over, not wait.
                self._wakeups.extend(inflight.withdraw_page(h))
        return published

    def _dups_alive(self, pt: PageTable) -> bool:
        page_of_entry = self.index.page_of_entry
        return all(page_of_entry(pt.chain_refs[j]) is not None for j in pt.dup_positions)

    def _supersede(self, existing: int) -> bool:
        """A page with the committing (reachable) key's hash but another key holds the
        index slot. Drop it if it is cached-free (a stale orphan, or a true hash
        collision nobody holds), or if it is an unreachable orphan held only by its
        publisher (which keeps the page, now private). Returns whether the slot is free.
        A live reachable page (a true collision) is never touched."""
        index, pool = self.index, self.pool
        state = pool.state[existing]
        if state == PageState.CACHED_FREE:
            index.remove(existing)
            pool.unpublish_cached(existing)
            return True
        if (pool.ref_count[existing] == 1
                and not index.reachable(index.page_key[existing][0])):
            index.remove(existing)
            pool.unpublish_live(existing)
            return True
        return False

    def fail_step(self, pt: PageTable) -> None:
        """The step that was to write this table's new tokens failed or was cancelled:
        nothing is published, and its in-flight registrations are withdrawn (waiters
        are woken to take over). The table stays as it was before the step."""
        self.generation += 1
        self._wakeups.extend(self.inflight.withdraw(pt.request_id))

    def free(self, pt: PageTable) -> None:
        """Release all of a table's pages (finish, abort, preemption, error).

        Pages are released last first, so a prefix's tail is evicted before its head.
        Withdraws its in-flight registrations and its waiting. Idempotent.
        """
        if self.tables.get(pt.request_id) is not pt:
            return
        self.generation += 1
        self._wakeups.extend(self.inflight.withdraw(pt.request_id))
        self.inflight.remove_waiter(pt.request_id)
        for page in reversed(pt.pages):
            self.pool.decref(page)
        pt.pages = []
        pt.chain_refs = []
        pt.dup_positions = []
        del self.tables[pt.request_id]

    # -- accounting ----------------------------------------------------------------------
    def record_query(self, num_prompt_tokens: int, num_cached_tokens: int,
                     num_inflight_hit_tokens: int = 0) -> None:
        """Count one request's prefix-cache query, once, when its ``num_cached_tokens``
        is final (its first prefill completed). All in tokens."""
        c = self.counters
        c.prefix_cache_queries += num_prompt_tokens
        c.prefix_cache_hits += num_cached_tokens
        c.inflight_hits += num_inflight_hit_tokens

    def stats(self) -> dict[str, int | float]:
        """Counters (tokens / pages, monotonic) and gauges (pages, current)."""
        d: dict[str, int | float] = self.counters.as_dict()
        d.update(
            hit_rate=self.counters.hit_rate,
            hash_collisions=self.index.collisions,
            pages_total=self.pool.num_pages,
            pages_free=self.pool.num_free,
            pages_cached=self.pool.num_cached,
            pages_live=self.pool.num_live,
            pages_indexed=len(self.index),
            pages_inflight=len(self.inflight),
        )
        return d

    # -- reset ---------------------------------------------------------------------------
    def reset(self) -> ResetReport:
        """Clear the prefix cache without touching running requests.

        Drops every cached-free page (unreferenced, published) from the index and
        returns it to the free queue. Pages held by running requests stay published:
        their KV is complete and correct, and they become evictable when released.
        """
        dropped = 0
        self.generation += 1
        for page in self.pool.cached_pages():
            self.index.remove(page)
            self.pool.unpublish_cached(page)
            dropped += 1
        self.counters.reset_dropped_pages += dropped
        kept = sum(1 for p in range(self.pool.num_pages)
                   if self.pool.state[p] == PageState.PUBLISHED)
        return ResetReport(dropped_pages=dropped, kept_in_use_pages=kept)
