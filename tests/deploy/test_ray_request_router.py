"""The Ray Serve request router's decisions over simulated replicas (no Ray cluster): the
router's policy and page index, driven through Ray's ``RequestRouter`` hooks."""
from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

pytest.importorskip("ray.serve")

from prefixcache.deploy.ray.messages import ReplicaRequest  # noqa: E402
from prefixcache.deploy.ray.request_router import PrefixCacheRouter  # noqa: E402

BS = 16


def _pages(*parts: object, n: int) -> list[bytes]:
    return [hashlib.blake2b(repr((parts, i)).encode(), digest_size=16).digest()
            for i in range(n)]


@dataclass
class FakeReplica:
    """What the router reads of Ray's ``RunningReplica``."""

    unique_id: str
    routing_stats: dict = field(default_factory=dict)

    @property
    def replica_id(self):
        return SimpleNamespace(unique_id=self.unique_id)


def _router(**kwargs) -> PrefixCacheRouter:
    router = object.__new__(PrefixCacheRouter)  # Ray's constructor needs a controller
    router.initialize_state(subscribe=False, **kwargs)
    return router


def _pending(hashes: list[bytes], tokens: int, rid: str):
    return SimpleNamespace(args=[ReplicaRequest("POST", "/v1/completions", [], b"",
                                                hashes, tokens)],
                           metadata=SimpleNamespace(internal_request_id=rid))


def _place(router, replicas, hashes, tokens, rid) -> tuple[str, int]:
    """Route one request as Ray does: the first rank gets it; returns (replica, hit)."""
    pending = _pending(hashes, tokens, rid)
    ranks = asyncio.run(router.choose_replicas(replicas, pending))
    assert sorted(r[0].unique_id for r in ranks) == sorted(r.unique_id for r in replicas)
    chosen = ranks[0][0]
    router.on_request_routed(pending, chosen.replica_id, None)
    pred = pending.args[0].predicted
    assert pred.replica == chosen.unique_id
    return chosen.unique_id, pred.hit_tokens


def test_a_repeat_goes_where_its_pages_are_and_another_tenants_prompt_is_no_hit():
    router = _router()
    replicas = [FakeReplica("a"), FakeReplica("b")]
    alice = _pages("alice", "doc", n=8)  # the engines' hashes are tenant-rooted
    bob = _pages("bob", "doc", n=8)
    where, hit = _place(router, replicas, alice, 8 * BS + 5, "r1")
    assert hit == 0
    router.on_request_completed(SimpleNamespace(unique_id=where), "r1")
    for i in range(3):  # approximate entries first, then the replica's own events
        again, hit = _place(router, replicas, alice, 8 * BS + 5, f"r2-{i}")
        assert (again, hit) == (where, 8 * BS)
        router.on_request_completed(SimpleNamespace(unique_id=again), f"r2-{i}")
    other, hit = _place(router, replicas, bob, 8 * BS + 5, "r3")
    assert hit == 0
    assert all(load.running == 0 for slot, load in router.loads.items()
               if slot != router.slots[other])


def test_the_last_prompt_token_is_never_predicted_cached():
    router = _router()
    replicas = [FakeReplica("a")]
    doc = _pages("full", n=4)
    _place(router, replicas, doc, 4 * BS, "x")
    _, hit = _place(router, replicas, doc, 4 * BS, "y")
    assert hit == 3 * BS  # 64 tokens: the page holding the last one is computed


def test_a_shared_system_prompt_is_spread_without_a_monopoly():
    router = _router(balance_abs_tokens=256, balance_rel=1.5)
    replicas = [FakeReplica("a"), FakeReplica("b")]
    system = _pages("system", n=32)  # 512 shared tokens, then 32 per user
    counts = {"a": 0, "b": 0}
    hits = []
    for u in range(20):  # concurrent: nothing completes
        hashes = system + _pages("user", u, n=2)
        where, hit = _place(router, replicas, hashes, len(hashes) * BS + 5, f"u{u}")
        counts[where] += 1
        hits.append(hit)
    assert counts == {"a": 10, "b": 10}
    assert hits.count(512) == 18  # after each replica's first, the system prompt hits


def test_a_dead_replica_loses_its_entries_and_its_successor_starts_empty():
    router = _router()
    a, b = FakeReplica("a"), FakeReplica("b")
    doc = _pages("doc", n=6)
    for slot_of in (a, b):
        router._slot(slot_of.replica_id)
    router.index.stored(router.slots["a"], doc)  # a's KV events
    where, hit = _place(router, [a, b], doc, 6 * BS + 1, "1")
    assert (where, hit) == ("a", 6 * BS)
    router._forget("a")  # what on_replica_actor_died and update_replicas do
    c = FakeReplica("c")  # Ray's replacement: a new replica id
    where, hit = _place(router, [b, c], doc, 6 * BS + 1, "2")
    assert hit == 0
    assert router.index.match(doc, [router.slots["a"], router.slots["c"]], 0.0) == {
        router.slots["a"]: 0, router.slots["c"]: 0}
    assert router.slots["c"] not in (router.slots["a"], router.slots["b"])


def test_requests_without_a_prompt_go_to_the_least_loaded():
    router = _router()
    a, b = FakeReplica("a"), FakeReplica("b")
    _place(router, [a, b], _pages("busy", n=4), 4 * BS + 1, "busy")
    ranks = asyncio.run(router.choose_replicas([a, b], None))
    busy = next(u for u, s in router.slots.items() if router.loads[s].running)
    assert ranks[-1][0].unique_id == busy


def test_unknown_router_arguments_are_refused_by_name():
    with pytest.raises(ValueError, match="balance_abs"):
        _router(balance_abs=3)
    with pytest.raises(ValueError, match="balance_rel"):
        _router(balance_rel=0.5)


def test_a_burst_ranked_before_any_is_sent_is_spread_and_predicted():
    router = _router(balance_abs_tokens=256, balance_rel=1.5)
    replicas = [FakeReplica("a"), FakeReplica("b")]
    system = _pages("burst", n=32)
    pendings = [_pending(system + _pages("q", u, n=2), 34 * BS + 5, f"b{u}")
                for u in range(6)]
    firsts = [asyncio.run(router.choose_replicas(replicas, p))[0][0] for p in pendings]
    assert sorted(r.unique_id for r in firsts) == ["a", "a", "a", "b", "b", "b"]
    for p, r in zip(pendings, firsts):
        router.on_request_routed(p, r.replica_id, None)
    assert sorted(p.args[0].predicted.hit_tokens for p in pendings) == [0, 0] + [512] * 4
    for p, r in zip(pendings, firsts):
        router.on_request_completed(r.replica_id, p.metadata.internal_request_id)
    assert all(load.running == 0 and load.queued_tokens == 0
               for load in router.loads.values())
