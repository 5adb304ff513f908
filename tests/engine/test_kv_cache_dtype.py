"""--kv-cache-dtype end to end on the tiny model (4 layers, 4 KV heads, head_dim 32, pages
of 16 tokens): pool sizing per dtype, the bound against the float32 pool, cold == warm in
deterministic mode, tiers round trip per dtype, and a page of another dtype is a miss."""
from __future__ import annotations

import argparse

import pytest

from helpers.outputs import same_output as same
from prefixcache import LLM, SamplingParams
from prefixcache.cache.tiers.format import PageGroup, decode, encode
from prefixcache.config import EngineConfig
from prefixcache.engine.args import add_engine_args, config_from_args

G = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, logprobs=3)
A = [1] + [(7 * i) % 250 + 5 for i in range(150)]   # 151 tokens: 9 full pages hit at most
B = [1] + [(11 * i) % 250 + 9 for i in range(150)]
DTYPES = ["float32", "bfloat16", "int8"]


def run(llm: LLM, prompt: list[int]):
    return llm.generate([{"prompt_token_ids": prompt}], G)[0]


# 1 MiB of KV: a page is 2 x 4 layers x 16 tokens x 4 heads x (32 x 4 | 32 x 2 | 32 + 4) bytes
@pytest.mark.parametrize("kv_dtype,pages,page_bytes", [
    ("auto", 16, 65536), ("float32", 16, 65536), ("bfloat16", 32, 32768),
    ("int8", 56, 18432)])
def test_a_byte_budget_holds_pages_of_the_kv_dtype(kv_dtype, pages, page_bytes):
    llm = LLM("builtin:tiny", kv_cache_dtype=kv_dtype, kv_cache_bytes=1 << 20)
    kv = llm.engine.runner.kv
    assert llm.engine.runner.num_pages == pages == kv.num_pages
    assert kv.page_nbytes == page_bytes
    assert sum(t.numel() * t.element_size() for t in kv.k + kv.v) == pages * page_bytes
    name = "float32" if kv_dtype == "auto" else kv_dtype
    assert llm.engine.config.kv_dtype == name
    assert llm.engine.fingerprint == f"builtin:tiny|kv={name}|bs=16|layout=1"


def test_kv_cache_dtype_flag_and_bad_values_name_the_field():
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    cfg = config_from_args(parser.parse_args(["--kv-cache-dtype", "int8"]))
    assert cfg.kv_cache_dtype == "int8" and cfg.kv_dtype == "int8" and cfg.dtype == "float32"
    cfg = config_from_args(parser.parse_args(["--dtype", "bfloat16"]))
    assert cfg.kv_cache_dtype == "auto" and cfg.kv_dtype == "bfloat16"
    with pytest.raises(SystemExit):
        parser.parse_args(["--kv-cache-dtype", "fp8"])
    assert EngineConfig(kv_cache_dtype="bf16").kv_cache_dtype == "bfloat16"
    with pytest.raises(ValueError, match="^kv_cache_dtype: must be one of"):
        EngineConfig(kv_cache_dtype="int4")


@pytest.fixture(scope="module")
def float32_run():
    llm = LLM("builtin:tiny", num_pages=64, enable_prefix_caching=False)
    return run(llm, A)


# max |logprob difference| of the 3 top tokens over 4 greedy steps, against the float32
# pool (measured on this model, both backends: bfloat16 0.0022, int8 0.0071; bounds
# with about 7x margin)
BOUND = {"bfloat16": 0.03, "int8": 0.05}


@pytest.mark.parametrize("backend", ["torch", "cpu-kernels"])
@pytest.mark.parametrize("kv_dtype", ["bfloat16", "int8"])
def test_logprobs_within_the_bound_of_the_float32_pool(float32_run, kv_dtype, backend):
    llm = LLM("builtin:tiny", num_pages=64, kv_cache_dtype=kv_dtype, compute_backend=backend)
    cold, warm = run(llm, A), run(llm, A)
    assert warm.num_cached_tokens == 144
    for out in (cold, warm):
        assert out.outputs[0].token_ids == float32_run.outputs[0].token_ids
        for got, want in zip(out.outputs[0].logprobs, float32_run.outputs[0].logprobs):
            for t in want:
                assert abs(got[t].logprob - want[t].logprob) <= BOUND[kv_dtype]


@pytest.mark.parametrize("kv_dtype", DTYPES)
def test_deterministic_cold_equals_warm_bit_for_bit(kv_dtype):
    llm = LLM("builtin:tiny", num_pages=64, kv_cache_dtype=kv_dtype, deterministic=True)
    cold = run(llm, A)
    warm = run(llm, A)
    assert cold.num_cached_tokens == 0 and warm.num_cached_tokens == 144
    same(warm, cold, abs_tol=0.0)
    fresh = LLM("builtin:tiny", num_pages=64, kv_cache_dtype=kv_dtype, deterministic=True)
    run(fresh, A[:40])  # another chunking of the same prefix: 2 pages, then the rest
    same(run(fresh, A), cold, abs_tol=0.0)


