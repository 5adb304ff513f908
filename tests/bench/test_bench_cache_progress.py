"""``prefixcache bench-cache`` shows progress on stderr for its long steps (the replays and
the timed runs), and ``--no-progress`` silences it; the figures are the same either way."""
from __future__ import annotations

import argparse
import json

from prefixcache.bench import cache_core

TRACE = [{"timestamp": 0, "input_length": 1200, "output_length": 5, "hash_ids": [0, 1, 2]},
         {"timestamp": 1, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 3]}]


def run(tmp_path, *extra) -> dict:
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in TRACE))
    parser = argparse.ArgumentParser()
    cache_core.add_parser(parser.add_subparsers(dest="command"))
    out = tmp_path / "out.json"
    args = parser.parse_args(["bench-cache", "all", "--trace", str(path), "--pool-pages", "3,4",
                              "--prompt-tokens", "64", "--runs", "2", "--json", str(out), *extra])
    assert cache_core.run(args) == 0
    return json.loads(out.read_text())


def test_progress_bars_count_replays_and_timed_runs(tmp_path, capsys):
    res = run(tmp_path)
    err = capsys.readouterr().err
    # 2 pool sizes + the infinite pool; 2 x (2 runs + 1 warm-up)
    assert "mooncake replay, 2 requests:   0%|          | 0/3 [" in err
    assert "hash speed, 64 tokens:   0%|          | 0/6 [" in err
    quiet = run(tmp_path, "--no-progress")
    assert capsys.readouterr().err == ""
    assert [p["hit_blocks"] for p in quiet["mooncake"]["pools"]] == [
        p["hit_blocks"] for p in res["mooncake"]["pools"]] == [2, 2]
