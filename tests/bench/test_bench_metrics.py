"""Percentiles, hit rate, throughput, cross-tenant accounting and the JSON schema."""
from __future__ import annotations

import json
import os

import pytest

from prefixcache.bench import metrics as m
from prefixcache.bench.report import REQUIRED_KEYS


def res(rid, *, tenant=None, prompt=100, cached=0, out=4, send=0.0, first=1.0, end=2.0, warm=None,
        turn=0, error=None, ref=(None, None)):
    return m.RequestResult(id=rid, session=rid, turn=turn, group="g", tenant=tenant,
                           warm_expected=warm, prompt_tokens=prompt, cached_tokens=cached,
                           output_tokens=out, send_time=send,
                           first_token_time=first, end_time=end, reference_prompt_tokens=ref[0],
                           reference_cached_tokens=ref[1], error=error)


def test_percentile_linear_interpolation():
    xs = [4.0, 1.0, 3.0, 2.0]
    assert m.percentile(xs, 50) == 2.5
    assert m.percentile(xs, 0) == 1.0 and m.percentile(xs, 100) == 4.0
    assert m.percentile(xs, 90) == pytest.approx(3.7)
    assert m.percentile(range(1, 101), 99) == pytest.approx(99.01)
    assert m.percentile([5.0], 99) == 5.0
    assert m.percentile([], 50) is None and m.percentile([None, 2.0], 50) == 2.0


def test_hit_rate_and_per_request_latencies():
    rs = [res("a", prompt=100, cached=0), res("b", prompt=300, cached=288),
          res("c", prompt=50, cached=None)]
    assert m.hit_rate(rs) == pytest.approx(288 / 400)  # c reports nothing and is left out
    assert m.hit_rate([res("x", cached=None)]) is None
    r = res("t", out=5, send=1.0, first=1.5, end=2.5)
    assert (r.ttft, r.tpot, r.e2e) == (0.5, 0.25, 1.5)
    assert res("one", out=1).tpot is None


def test_union_and_effective_prefill_throughput():
    assert m.union_length([(0, 1), (0.5, 2), (3, 4)]) == 3.0
    assert m.union_length([]) == 0.0
    rs = [res("a", prompt=1000, send=0.0, first=1.0), res("b", prompt=1000, send=0.5, first=1.5),
          res("c", prompt=500, send=3.0, first=3.5)]
    # busy: [0, 1.5] and [3, 3.5] = 2 s for 2500 prompt tokens
    assert m.effective_prefill_throughput(rs) == pytest.approx(1250.0)


def test_cross_tenant_hits_definition():
    ids = {"a1": [1] * 64, "b1": [1] * 64, "a2": [1] * 48 + [2] * 16, "b2": [1] * 20 + [3] * 44}
    # send, first token: each request finishes before the next is sent
    ok = [res("a1", tenant="a", cached=0, send=0, first=0.5),
          res("b1", tenant="b", cached=0, send=1, first=1.5),
          res("a2", tenant="a", cached=48, send=2, first=2.5),  # own tenant's a1 shares 48 tokens
          # b1 shares 20 -> bound ceil16(20) = 32
          res("b2", tenant="b", cached=32, send=3, first=3.5)]
    assert m.cross_tenant_hits(ok, ids, block_size=16) == (0, 0)
    # b's first request
    leak = ok[:1] + [res("b1", tenant="b", cached=48, send=1, first=1.5)] + ok[2:]
    assert m.cross_tenant_hits(leak, ids, block_size=16) == (1, 48)
    over = ok[:3] + [res("b2", tenant="b", cached=48, send=3, first=3.5)]
    assert m.cross_tenant_hits(over, ids, block_size=16) == (1, 16)


