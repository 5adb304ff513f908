"""The cache state machine of :mod:`test_cache_stateful`, extended with TTL pins and
per-tenant quotas: pin / unpin / advance the clock / expire / list operations among the
requests' admit, allocate-under-pressure, commit, finish, abort, preempt and reset.

The model adds, independently of the library's queues:

- *owners*: the tenant of each page (set when a request takes it), so the usage of each
  tenant is the count of its non-free pages;
- *pins*: ``(tenant, prefix hash) -> pages, ttl, expiry, creation order``, with the cap
  (own oldest pins lapse, else refused), lazy expiry on a clock, refresh when a hit
  covers a pin's last page, and lapse when a pinned page is evicted or reset;
- the eviction order, recomputed by scanning the LRU list: a tenant at its quota takes
  its own oldest page (unpinned, then pinned); else the oldest unpinned page of a tenant
  over its quota, else the oldest unpinned page, then the same for pinned pages; an
  expired pin is collected before a pinned page is chosen.

After every step the library must agree: eviction victims, the order of
``pool.cached_pages()`` (unpinned, then pinned), pinned flags, usage per tenant, pins and
their expiry, counters, and ``check_invariants`` (which checks the pin cap).
"""
from __future__ import annotations

import os
from collections import Counter

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from prefixcache.cache import KVCacheManager
from prefixcache.cache.pins import PinCapError
from tests.cache.test_cache_stateful import BS, NAMESPACES, POOL, CacheMachine, Req

QUOTA = 0.5                 # every tenant: 4 of the 8 pages
QUOTAS = {"t1": 0.25}       # t1: 2 pages
MAX_PINNED = 0.5            # 4 pages


def limit(tenant) -> int:
    return max(1, int(QUOTAS.get(tenant, QUOTA) * POOL))


