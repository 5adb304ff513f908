"""Helpers shared by the cache-core tests: drive a request the way the engine does."""
from __future__ import annotations

import hashlib

from prefixcache.cache import KVCacheManager, PageTable
from prefixcache.cache.invariants import check_invariants


def weak_hash(data: bytes) -> bytes:
    """A test-only 8-bit page hash: collisions every ~256 pages."""
    return hashlib.blake2b(data, digest_size=1).digest()


def admit(mgr: KVCacheManager, rid: str, tokens: list[int], **ns) -> PageTable:
    """Create the page table and take the admission hit."""
    pt = mgr.new_page_table(rid, list(tokens), **ns)
    mgr.take_hits(pt)
    return pt


def prefill(mgr: KVCacheManager, pt: PageTable, chunk: int | None = None) -> None:
    """Compute the rest of the known tokens (in chunks), committing each step, and
    count the query once at the end, like the engine at prefill completion."""
    while pt.num_computed_tokens < len(pt.token_ids):
        n = len(pt.token_ids) - pt.num_computed_tokens
        if chunk is not None:
            n = min(n, chunk)
        assert mgr.allocate(pt, n), "pool exhausted"
        mgr.commit(pt, n)
    mgr.record_query(len(pt.token_ids), pt.num_cached_tokens, pt.num_inflight_hit_tokens)


def serve(mgr: KVCacheManager, rid: str, tokens: list[int], *, keep: bool = False,
          **ns) -> PageTable:
    """Admit, prefill and (unless ``keep``) finish one request; checks invariants."""
    pt = admit(mgr, rid, tokens, **ns)
    prefill(mgr, pt)
    check_invariants(mgr)
    if not keep:
        mgr.free(pt)
        check_invariants(mgr)
    return pt


def cached_tokens(mgr: KVCacheManager, rid: str, tokens: list[int], **ns) -> int:
    return serve(mgr, rid, tokens, **ns).num_cached_tokens


def find_colliding_page(mgr: KVCacheManager, page: list[int], *, prefix: list[int] = (),
                        start: int = 50_000, **ns) -> list[int]:
    """A page of the same length whose hash (after ``prefix``) equals ``page``'s, found by
    varying its first token. Only practical with :func:`weak_hash`."""
    bs = mgr.block_size
    n = len(prefix) // bs

    def h(tokens: list[int]) -> bytes:
        probe = mgr.new_page_table("__probe__", list(prefix) + tokens, **ns)
        try:
            return mgr.page_hashes(probe, n + 1)[n]
        finally:
            mgr.free(probe)

    target = h(list(page))
    for x in range(start, start + 100_000):
        cand = [x] + list(page[1:])
        if cand != list(page) and h(cand) == target:
            return cand
    raise AssertionError("no collision found")


class Clock:
    """A settable clock for pins and sessions (seconds): tests move ``t`` instead of
    waiting."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t