@pytest.mark.parametrize("kv_dtype", DTYPES)
def test_tiers_round_trip_per_kv_dtype(kv_dtype, tmp_path):
    """Host RAM and disk hold pages of the pool's dtype; a load equals the cold run of
    the same KV dtype."""
    def tiered(**kw) -> LLM:
        return LLM("builtin:tiny", num_pages=12, kv_cache_dtype=kv_dtype,
                   tier_load_policy="always", **kw)

    cold = run(LLM("builtin:tiny", num_pages=64, kv_cache_dtype=kv_dtype), A)
    for kw in ({"host_cache_bytes": 1 << 22}, {"disk_cache_dir": str(tmp_path)}):
        llm = tiered(**kw)
        run(llm, A)
        run(llm, B)  # evicts A's pages into the tier
        llm.engine.tiers.flush()
        out = run(llm, A)
        same(out, cold)  # default mode: a hit may differ from cold at float rounding
        s = llm.stats()
        tier = "host" if "host_cache_bytes" in kw else "disk"
        assert out.num_cached_tokens == 144 and s[f"{tier}_tier_hit_tokens"] == 7 * 16
        assert s[f"{tier}_tier_corrupt"] == 0


@pytest.mark.parametrize("writer,reader", [("float32", "bfloat16"), ("int8", "float32"),
                                           ("bfloat16", "int8")])
def test_pages_of_another_kv_dtype_are_never_served(writer, reader, tmp_path):
    """Another KV dtype is another fingerprint: its pages have other keys, in the pool's
    index as on disk, so a reader finds none of them."""
    llm = LLM("builtin:tiny", num_pages=12, kv_cache_dtype=writer,
              disk_cache_dir=str(tmp_path), tier_load_policy="always")
    run(llm, A)
    llm.close()
    assert list(tmp_path.glob("*.kvpg"))
    other = LLM("builtin:tiny", num_pages=12, kv_cache_dtype=reader,
                disk_cache_dir=str(tmp_path), tier_load_policy="always")
    out = run(other, A)
    assert out.num_cached_tokens == 0 and other.stats()["disk_tier_hit_tokens"] == 0


def test_a_tier_page_in_another_dtype_under_the_right_key_is_a_counted_miss(tmp_path):
    """A valid disk file under an int8 pool's keys whose payload says bfloat16 (same bytes,
    other layout) fails the layout check: a counted miss, removed, recomputed."""
    def tiered() -> LLM:
        return LLM("builtin:tiny", num_pages=12, kv_cache_dtype="int8",
                   disk_cache_dir=str(tmp_path), tier_load_policy="always")

    cold = run(LLM("builtin:tiny", num_pages=64, kv_cache_dtype="int8"), A)
    llm = tiered()
    run(llm, A)
    run(llm, B)  # evicts A's pages 2..8 into one file
    llm.engine.tiers.flush()
    fp = llm.engine.tiers.fingerprint
    (path,) = list(tmp_path.glob("*.kvpg"))
    g = decode(path.read_bytes(), fp)
    assert g.dtype == "int8" and g.page_shape == (2, 4, 16, 4, 36)
    path.write_bytes(encode(PageGroup(g.fingerprint, g.hashes, g.token_ids, "bfloat16",
                                      (2, 4, 16, 4, 18), g.payload)))
    out = run(llm, A)
    same(out, cold)
    s = llm.stats()
    assert out.num_cached_tokens == 2 * 16 and s["disk_tier_hit_tokens"] == 0
    assert s["disk_tier_corrupt"] == 1 and not path.exists()


def test_router_checks_the_replicas_kv_dtype():
    from prefixcache.router.cli import check_flags
    from prefixcache.router.replica_info import ReplicaInfo, agreed

    def info(kv: str) -> ReplicaInfo:
        return ReplicaInfo(("m",), "builtin:tiny", 16, kv,
                           f"builtin:tiny|kv={kv}|bs=16|layout=1", "0" * 32)

    def flags(**kw) -> argparse.Namespace:
        return argparse.Namespace(**({"served_model_name": None, "block_size": None,
                                      "dtype": None, "kv_cache_dtype": None} | kw))

    check_flags(flags(kv_cache_dtype="int8"), info("int8"))
    with pytest.raises(ValueError, match="^kv_dtype: --kv-cache-dtype 'int8' disagrees"):
        check_flags(flags(kv_cache_dtype="int8"), info("bfloat16"))
    with pytest.raises(ValueError, match="^replicas disagree on kv_dtype"):
        agreed({"http://a": info("float32"), "http://b": info("bfloat16")})
