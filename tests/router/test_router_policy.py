"""Routing decisions over simulated replicas (router-side counts, no HTTP): the failure
modes peers shipped, each checked by counting where requests go."""
from __future__ import annotations

import hashlib

import pytest

from prefixcache.router.policy import Policy
from prefixcache.router.replicas import ReplicaSet, ReplicaSpec

BS = 16


def _pages(*parts: object, n: int) -> list[bytes]:
    return [hashlib.blake2b(repr((parts, i)).encode(), digest_size=16).digest()
            for i in range(n)]


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _set(n: int, **policy) -> tuple[ReplicaSet, Clock]:
    clock = Clock()
    rs = ReplicaSet([ReplicaSpec(f"http://r{i}") for i in range(n)], policy=Policy(**policy),
                    clock=clock)
    return rs, clock


def _prompt(system: list[bytes], user: int, n_user: int = 2) -> list[bytes]:
    # a chain: pages after the shared system prompt differ per user
    return system + _pages("user", user, n=n_user)


def test_a_shared_system_prompt_does_not_send_all_traffic_to_one_replica():
    rs, _ = _set(4)
    system = _pages("system", n=32)  # 512 shared tokens, then 32 per user
    counts = [0] * 4
    for u in range(40):  # concurrent: nobody finishes
        hashes = _prompt(system, u)
        routed = rs.route(hashes, len(hashes) * BS + 5, BS)
        assert routed is not None
        counts[routed.decision.replica] += 1
    assert sorted(counts) == [10, 10, 10, 10]


def test_misses_at_low_concurrency_spread_over_replicas():
    rs, _ = _set(3)
    counts = [0] * 3
    for u in range(30):  # one at a time: each finishes before the next arrives
        hashes = _pages("distinct", u, n=4)
        routed = rs.route(hashes, 4 * BS + 3, BS)
        assert routed is not None and routed.decision.hit_tokens == 0
        counts[routed.decision.replica] += 1
        rs.release(routed)
    assert counts == [10, 10, 10]


def test_an_overloaded_replica_sheds_new_traffic_at_once():
    rs, _ = _set(2, balance_abs_tokens=1024, balance_rel=1.5)
    doc = _pages("doc", n=64)  # 1024 tokens everybody asks about
    first = rs.route(doc, 64 * BS + 8, BS)
    assert first is not None
    hot = first.decision.replica
    sent = []
    for q in range(12):  # the same document, new questions, nothing finishes
        hashes = doc + _pages("q", q, n=1)
        routed = rs.route(hashes, len(hashes) * BS + 3, BS)
        assert routed is not None
        sent.append(routed.decision.replica)
    # The cache keeps it on the hot replica while its queue is short; past the
    # thresholds the other replica gets the traffic, within a couple of requests.
    shed_at = next(i for i, r in enumerate(sent) if r != hot)
    assert shed_at <= 2
    assert sent.count(1 - hot) >= 5
    # a replica that answered 429 takes nothing for its Retry-After
    rs2, clock = _set(2)
    rs2.shed(0, 1.0)
    picks = [rs2.route(_pages("x", i, n=2), 40, BS) for i in range(5)]
    assert {p.decision.replica for p in picks if p} == {1}
    clock.t = 1.0
    picks = [rs2.route(_pages("y", i, n=2), 40, BS) for i in range(4)]
    assert [p.decision.replica for p in picks if p] == [0, 0, 0, 0]  # the idle one again


def test_affinity_holds_under_imbalance():
    rs, _ = _set(2, balance_abs_tokens=4096, balance_rel=2.0)
    convo = _pages("conversation", n=40)  # 640 tokens cached on replica 0
    rs.apply_event(0, "stored", convo)
    # replica 0 is busier (but not past the thresholds)
    busy = rs.route(_pages("other", n=20), 20 * BS, BS, exclude=[1])
    assert busy is not None and busy.decision.replica == 0
    for turn in range(5):
        hashes = convo + _pages("turn", turn, n=2)
        routed = rs.route(hashes, len(hashes) * BS + 1, BS)
        assert routed is not None
        assert routed.decision.replica == 0 and routed.decision.reason == "cache"
        assert routed.decision.hit_tokens == 40 * BS
        rs.release(routed)
        rs.apply_event(0, "stored", hashes)
    cold = rs.route(_pages("cold", n=10), 10 * BS, BS)
    assert cold is not None and cold.decision.replica == 1  # new work goes to the idle one


def test_a_replica_that_goes_down_loses_its_entries_and_traffic():
    rs, _ = _set(2)
    doc = _pages("doc2", n=8)
    rs.apply_event(0, "stored", doc)
    assert rs.route(doc, 8 * BS + 1, BS).decision.replica == 0
    rs.set_health(0, False)
    routed = rs.route(doc, 8 * BS + 1, BS)
    assert routed.decision.replica == 1 and routed.decision.hit_tokens == 0
    rs.set_health(0, True)
    assert rs.index.match(doc, [0], now=0.0) == {0: 0}  # dropped, not revived
    rs.set_health(1, False)
    rs.set_health(0, False)
    assert rs.route(doc, 8 * BS + 1, BS) is None


def test_round_robin_mode_ignores_hits():
    rs, _ = _set(3, mode="round_robin")
    doc = _pages("doc3", n=8)
    rs.apply_event(0, "stored", doc)
    picks = [rs.route(doc, 8 * BS + 1, BS).decision.replica for _ in range(6)]
    assert sorted(picks) == [0, 0, 1, 1, 2, 2]


def test_bad_policy_and_replica_flags_name_the_parameter():
    with pytest.raises(ValueError, match="balance_rel"):
        Policy(balance_rel=0.5)
    with pytest.raises(ValueError, match="mode"):
        Policy(mode="random")
    with pytest.raises(ValueError, match="--replica"):
        ReplicaSpec.parse("127.0.0.1:8000")
    with pytest.raises(ValueError, match="--replica"):
        ReplicaSpec.parse("http://h:1,evnts=tcp://h:2")
    spec = ReplicaSpec.parse("http://h:1/,events=tcp://h:2,replay=tcp://h:3")
    assert (spec.url, spec.events, spec.replay) == ("http://h:1", "tcp://h:2", "tcp://h:3")


def test_a_session_returns_to_its_replica_unless_it_is_overloaded():
    rs, _ = _set(2, balance_abs_tokens=100, balance_rel=1.5, decode_weight=0)
    alice, bob = ("alice", "job"), ("bob", "job")
    first = rs.route(_pages("a", 0, n=4), 65, BS, session=alice)
    assert first is not None and first.decision.reason != "session"
    home = first.decision.replica
    rs.release(first)
    # Unrelated prompts whose pages the other replica holds: the session still goes home.
    other = 1 - home
    rs.index.approximate(other, _pages("a", 1, n=4), 0.0)
    for k in range(3):
        r = rs.route(_pages("a", 1, n=4) + _pages("s", k, n=1), 81, BS, session=alice)
        assert r is not None and (r.decision.replica, r.decision.reason) == (home, "session")
        rs.release(r)
    # The same id of another tenant is another session: routed by cost.
    r = rs.route(_pages("b", 0, n=4), 65, BS, session=bob)
    assert r is not None and r.decision.reason == "balance" and bob in rs.sessions
    rs.release(r)
    # Home overloaded (past both thresholds): the session goes elsewhere and moves there.
    rs.loads[home].queued_tokens = 1000
    r = rs.route(_pages("a", 2, n=4), 65, BS, session=alice)
    assert r is not None and (r.decision.replica, r.decision.reason) == (other, "overload")
    assert rs.sessions[alice] == other