def test_concurrent_same_tenant_requests_may_share():
    # a2 was sent a moment after a1 but admitted first; a1 then hit a2's pages: legitimate
    ids = {"a1": [1] * 64, "a2": [1] * 64, "b1": [1] * 64}
    rs = [res("a1", tenant="a", cached=48, send=0.084, first=3.1),
          res("a2", tenant="a", cached=0, send=0.085, first=1.4),
          res("b1", tenant="b", cached=48, send=5.0, first=5.5)]  # b alone: a cross-tenant hit
    assert m.cross_tenant_hits(rs, ids, block_size=16) == (1, 48)


def test_summary_has_the_documented_keys():
    info = m.RunInfo(workload="multi-tenant", model="bench", peer="prefixcache", mode="offline",
                     dtype="float32", threads=2, concurrency=4, machine="test")
    rs = [res("a", tenant="t0", prompt=100, cached=0, send=0, first=1, end=2, warm=False),
          res("b", tenant="t0", prompt=100, cached=96, send=2, first=2.1, end=3, warm=True),
          res("c", tenant="t1", prompt=100, cached=0, send=2, first=3, end=4, warm=False)]
    ids = {"a": list(range(100)), "b": list(range(100)), "c": list(range(100))}
    s = m.summarize(info, rs, wall_s=4.0, peak_rss=2**30, token_ids=ids)
    for k in REQUIRED_KEYS + ("cross_tenant_hits", "ttft_p90_s", "tpot_p50_s",
                              "effective_prefill_tok_s", "output_tok_s", "requests_per_s",
                              "peak_rss_mib", "threads", "dtype"):
        assert k in s, k
    assert s["requests"] == 3 and s["prompt_tokens"] == 300 and s["cached_tokens"] == 96
    assert s["hit_rate"] == pytest.approx(0.32) and s["prefill_tokens_computed"] == 204
    assert s["cross_tenant_hits"] == 0
    assert s["ttft_cold_p50_s"] == pytest.approx(1.0) and s["ttft_warm_p50_s"] == pytest.approx(0.1)
    assert s["ttft_cold_over_warm"] == pytest.approx(10.0)
    assert s["requests_per_s"] == 0.75 and s["output_tok_s"] == 3.0 and s["peak_rss_mib"] == 1024
    assert s["warm_hit_rate"] == pytest.approx(0.96)
    json.dumps(s)  # serialisable
    one_tenant = [r for r in rs if r.tenant == "t0"]
    other = m.summarize(m.RunInfo(**{**info.__dict__, "workload": "agent"}), one_tenant, wall_s=1.0,
                        peak_rss=None, reference_hit_rate=0.9)
    assert "cross_tenant_hits" not in other and other["reference_hit_rate"] == 0.9
    # any run with several tenants (a replayed log) is checked for cross-tenant hits too
    replay = m.summarize(m.RunInfo(**{**info.__dict__, "workload": "replay"}), rs, wall_s=1.0,
                         peak_rss=None, token_ids=ids)
    assert replay["cross_tenant_hits"] == 0


def test_summary_without_cached_reports():
    info = m.RunInfo(workload="shared-prefix", model="bench", peer="transformers", mode="offline",
                     dtype="float32", threads=2, concurrency=1, machine="test")
    s = m.summarize(info, [res("a", cached=None), res("b", cached=None, error="boom")],
                    wall_s=1.0, peak_rss=None, prefill_tokens_computed=100)
    assert s["cached_tokens"] is None and s["hit_rate"] is None and s["errors"] == 1
    assert s["prefill_tokens_computed"] == 100 and s["requests"] == 2
    logged = m.summarize(info, [res("a", cached=None)], wall_s=1.0, peak_rss=None,
                         cached_tokens_total=60)
    got = (logged["cached_tokens"], logged["hit_rate"], logged["cached_tokens_source"])
    assert got == (60, 0.6, "server log")


def test_peak_rss_reads_proc():
    tracker = m.PeakRSS()
    tracker.start()
    block = bytearray(64 * 2**20)
    block[:: 4096] = b"x" * len(block[:: 4096])
    tracker.sample()
    assert tracker.stop() >= 64 * 2**20
    assert os.getpid() in m.process_tree(os.getpid())
    del block
