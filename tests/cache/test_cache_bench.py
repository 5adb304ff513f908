"""The cache-core benchmark (``prefixcache bench-cache``) on a tiny hand-checked trace."""
from __future__ import annotations

import argparse
import json

import pytest

from prefixcache.bench import cache_core

# Four requests of 512-token blocks (the last block of each is partial unless the
# length is a multiple of 512). Infinite cache: 0 + 2 + 1 + 2 = 5 of 9 whole blocks.
TRACE = [
    {"timestamp": 0, "input_length": 1200, "output_length": 5, "hash_ids": [0, 1, 2]},
    {"timestamp": 1, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 3]},
    # A multiple of 512: its last whole block is never a hit (the last token is computed).
    {"timestamp": 2, "input_length": 1024, "output_length": 5, "hash_ids": [0, 4]},
    # Block 2 was partial in request 1, so it was never published.
    {"timestamp": 3, "input_length": 1600, "output_length": 5, "hash_ids": [0, 1, 2, 5]},
]


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in TRACE))
    return path


def test_trace_tokens_and_ideal_hits():
    toks = cache_core.trace_tokens(TRACE[0])
    assert len(toks) == 1200
    assert toks[:512] == [0] * 512 and toks[512:1024] == [1] * 512 and toks[1024:] == [2] * 176
    assert cache_core.ideal_hits(TRACE) == [0, 2, 1, 2]


@pytest.mark.parametrize("pages, hits, evictions, skipped", [
    (3, [0, 2, 1, 0], 0, 1),       # request 4 needs 4 pages: more than the pool
    (4, [0, 2, 1, 2], 1, 0),       # request 4 evicts block 4 (least recently used)
    (100, [0, 2, 1, 2], 0, 0),
])
def test_replay_hits_by_pool_size(pages, hits, evictions, skipped):
    res = cache_core.replay(TRACE, pages)
    assert res["per_request_hit_blocks"] == hits
    assert (res["evictions"], res["skipped_too_large"]) == (evictions, skipped)
    assert res["whole_blocks"] == 9
    assert res["block_hit_rate"] == pytest.approx(sum(hits) / 9)
    assert res["token_hit_rate"] == pytest.approx(sum(hits) * 512 / (1200 + 1100 + 1024 + 1600))


def test_replay_with_concurrency_holds_running_pages():
    # Two running at once: request 3 still hits; request 4 frees the oldest to fit.
    res = cache_core.replay(TRACE, 6, concurrency=2)
    assert res["per_request_hit_blocks"] == [0, 2, 1, 2]


def test_bench_cache_cli_writes_json_and_markdown(trace, tmp_path):
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    cache_core.add_parser(sub)
    out, md = tmp_path / "out.json", tmp_path / "out.md"
    args = parser.parse_args(["bench-cache", "all", "--trace", str(trace), "--pool-pages",
                              "3,4", "--prompt-tokens", "256", "--runs", "1",
                              "--json", str(out), "--markdown", str(md)])
    assert cache_core.run(args) == 0
    res = json.loads(out.read_text())
    m = res["mooncake"]
    assert [p["pool_pages"] for p in m["pools"]] == [3, 4]
    assert [p["hit_blocks"] for p in m["pools"]] == [3, 5]
    assert m["infinite"]["hit_blocks"] == 5 and m["infinite_replay_mismatched_requests"] == 0
    assert m["infinite_from_hash_ids"] == pytest.approx(5 / 9)
    assert m["pools"][1]["vs_infinite"] == pytest.approx(1.0)
    s = res["hash_speed"]
    assert s["pages"] == 16 and set(s["figures"]) == {
        "cold_hash_match", "cold_full_cycle", "warm_hash_match", "warm_full_cycle"}
    text = md.read_text()
    assert "## Mooncake conversation trace replay" in text and "| infinite |" in text


def test_pool_tokens_option(trace):
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    cache_core.add_parser(sub)
    args = parser.parse_args(["bench-cache", "mooncake", "--trace", str(trace),
                              "--pool-tokens", "2048,2100"])
    res = cache_core.run_mooncake(args)
    assert [p["pool_pages"] for p in res["pools"]] == [4, 4]
