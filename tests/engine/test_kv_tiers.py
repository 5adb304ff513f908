"""KV tiers under the pool, end to end on the tiny model: loads equal cold runs, restarts
hit, failures are misses, fingerprints and namespaces never share, nothing stays held."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers.outputs import same_output as same
from prefixcache import LLM, SamplingParams
from prefixcache.cache.tiers.tier_io import FaultyIO
from prefixcache.engine.tier_estimates import LoadEstimator

ROOT = Path(__file__).resolve().parents[2]
G = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, logprobs=3)
A = [1] + [(7 * i) % 250 + 5 for i in range(150)]   # 151 tokens: 9 full pages hit at most
B = [1] + [(11 * i) % 250 + 9 for i in range(150)]
POOL = 12  # pages: one session (10 pages) fits, two do not


def run(llm: LLM, prompt: list[int], **kw):
    return llm.generate([{"prompt_token_ids": prompt}], G, **kw)[0]


@pytest.fixture(scope="module")
def cold():
    llm = LLM("builtin:tiny", num_pages=64, enable_prefix_caching=False)
    return {"A": run(llm, A), "B": run(llm, B)}


def tiered(**kw) -> LLM:
    kw.setdefault("tier_load_policy", "always")
    kw.setdefault("num_pages", POOL)
    return LLM("builtin:tiny", **kw)


def flush(llm: LLM) -> None:
    assert llm.engine.tiers is not None
    llm.engine.tiers.flush()


def test_two_sessions_alternate_through_host_tier_equal_cold(cold):
    llm = tiered(host_cache_bytes=1 << 22)
    for turn in range(3):
        for name, prompt in (("A", A), ("B", B)):
            out = run(llm, prompt)
            flush(llm)
            same(out, cold[name])
            assert out.num_cached_tokens == (0 if turn == 0 else 144)
    s = llm.stats()
    # each rerun reads 2 head pages from the pool and 7 from host RAM
    assert s["host_tier_hit_tokens"] == 4 * 7 * 16
    assert s["prefix_cache_hits"] == 4 * 144
    assert s["pages_live"] == 0 and s["tier_store_pending"] == 0
    assert s["host_tier_bytes_used"] <= 1 << 22 and s["tier_store_dropped"] == 0


def test_disk_tier_alone_serves_and_counts(cold, tmp_path):
    llm = tiered(disk_cache_dir=str(tmp_path))
    run(llm, A)
    run(llm, B)
    flush(llm)
    same(out := run(llm, A), cold["A"])
    s = llm.stats()
    assert out.num_cached_tokens == 144 and s["disk_tier_hit_tokens"] == 7 * 16
    assert s["disk_tier_loads"] >= 1 and s["disk_tier_corrupt"] == 0


@pytest.mark.parametrize("kind", ["short_read", "flip_byte", "truncate"])
def test_bad_disk_read_is_a_miss_and_recompute_equals_cold(cold, tmp_path, kind):
    llm = tiered(disk_cache_dir=str(tmp_path))
    run(llm, A)
    run(llm, B)
    flush(llm)
    io = FaultyIO()
    disk = llm.engine.tiers.tiers[0]  # type: ignore[union-attr]
    disk.io = io  # type: ignore[attr-defined]
    io.arm(kind)
    out = run(llm, A)
    same(out, cold["A"])
    s = llm.stats()
    assert io.injected[kind] == 1 == s["disk_tier_corrupt"]
    assert s["disk_tier_hit_tokens"] == 0 and out.num_cached_tokens == 2 * 16
    assert s["pages_live"] == 0


def test_a_valid_file_of_another_prompt_over_a_file_is_a_miss_equal_cold(cold, tmp_path):
    """A restore or an rsync over a live cache directory puts prompt B's (valid,
    checksummed) group file under the name of prompt A's: reading it is a counted miss, the
    file is removed, A recomputes, and once its pages are written again they hit."""
    llm = tiered(disk_cache_dir=str(tmp_path / "a"))
    run(llm, A)
    run(llm, B)  # evicts A's pages 2..8 into one file
    flush(llm)
    other = tiered(disk_cache_dir=str(tmp_path / "b"))
    run(other, B)
    run(other, A)  # evicts B's pages 2..8 into one file
    flush(other)
    (file_a,), (file_b,) = (list((tmp_path / d).glob("*.kvpg")) for d in ("a", "b"))
    file_a.write_bytes(file_b.read_bytes())
    out = run(llm, A)
    same(out, cold["A"])
    s = llm.stats()
    assert out.num_cached_tokens == 2 * 16 and s["disk_tier_hit_tokens"] == 0
    assert s["disk_tier_corrupt"] == 1 and s["disk_tier_failures"] == 0
    assert s["failed_steps"] == 0 and s["pages_live"] == 0
    assert not file_a.exists()
    run(llm, B)  # evicts A again: its recomputed pages are written back
    flush(llm)
    same(out := run(llm, A), cold["A"])
    s = llm.stats()
    # B (its own file was intact) and then A each loaded 7 pages from disk
    assert out.num_cached_tokens == 144 and s["disk_tier_hit_tokens"] == 2 * 7 * 16
    assert s["disk_tier_corrupt"] == 1


@pytest.mark.parametrize("kind", ["enospc", "mid_write"])
def test_failed_store_is_invisible(cold, tmp_path, kind):
    llm = tiered(disk_cache_dir=str(tmp_path))
    io = FaultyIO()
    llm.engine.tiers.tiers[0].io = io  # type: ignore[union-attr,attr-defined]
    io.arm(kind, 1000)
    run(llm, A)
    run(llm, B)
    flush(llm)
    assert list(tmp_path.iterdir()) == []
    out = run(llm, A)
    same(out, cold["A"])
    s = llm.stats()
    assert s["disk_tier_failures"] == io.injected[kind] >= 1
    assert s["disk_tier_hit_tokens"] == 0 and s["disk_tier_pages"] == 0


RESTART = textwrap.dedent("""
    import os, signal, sys
    from prefixcache import LLM, SamplingParams
    G = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    A, B = {A}, {B}
    llm = LLM("builtin:tiny", num_pages={POOL}, disk_cache_dir=sys.argv[1])
    for p in (A, B):
        llm.generate([{{"prompt_token_ids": p}}], G)
    llm.engine.tiers.flush()
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_restart_after_kill_hits_disk_and_rewrites_nothing(cold, tmp_path):
    script = RESTART.format(A=A, B=B, POOL=POOL)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env,
                          capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    before = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    assert before and not any(n.endswith(".tmp") for n in before)
    llm = tiered(disk_cache_dir=str(tmp_path))
    out = run(llm, A)
    same(out, cold["A"])
    s = llm.stats()
    # the killed process kept 2 head pages in its pool: those are recomputed
    assert s["disk_tier_hit_tokens"] == 0 and out.num_cached_tokens == 0
    llm.close()  # writes the pool's pages down: only A's 2 head pages are new
    s = llm.stats()
    assert s["disk_tier_stores"] == 1 and s["disk_tier_pages"] == 9
    llm2 = tiered(disk_cache_dir=str(tmp_path))
    out = run(llm2, A)
    same(out, cold["A"])
    s2 = llm2.stats()
    assert out.num_cached_tokens == 144 and s2["disk_tier_hit_tokens"] == 144
    run(llm2, B)
    flush(llm2)
    assert llm2.stats()["disk_tier_stores"] == 0  # every evicted page of A was on disk
    after = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    assert {n: after[n] for n in before} == before  # no file rewritten


