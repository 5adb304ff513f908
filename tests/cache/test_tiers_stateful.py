"""Property-based state machine: the page pool with host-RAM and disk tiers under it.

Requests of a few namespaces admit (pool hits, then tier loads), compute chunks, finish;
the store worker is flushed at random; disk files are corrupted at random. After every
operation: the pool's invariants hold (:func:`check_invariants`: whole pool, ref counts,
states, pins), TTL pins (made, expired, unpinned at random) agree with what each tier
holds pinned, within its cap, every page a request holds carries exactly the KV its own
namespace and tokens give (so a tier never served a wrong, corrupt or foreign page), and
at idle nothing is held.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from prefixcache.cache.invariants import check_invariants
from prefixcache.cache.manager import KVCacheManager
from prefixcache.cache.page_table import PageTable
from prefixcache.cache.pins import PinCapError
from prefixcache.config import EngineConfig
from prefixcache.engine.kv_connector import TieredConnector, build_connector
from prefixcache.model.kv_pool import KVPool

BS, PAGES = 2, 10
PROMPTS = [[1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 9, 9, 9, 9, 9], [5, 5, 5, 5, 5, 5],
           [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3]]


def kv_value(ns: int, pos: int, token: int) -> float:
    """What the 'model' writes at a position: a function of namespace, position, token."""
    return float(ns * 100_000 + pos * 100 + token)


class TierMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="tiers-sm-")
        self.now = 0.0
        self.kv = KVPool(1, PAGES, BS, 1, 1, torch.float32, "cpu")
        page_bytes = 2 * BS * 4
        cfg = EngineConfig(host_cache_bytes=8 * page_bytes, disk_cache_dir=self.dir,
                           disk_cache_bytes=6000, tier_load_policy="always",
                           tier_store_queue=8)
        connector = build_connector(cfg, self.kv, "sm-model")
        assert isinstance(connector, TieredConnector)
        self.cache = KVCacheManager(PAGES, BS, clock=lambda: self.now, connector=connector)
        self.tiers = connector.tiers
        self.reqs: dict[str, tuple[PageTable, int]] = {}
        self.n = 0

    def teardown(self):
        self.cache.close_connector()
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(ns=st.integers(0, 2), which=st.integers(0, len(PROMPTS) - 1), flush=st.booleans())
    def admit(self, ns, which, flush):
        if flush:
            self.tiers.flush()
        rid = f"r{self.n}"
        self.n += 1
        pt = self.cache.new_page_table(rid, list(PROMPTS[which]), tenant=f"t{ns}")
        self.cache.take_hits(pt)
        self.cache.connector.load(pt)
        self.reqs[rid] = (pt, ns)

    @precondition(lambda self: self.reqs)
    @rule(i=st.integers(0, 99), chunk=st.integers(1, 5))
    def step(self, i, chunk):
        self._step(sorted(self.reqs)[i % len(self.reqs)], chunk)

    def _step(self, rid: str, chunk: int) -> None:
        pt, ns = self.reqs[rid]
        n = min(chunk, len(pt.token_ids) - pt.num_computed_tokens)
        if n <= 0 or not self.cache.allocate(pt, n):
            return
        for pos in range(pt.num_computed_tokens, pt.num_computed_tokens + n):
            page, off = pt.pages[pos // BS], pos % BS
            v = kv_value(ns, pos, pt.token_ids[pos])
            self.kv.k[0][page, off] = v
            self.kv.v[0][page, off] = -v
        self.cache.commit(pt, n)

    @precondition(lambda self: self.reqs)
    @rule(i=st.integers(0, 99), complete=st.booleans())
    def finish(self, i, complete):
        """Finish a request (abort it, or compute what it still can first)."""
        rid = sorted(self.reqs)[i % len(self.reqs)]
        if complete:
            self._step(rid, 99)
        pt, _ = self.reqs.pop(rid)
        self.cache.free(pt)

    @rule()
    def flood(self):
        """Another request takes every allocatable page and fails its step: cached pages
        are evicted (written back), its own pages publish nothing."""
        n = self.cache.pool.num_allocatable
        if n == 0:
            return
        self.n += 1
        pt = self.cache.new_page_table(f"f{self.n}", [self.n % 200 + 20] * (n * BS),
                                       tenant="flood")
        assert self.cache.allocate(pt, n * BS)
        self.cache.fail_step(pt)
        self.cache.free(pt)

    @rule()
    def flush(self):
        self.tiers.flush()

    @rule(ns=st.integers(0, 2), which=st.integers(0, len(PROMPTS) - 1),
          k=st.integers(1, 5), ttl=st.sampled_from([5.0, 50.0]))
    def pin_prefix(self, ns, which, k, ttl):
        """Prefill a prompt (hits and tier loads first), pin its first ``k`` pages, free."""
        self.admit(ns, which, False)
        rid = f"r{self.n - 1}"
        self._step(rid, 99)
        pt, _ = self.reqs.pop(rid)
        try:
            self.cache.pin(pt, k, ttl)
        except (ValueError, PinCapError):
            pass  # nothing published (the pool was full), or over the cap
        self.cache.free(pt)

    @rule(dt=st.sampled_from([1.0, 3.0]))
    def tick(self, dt):
        self.now += dt
        self.cache.pins.expire()

    @precondition(lambda self: self.cache.pins.pins)
    @rule(i=st.integers(0, 99))
    def unpin(self, i):
        reg = self.cache.pins
        pin = sorted(reg.pins.values(), key=lambda p: p.seq)[i % len(reg.pins)]
        assert reg.unpin(pin.tenant, pin.prefix_hash)
        if not reg.pins:  # nothing pinned: the tiers hold nothing pinned either
            for tier in self.tiers.local:
                assert not tier.pins.wanted and not tier.pins.entries and tier.pins.used == 0

    @invariant()
    def tier_pins_agree_and_stay_under_cap(self):
        reg = self.cache.pins
        held = {h for pin in reg.pins.values() for h in pin.hashes}
        for tier in self.tiers.local:
            p = tier.pins
            assert p.wanted == held
            assert p.used == sum(p.entries.values()) <= p.cap_bytes

    @rule(i=st.integers(0, 99), at=st.integers(0, 10_000))
    def corrupt_a_file(self, i, at):
        self.tiers.flush()
        files = sorted(Path(self.dir).glob("*.kvpg"))
        if files:
            f = files[i % len(files)]
            data = bytearray(f.read_bytes())
            data[at % len(data)] ^= 0x10
            f.write_bytes(bytes(data))

    @invariant()
    def pool_whole_and_contents_right(self):
        check_invariants(self.cache)
        for pt, ns in self.reqs.values():
            for pos in range(pt.num_computed_tokens):
                page, off = pt.pages[pos // BS], pos % BS
                v = kv_value(ns, pos, pt.token_ids[pos])
                assert self.kv.k[0][page, off].item() == v, (pt.request_id, pos)
                assert self.kv.v[0][page, off].item() == -v

    @invariant()
    def nothing_held_at_idle(self):
        if not self.reqs:
            assert self.cache.pool.num_live == 0
        s = self.tiers.stats()
        assert s["host_tier_bytes_used"] <= 8 * 2 * BS * 4
        assert s["disk_tier_bytes_used"] <= 6000


TierMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=40, deadline=None,
    derandomize=os.environ.get("CI", "").lower() == "true",
    suppress_health_check=[HealthCheck.too_slow])
TestTierStateful = TierMachine.TestCase
