"""``prefixcache serve`` with KV tiers: tier hits count in ``cached_tokens`` and /metrics,
and a graceful shutdown writes the pool down so a restarted server hits the disk; another
prompt's valid file copied over a file is a counted miss, never a 500."""
from __future__ import annotations

import httpx

from tests.helpers.wait import wait_until
from tests.server.live import LiveServer

A = [1] + [(7 * i) % 250 + 5 for i in range(150)]
B = [1] + [(11 * i) % 250 + 9 for i in range(150)]


def complete(srv: LiveServer, prompt: list[int]) -> int:
    r = httpx.post(srv.v1 + "/completions", json={
        "model": "tiny", "prompt": prompt, "max_tokens": 2, "temperature": 0,
        "ignore_eos": True}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def wait_metric(srv: LiveServer, name: str, at_least: float) -> dict[str, float]:
    def reached() -> dict[str, float] | None:
        m = srv.metrics()
        return m if m.get(name, 0) >= at_least else None

    return wait_until(reached, f"{name} >= {at_least}")


def test_serve_with_tiers_hits_and_survives_restart(tmp_path):
    flags = ["--served-model-name", "tiny", "--num-pages", "12", "--host-cache-gib", "0.01",
             "--disk-cache-dir", str(tmp_path / "kv")]
    srv = LiveServer(flags, tmp_path / "a.log")
    try:
        srv.wait_ready()
        assert complete(srv, A) == 0
        assert complete(srv, B) == 0
        wait_metric(srv, "host_tier_pages", 7)
        assert complete(srv, A) == 144  # 2 pages from the pool, 7 from host RAM
        m = srv.wait_idle()
        assert m["host_tier_hit_tokens_total"] == 7 * 16
        assert m["prefix_cache_hits_total"] == 144 and m["kv_tier_store_dropped_total"] == 0
    finally:
        srv.stop()
    assert list((tmp_path / "kv").glob("*.kvpg"))
    srv = LiveServer(["--served-model-name", "tiny", "--num-pages", "12",
                      "--disk-cache-dir", str(tmp_path / "kv")], tmp_path / "b.log")
    try:
        srv.wait_ready()
        assert complete(srv, A) == 144  # every page of A from disk
        assert complete(srv, B) == 144
        m = srv.wait_idle()
        assert m["disk_tier_hit_tokens_total"] == 2 * 144
        assert m["disk_tier_corrupt_total"] == 0
    finally:
        srv.stop()


def wait_files(directory, n: int) -> list:
    """The group files in ``directory``, oldest first, once there are at least ``n``."""
    def files() -> list:
        found = sorted(directory.glob("*.kvpg"), key=lambda p: p.stat().st_mtime_ns)
        return found if len(found) >= n else []
    return wait_until(files, f"{n} group files in {directory}")


def test_serve_a_valid_file_of_another_prompt_over_a_file_is_a_miss_not_a_500(tmp_path):
    """Prompt B's group file copied over prompt A's while the server runs (a restore, an
    rsync): the request for A answers 200, recomputes, and the file is counted and removed."""
    kv = tmp_path / "kv"
    srv = LiveServer(["--served-model-name", "tiny", "--num-pages", "12",
                      "--disk-cache-dir", str(kv)], tmp_path / "a.log")
    try:
        srv.wait_ready()
        assert complete(srv, A) == 0
        assert complete(srv, B) == 0  # A's pages 2..8 go to one file
        (file_a,) = wait_files(kv, 1)
        assert complete(srv, A) == 144  # loaded; B's pages 2..8 go to another file
        file_b = next(p for p in wait_files(kv, 2) if p != file_a)
        file_a.write_bytes(file_b.read_bytes())
        assert complete(srv, B) == 144  # B's own file is intact
        assert complete(srv, A) == 2 * 16  # 2 pages from the pool, the rest recomputed
        assert complete(srv, A) == 144  # and published again
        m = srv.wait_idle()
        assert m["disk_tier_corrupt_total"] == 1 and m["engine_failed_steps_total"] == 0
        assert m["disk_tier_hit_tokens_total"] == 2 * 7 * 16
        assert not file_a.exists()
    finally:
        srv.stop()