def test_close_writes_the_pool_down_so_a_restart_hits(cold, tmp_path):
    llm = tiered(disk_cache_dir=str(tmp_path))
    run(llm, A)
    llm.close()
    llm2 = tiered(disk_cache_dir=str(tmp_path))
    out = run(llm2, A)
    same(out, cold["A"])
    assert out.num_cached_tokens == 144 == llm2.stats()["disk_tier_hit_tokens"]


@pytest.mark.parametrize("change", [{"dtype": "bfloat16"}, {"block_size": 8, "num_pages": 24},
                                    {"hash_root_seed": "other"}])
def test_fingerprint_change_is_a_miss(tmp_path, change):
    llm = tiered(disk_cache_dir=str(tmp_path))
    run(llm, A)
    llm.close()
    assert list(tmp_path.glob("*.kvpg"))
    other = tiered(disk_cache_dir=str(tmp_path), **change)
    out = run(other, A)
    assert out.num_cached_tokens == 0 and other.stats()["disk_tier_hit_tokens"] == 0


@pytest.mark.parametrize("ns", [{"tenant": "t2"}, {"cache_salt": "s2"},
                                {"tenant": "t1", "cache_salt": "s"}])
def test_tiers_never_share_across_tenants_or_salts(tmp_path, ns):
    llm = tiered(host_cache_bytes=1 << 22, disk_cache_dir=str(tmp_path))
    run(llm, A, tenant="t1")
    run(llm, B, tenant="t1")
    flush(llm)
    out = run(llm, A, **ns)
    s = llm.stats()
    assert out.num_cached_tokens == 0
    assert s["host_tier_hit_tokens"] == 0 == s["disk_tier_hit_tokens"]
    out = run(llm, A, tenant="t1")
    assert out.num_cached_tokens == 144


def test_recompute_chosen_when_estimated_faster(cold):
    llm = tiered(host_cache_bytes=1 << 22, tier_load_policy="auto")
    run(llm, A)
    run(llm, B)
    flush(llm)
    est = llm.engine.tiers.estimates  # type: ignore[union-attr]
    est.prefill_s_per_token = 1e-9
    est.load_s_per_page["host"] = 1.0
    out = run(llm, A)
    same(out, cold["A"])
    s = llm.stats()
    assert out.num_cached_tokens == 32 and s["host_tier_hit_tokens"] == 0
    assert s["tier_hits_skipped_slower"] == 1 and s["pages_live"] == 0


