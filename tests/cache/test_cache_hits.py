"""The memoised hit: ``probe``, ``match_pages`` and ``peek_hits`` redo no lookups until
the index or the table changes."""
from __future__ import annotations

from cache_helpers import serve

from prefixcache.cache import KVCacheManager

BS = 4
PROMPT = list(range(100, 113))  # 3 full pages + 1 token


def count_lookups(mgr: KVCacheManager) -> list[int]:
    calls = [0]
    real = mgr.index.lookup

    def lookup(h, key):
        calls[0] += 1
        return real(h, key)

    mgr.index.lookup = lookup  # type: ignore[method-assign]
    return calls


def test_probe_is_memoised_until_the_index_or_the_table_changes():
    mgr = KVCacheManager(16, BS)
    a = serve(mgr, "A", PROMPT, keep=True)
    published = a.pages[:3]
    mgr.free(a)                                    # 3 pages published, cached-free
    calls = count_lookups(mgr)
    b = mgr.new_page_table("B", list(PROMPT))
    p = mgr.probe(b)
    assert (p.hit_pages, p.num_cached_free, p.next_owner) == (tuple(published), 3, None)
    assert calls[0] == 3
    assert mgr.peek_hits(b) == 12 and mgr.match_pages(b) == published
    assert mgr.probe(b) == p and calls[0] == 3     # asked again: no lookups
    serve(mgr, "C", list(range(500, 509)))         # publishes 2 pages: index changed
    calls[0] = 0
    assert mgr.probe(b) == p and calls[0] == 3     # recomputed once, same answer
    assert mgr.take_hits(b) == 12 and calls[0] == 3    # take uses the memo
    assert mgr.probe(b) == ((), 0, None) and calls[0] == 3  # at its limit: no lookup


def test_probe_counts_held_pages_and_names_the_next_owner():
    mgr = KVCacheManager(16, BS)
    a = serve(mgr, "A", PROMPT[:9], keep=True)     # 2 pages published, still held
    lead = mgr.new_page_table("L", list(PROMPT))
    assert mgr.take_hits(lead) == 8 and mgr.allocate(lead, 5)   # page 2 in flight
    f = mgr.new_page_table("F", list(PROMPT))
    p = mgr.probe(f)
    assert p == (tuple(a.pages[:2]), 0, "L")
    assert mgr.peek_inflight(f, 8) and mgr.next_page_owner(f) is None
    mgr.commit(lead, 5)                            # page 2 published: index changed
    assert mgr.probe(f) == (tuple(lead.pages[:3]), 0, None)
