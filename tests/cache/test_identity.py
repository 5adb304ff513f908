"""The model fingerprint and page keys, computed by the cache core alone: exact values,
equal to what the engine computed when the fingerprint lived next to its KV pool."""
from __future__ import annotations

import torch

from prefixcache.cache.identity import (
    KV_LAYOUT_VERSION,
    kv_dtype_name,
    model_fingerprint,
    tier_fingerprint,
)
from prefixcache.cache.manager import KVCacheManager
from prefixcache.cache.page_keys import PromptKeys

TINY = "builtin:tiny|kv=float32|bs=16|layout=1"


def test_fingerprint_exact_for_torch_dtypes_and_their_names():
    assert KV_LAYOUT_VERSION == 1
    assert model_fingerprint("builtin:tiny", torch.float32, 16) == TINY
    assert model_fingerprint("builtin:tiny", "float32", 16) == TINY
    assert model_fingerprint("hf:Org/M@abc", torch.bfloat16, 8) == \
        "hf:Org/M@abc|kv=bfloat16|bs=8|layout=1"
    assert [kv_dtype_name(d) for d in (torch.float16, "float16", torch.int8)] == [
        "float16", "float16", "int8"]
    assert tier_fingerprint(TINY).hex() == "3a839d8f8d68f87765512ca05ef2845d"
    assert tier_fingerprint(model_fingerprint("builtin:tiny", "float32", 8)) != \
        tier_fingerprint(TINY)


def test_prompt_keys_equal_the_pool_keys_exactly():
    tokens = list(range(1, 41))
    keys = PromptKeys(TINY, "prefixcache/v1", 16)
    mgr = KVCacheManager(8, 16, model_id=TINY, root_seed="prefixcache/v1")
    for tenant, salt, want in [
            (None, None, ["a0fa6df2f7eee8de8ad42da7708a9029",
                          "26a2a4e1c835d6f8e0a4f105b19bb68d"]),
            ("acme", "salt", ["b1b345f7fbbe2e7e6bf7602c8014a654",
                              "fd686f24cb1f6d5c816ac41a64be371e"])]:
        assert [h.hex() for h in keys.page_hashes(tokens, tenant, salt)] == want
        pt = mgr.new_page_table(f"r-{tenant}", tokens, tenant=tenant, cache_salt=salt)
        assert [h.hex() for h in mgr.page_hashes(pt, 2)] == want
    # another tenant, salt or model never shares a key
    other = PromptKeys(model_fingerprint("builtin:tiny", "bfloat16", 16), "prefixcache/v1", 16)
    assert not set(other.page_hashes(tokens, None, None)) & set(
        keys.page_hashes(tokens, None, None))