def test_estimator_compares_running_averages():
    e = LoadEstimator()
    assert e.should_load("disk", 4, 64)  # nothing measured: load, to measure it
    e.observe_prefill(0.064, 64)  # 1 ms per token
    e.observe_load("disk", 0.040, 4)  # 10 ms per page of 16 tokens
    assert e.should_load("disk", 4, 64)
    e.observe_load("disk", 0.4, 1)  # 400 ms: EMA 0.8 * 10 + 0.2 * 400 = 88 ms per page
    assert e.load_s_per_page["disk"] == pytest.approx(0.088)
    assert not e.should_load("disk", 4, 64) and e.skipped_slower == 1
    assert LoadEstimator("always").should_load("disk", 1, 1)
    with pytest.raises(ValueError, match="policy"):
        LoadEstimator("never")


def test_write_through_stores_hit_pages(tmp_path):
    llm = tiered(host_cache_bytes=1 << 22, tier_write_policy="write_through")
    run(llm, A)
    flush(llm)
    assert llm.stats()["host_tier_pages"] == 0  # nothing hit yet, nothing evicted counts
    run(llm, A)
    flush(llm)
    assert llm.stats()["host_tier_pages"] == 9  # the 9 pages it hit


@pytest.mark.parametrize("field,value", [("host_cache_bytes", -1), ("disk_cache_bytes", 0),
                                         ("tier_write_policy", "later"),
                                         ("tier_load_policy", "never"),
                                         ("tier_store_queue", 0)])
def test_bad_tier_options_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"^{field}: "):
        LLM("builtin:tiny", num_pages=8, **{field: value})


def test_preemption_swaps_victim_pages_through_host_tier():
    g = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    a, b = A[:81], B[:81]
    outs, stats = [], []
    for kw in ({}, {"host_cache_bytes": 1 << 22}):
        llm = tiered(**kw) if kw else LLM("builtin:tiny", num_pages=POOL)
        outs.append([o.outputs[0].token_ids for o in llm.generate(
            [{"prompt_token_ids": a}, {"prompt_token_ids": b}], g)])
        stats.append(llm.stats())
    assert outs[0] == outs[1]
    assert stats[0]["num_preemptions"] == stats[1]["num_preemptions"] == 1
    loaded = stats[1]["host_tier_hit_tokens"]
    assert loaded == 32  # the victim's published pages come back from host RAM
    work = [s["prefill_tokens_computed"] + s["decode_tokens_computed"] for s in stats]
    assert work[1] == work[0] - loaded
    assert stats[1]["pages_live"] == 0


def test_one_prefix_loads_from_host_and_disk_together(cold, tmp_path):
    """Host RAM (8 pages) keeps the newest pages, the disk all of them: a chain whose head
    only the disk still holds is read from both, each page from the fastest tier."""
    page = 2 * 4 * 16 * 4 * 32 * 4  # the tiny model's page: K and V, 4 layers, fp32
    llm = tiered(host_cache_bytes=8 * page, disk_cache_dir=str(tmp_path))
    got = []
    for name, p in (("A", A), ("B", B), ("A", A), ("B", B), ("A", A)):
        before = llm.stats()
        out = run(llm, p)
        flush(llm)
        same(out, cold[name])
        s = llm.stats()
        got.append((out.num_cached_tokens,
                    s["host_tier_hit_tokens"] - before["host_tier_hit_tokens"],
                    s["disk_tier_hit_tokens"] - before["disk_tier_hit_tokens"]))
    assert got == [(0, 0, 0), (0, 0, 0), (144, 112, 0), (144, 112, 0), (144, 96, 16)]
    assert llm.stats()["host_tier_bytes_used"] <= 8 * page


def test_stray_directory_fifo_and_symlink_in_the_disk_dir_do_not_stop_start(cold, tmp_path):
    d = tmp_path / "kv"
    llm = tiered(disk_cache_dir=str(d))
    run(llm, A)
    run(llm, B)
    llm.close()  # writes the pool down
    (d / "dir.kvpg").mkdir()
    os.mkfifo(d / "fifo.kvpg")
    (d / "link.kvpg").symlink_to(tmp_path / "missing")
    (d / "bad.kvpg").write_bytes(b"junk")
    again = tiered(disk_cache_dir=str(d))  # neither raises nor blocks on the FIFO
    same(out := run(again, A), cold["A"])
    assert out.num_cached_tokens == 144  # the real files still hit
    assert again.stats()["disk_tier_corrupt"] == 1 and not (d / "bad.kvpg").exists()
    assert all(os.path.lexists(d / n) for n in ("dir.kvpg", "fifo.kvpg", "link.kvpg"))
