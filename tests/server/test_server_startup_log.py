"""``prefixcache serve`` says what it does: one start-up line per load phase with its
measured time, the KV tiers on with their budgets, the pages written down at shutdown and
the pages the disk tier indexes when the server restarts (the same count)."""
from __future__ import annotations

import re

import httpx

from tests.server.live import LiveServer

PROMPT = [1] + [(7 * i) % 250 + 5 for i in range(150)]  # 151 tokens: 9 full pages
PAGES = 9


def _serve(tmp_path, name: str) -> LiveServer:
    srv = LiveServer(["--served-model-name", "tiny", "--num-pages", "12", "--log-level",
                      "info", "--compute-backend", "torch",
                      "--host-cache-gib", "0.01", "--disk-cache-dir",
                      str(tmp_path / "kv")], tmp_path / f"{name}.log")
    srv.wait_ready()
    return srv


def _phases(log: str) -> list[str]:
    return re.findall(r"start-up: (.+?) in \d+\.\d\d s", log)


def test_start_up_phases_and_tier_pages_written_then_indexed(tmp_path):
    srv = _serve(tmp_path, "first")
    try:
        r = httpx.post(srv.v1 + "/completions", timeout=60, json={
            "prompt": PROMPT, "max_tokens": 2, "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200, r.text
    finally:
        srv.stop()
    log = srv.log()
    assert _phases(log) == ["imports (Python, torch)", "kernels and compute backend",
                            "weights", "tokenizer", "KV pool", "warm-up"]
    assert "KV pool in" in log and "12 pages of 16 tokens" in log
    assert "KV tier host: on, budget 0.01 GiB" in log
    assert f"KV tier disk: on, budget 8.00 GiB, {tmp_path / 'kv'}: 0 pages indexed from " \
           "0 files" in log
    assert re.search(rf"start-up: listening on http://127\.0\.0\.1:{srv.port}, "
                     r"\d+\.\d\d s after start", log)
    assert "about 30 s" not in log
    # the pool's cached pages, written down by the graceful shutdown
    assert f"KV tier host: {PAGES} pages written at shutdown (0 store failures), " \
           f"{PAGES} pages held" in log
    assert f"KV tier disk: {PAGES} pages written at shutdown (0 store failures), " \
           f"{PAGES} pages held" in log

    srv = _serve(tmp_path, "second")
    srv.stop()
    log = srv.log()
    assert f"KV tier disk: on, budget 8.00 GiB, {tmp_path / 'kv'}: {PAGES} pages indexed " \
           "from 1 files" in log
    assert "KV tier host: 0 pages written at shutdown (0 store failures), 0 pages held" in log