class PinQuotaMachine(CacheMachine):
    def __init__(self):
        super().__init__()
        self.now = 100.0
        self.mgr = KVCacheManager(POOL, BS, model_id="m", root_seed="test", shuffle_seed=7,
                                  max_pinned_fraction=MAX_PINNED, tenant_quota_fraction=QUOTA,
                                  tenant_quotas=QUOTAS, clock=lambda: self.now)
        self.owner: dict[int, object] = {}
        self.pins: dict[tuple, dict] = {}
        self.pin_seq = 0
        self.count = {"pins_created": 0, "pins_refused": 0, "pins_expired": 0,
                      "pins_evicted": 0, "pins_lapsed_for_cap": 0, "pins_unpinned": 0}

    # -- model: pins ---------------------------------------------------------------------
    def pinned_pages(self) -> Counter:
        return Counter(p for pin in self.pins.values() for p in set(pin["pages"]))

    def is_pinned(self, page: int) -> bool:
        return any(page in pin["pages"] for pin in self.pins.values())

    def add_pin(self, key, pages, ttl):
        before = self.pinned_pages()
        self.pins[key] = {"pages": tuple(pages), "ttl": ttl, "exp": self.now + ttl,
                          "seq": self.pin_seq}
        self.pin_seq += 1
        for p in pages:
            if not before[p] and p in self.lru:   # newly pinned, cached-free: moves
                self.lru.remove(p)
                self.lru.append(p)

    def drop_pin(self, key):
        pin = self.pins.pop(key)
        still = self.pinned_pages()
        for p in pin["pages"]:
            if not still[p] and p in self.lru:   # unpinned, cached-free: moves
                self.lru.remove(p)
                self.lru.append(p)

    def expire_model(self) -> int:
        gone = sorted((k for k, v in self.pins.items() if v["exp"] <= self.now),
                      key=lambda k: (self.pins[k]["exp"], self.pins[k]["seq"]))
        for k in gone:
            self.drop_pin(k)
        self.count["pins_expired"] += len(gone)
        return len(gone)

    # -- model: eviction policy (overrides) ----------------------------------------------
    def usage(self) -> Counter:
        return Counter(self.owner[p] for p in range(POOL) if p not in self.free)

    def _victim(self, tenant):
        usage, pinned = self.usage(), self.is_pinned

        def first(owners, pin):
            return next((p for p in self.lru if pinned(p) == pin
                         and (owners is None or self.owner[p] in owners)), None)

        if usage[tenant] >= limit(tenant):
            for pin in (False, True):
                v = first({tenant}, pin)
                if v is not None:
                    return v
        over = {t for t, u in usage.items() if u > limit(t)}
        for pin in (False, True):
            v = first(over, pin)
            if v is None:
                v = first(None, pin)
            if v is not None:
                return v
        raise AssertionError("no cached page to evict")

    def next_victim(self, r: Req) -> int:
        tenant = NAMESPACES[r.ns].get("tenant")
        v = self._victim(tenant)
        if self.is_pinned(v) and self.expire_model():
            v = self._victim(tenant)
        return v

    def claimed(self, page: int, r: Req) -> None:
        # evicted() runs after this for an evicted page; its pins see the old owner
        # only through is_pinned, which does not read owners.
        self.owner[page] = NAMESPACES[r.ns].get("tenant")

    def evicted(self, page: int) -> None:
        for k in sorted((k for k, v in self.pins.items() if page in v["pages"]),
                        key=lambda k: self.pins[k]["seq"]):
            self.drop_pin(k)
            self.count["pins_evicted"] += 1

    def cached_order(self) -> list[int]:
        return ([p for p in self.lru if not self.is_pinned(p)]
                + [p for p in self.lru if self.is_pinned(p)])

    def take(self, r: Req):
        start = len(r.pages)
        super().take(r)
        for page in r.pages[start:]:
            for k in [k for k, v in self.pins.items() if v["pages"][-1] == page]:
                if k not in self.pins:
                    continue
                if self.pins[k]["exp"] <= self.now:
                    self.expire_model()
                else:
                    pin = self.pins[k]
                    pin["exp"] = max(pin["exp"], self.now + pin["ttl"])

    # -- rules -----------------------------------------------------------------------------
    @precondition(lambda self: any(r.chain for r in self.live.values()))
    @rule(n=st.integers(0, 99), k=st.integers(1, 6), ttl=st.sampled_from([1.0, 5.0, 30.0]))
    def pin(self, n, k, ttl):
        r = self.pick(n, lambda r: bool(r.chain))
        k = min(k, len(r.chain))
        pages = []
        for e in r.chain[:k]:
            if e is None or not e.alive:
                break
            pages.append(e.page)
        tenant = NAMESPACES[r.ns].get("tenant")
        if not pages:
            with pytest.raises(ValueError):
                self.mgr.pin(r.pt, k, ttl)
            return
        key = (tenant, r.pt.hashes[len(pages) - 1])
        self.expire_model()
        if key in self.pins:
            got = self.mgr.pin(r.pt, k, ttl)
            pin = self.pins[key]
            pin["ttl"] = max(pin["ttl"], ttl)
            pin["exp"] = max(pin["exp"], self.now + ttl)
            assert got.expires_at == pin["exp"]
            return
        cap, want = int(MAX_PINNED * POOL), set(pages)
        held = set(self.pinned_pages())
        if len(held) + len(want - held) > cap:
            others = {p for (t, _), v in self.pins.items() if t != tenant for p in v["pages"]}
            if len(others) + len(want - others) > cap:
                with pytest.raises(PinCapError):
                    self.mgr.pin(r.pt, k, ttl)
                self.count["pins_refused"] += 1
                return
            own = sorted((kk for kk in self.pins if kk[0] == tenant),
                         key=lambda kk: self.pins[kk]["seq"])
            for kk in own:
                self.drop_pin(kk)
                self.count["pins_lapsed_for_cap"] += 1
                held = set(self.pinned_pages())
                if len(held) + len(want - held) <= cap:
                    break
        got = self.mgr.pin(r.pt, k, ttl)
        assert (got.tenant, got.prefix_hash, got.pages) == (key[0], key[1], tuple(pages))
        assert got.num_tokens == len(pages) * BS
        self.add_pin(key, pages, ttl)
        self.count["pins_created"] += 1

    @precondition(lambda self: self.pins)
    @rule(n=st.integers(0, 99), wrong_tenant=st.booleans())
    def unpin(self, n, wrong_tenant):
        key = sorted(self.pins, key=lambda k: self.pins[k]["seq"])[n % len(self.pins)]
        if wrong_tenant:  # another tenant never removes it
            other = "t1" if key[0] != "t1" else None
            assert self.mgr.pins.unpin(other, key[1]) is False
            return
        assert self.mgr.pins.unpin(*key) is True
        self.drop_pin(key)
        self.count["pins_unpinned"] += 1

    @rule(dt=st.sampled_from([0.5, 2.0, 10.0]))
    def advance_clock(self, dt):
        self.now += dt

    @rule(tenant=st.sampled_from([None, "t1"]))
    def list_pins(self, tenant):
        self.expire_model()
        got = [(p.tenant, p.prefix_hash) for p in self.mgr.pins.list(tenant)]
        want = sorted((k for k in self.pins if k[0] == tenant),
                      key=lambda k: self.pins[k]["seq"])
        assert got == want

    def reset(self, roll):
        dropped = set(self.lru) if not roll else set()
        super().reset(roll)
        for k in sorted((k for k, v in self.pins.items() if dropped & set(v["pages"])),
                        key=lambda k: self.pins[k]["seq"]):
            self.pins.pop(k)
            self.count["pins_evicted"] += 1

    # -- checks ------------------------------------------------------------------------------
    @invariant()
    def pins_and_usage_match_model(self):
        mgr, pool = self.mgr, self.mgr.pool
        assert {k: (v["pages"], v["exp"]) for k, v in self.pins.items()} == {
            k: (p.pages, p.expires_at) for k, p in mgr.pins.pins.items()}
        assert [pool.pinned[p] for p in range(POOL)] == [
            self.is_pinned(p) for p in range(POOL)]
        assert +pool.usage == +self.usage()
        s = mgr.stats()
        assert {k: s[k] for k in self.count} == self.count
        assert s["pages_pinned"] == len(self.pinned_pages()) <= int(MAX_PINNED * POOL)


PinQuotaMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("PREFIXCACHE_STATEFUL_EXAMPLES", "120")),
    stateful_step_count=80,
    deadline=None,
    derandomize=os.environ.get("CI", "").lower() == "true",
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestCachePinsQuotasStateful = PinQuotaMachine.TestCase
