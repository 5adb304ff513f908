"""Sessions on the cache core under random operations (hypothesis): calls that extend or
fork a session's transcript, aborted calls, unrelated floods, closes and clock jumps, with
DESIGN's page invariants and the sessions' own bookkeeping checked after every step."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixcache.cache import KVCacheManager, PageState
from prefixcache.cache.invariants import check_invariants
from prefixcache.cache.sessions import SessionRegistry
from tests.cache.cache_helpers import admit, serve

BS = 4
POOL = 24
TENANTS = ("a", "b")
SIDS = ("s0", "s1", "s2")

OPS = st.lists(st.tuples(
    st.sampled_from(["call", "abort", "flood", "close", "tick"]),
    st.sampled_from(TENANTS), st.sampled_from(SIDS), st.integers(0, 12), st.integers(1, 9)),
    min_size=1, max_size=40)


def check(mgr: KVCacheManager, reg: SessionRegistry) -> None:
    check_invariants(mgr)
    held: set[int] = set()
    for pin in mgr.pins.pins.values():
        held.update(p for p in pin.pages if p is not None)
        for p in pin.pages:
            assert p is None or mgr.pool.state[p] in (PageState.PUBLISHED,
                                                       PageState.CACHED_FREE)
    assert {p for p in range(POOL) if mgr.pool.pinned[p]} == held
    assert mgr.pins.num_pinned_pages == len(held) <= mgr.pins.cap_pages
    for (tenant, sid), s in reg.sessions.items():
        assert s.running >= 0
        if s.pin is not None and mgr.pins.pins.get(s.pin.key) is s.pin:
            assert s.pin.session == sid and s.pin.tenant == tenant


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPS)
def test_random_session_operations_keep_every_invariant(ops):
    now = [1000.0]
    mgr = KVCacheManager(POOL, BS, model_id="m", max_pinned_fraction=0.5,
                         clock=lambda: now[0])
    reg = SessionRegistry(mgr, ttl_s=10.0)
    transcripts: dict[tuple, list[int]] = {}
    n = 0
    for op, tenant, sid, keep, extra in ops:
        n += 1
        key = (tenant, sid)
        if op in ("call", "abort"):
            base = transcripts.get(key, [hash(key) % 997 + 1000])
            base = base[:max(1, len(base) - keep)]  # an edit: keep a prefix
            toks = (base + [7000 + n * 10 + i for i in range(extra)])[:POOL * BS // 3]
            reg.enter(tenant, sid)
            pt = admit(mgr, f"r{n}", toks, tenant=tenant)
            if not mgr.allocate(pt, len(toks) - pt.num_computed_tokens):
                reg.leave(tenant, sid)
                mgr.free(pt)
            else:
                mgr.commit(pt, len(toks) - pt.num_computed_tokens)
                reg.renew(tenant, sid, pt.num_cached_tokens)
                check(mgr, reg)
                if op == "call":
                    reg.keep(tenant, sid, pt)
                    transcripts[key] = toks
                else:
                    reg.leave(tenant, sid)
                mgr.free(pt)
        elif op == "flood":
            serve(mgr, f"f{n}", [50000 + n * 100 + i for i in range(extra * BS)],
                  tenant=tenant)
        elif op == "close":
            reg.close(tenant, sid)
        else:
            now[0] += 3.0 * extra
        check(mgr, reg)
    for tenant in TENANTS:
        for sid in SIDS:
            reg.close(tenant, sid)
    check(mgr, reg)
    assert reg.sessions == {} and mgr.pins.num_pinned_pages == 0
    assert reg.stats()["sessions_live"] == 0 and mgr.stats()["pages_live"] == 0
