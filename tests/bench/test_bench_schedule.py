"""Session order, concurrency and arrival times."""
from __future__ import annotations

import pytest

from prefixcache.bench.schedule import SessionScheduler
from prefixcache.bench.workloads import BenchRequest


def req(rid, session, turn=0, arrival=None):
    return BenchRequest(id=rid, session=session, turn=turn, arrival_s=arrival)


def drain(sched, now=0.0):
    out = []
    while (r := sched.next_ready(now)) is not None:
        out.append(r.id)
    return out


def test_sessions_are_sequential_and_concurrency_bounded():
    reqs = [req("a0", "a", 0), req("b0", "b", 0), req("a1", "a", 1), req("c0", "c", 0),
            req("b1", "b", 1)]
    s = SessionScheduler(reqs, concurrency=2)
    assert drain(s) == ["a0", "b0"]  # C = 2
    s.finish(reqs[0])
    assert drain(s) == ["a1"]  # a's next turn comes before c0 in workload order
    s.finish(reqs[1])
    assert drain(s) == ["c0"]  # b1 waits: b0 done, but C = 2 is full again
    s.finish(reqs[2])
    assert drain(s) == ["b1"]
    s.finish(reqs[3])
    s.finish(reqs[4])
    assert s.done


def test_turn_order_within_a_session_regardless_of_list_order():
    reqs = [req("x1", "x", 1), req("x0", "x", 0)]
    s = SessionScheduler(reqs, concurrency=8)
    assert drain(s) == ["x0"]
    s.finish(reqs[1])
    assert drain(s) == ["x1"]


def test_arrival_times_and_time_scale():
    reqs = [req("r0", "r0", arrival=0.0), req("r1", "r1", arrival=2.0)]
    s = SessionScheduler(reqs, concurrency=4)
    assert drain(s, now=0.0) == ["r0"] and s.next_arrival() == 2.0
    assert drain(s, now=1.9) == [] and drain(s, now=2.0) == ["r1"]
    half = SessionScheduler(reqs, concurrency=4, time_scale=0.5)
    assert drain(half, now=1.0) == ["r0", "r1"]
    ignore = SessionScheduler(reqs, concurrency=4, time_scale=0)
    assert drain(ignore, now=0.0) == ["r0", "r1"]


def test_bad_concurrency():
    with pytest.raises(ValueError, match="concurrency"):
        SessionScheduler([], 0)
