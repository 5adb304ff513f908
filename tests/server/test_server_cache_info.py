"""``GET /v1/cache/info``: what a router needs to hash like this server. The seed itself
goes to admin callers only: without a key file, only when ``--allow-reset`` makes every
caller one."""
from __future__ import annotations

import os

import httpx
from starlette.testclient import TestClient

from prefixcache.cache.hashing import seed_digest
from prefixcache.config import DEFAULT_HASH_ROOT_SEED, HASH_SEED_ENV, EngineConfig
from prefixcache.engine.engine import LLMEngine
from prefixcache.http.auth import Authenticator
from prefixcache.server.app import ServerSettings, create_app


def test_the_live_single_tenant_server_with_allow_reset_gives_the_seed(server):
    info = httpx.get(server.base + "/v1/cache/info", timeout=60).json()
    seed = os.environ.get(HASH_SEED_ENV) or DEFAULT_HASH_ROOT_SEED
    assert info["served_model_names"] == ["tiny", "builtin:tiny"]
    assert info["model"] == "builtin:tiny" and info["block_size"] == 16
    assert info["hash_root_seed"] == seed
    assert info["hash_root_seed_digest"] == seed_digest(seed)


def test_without_allow_reset_only_the_digest_is_given():
    engine = LLMEngine(EngineConfig(model="builtin:tiny", num_pages=16, block_size=8,
                                    dtype="bf16", hash_root_seed="a-random-secret"))
    for allow_reset, seed in ((False, None), (True, "a-random-secret")):
        app = create_app(engine, ServerSettings(
            model_names=["m1", "m2"], model_root="builtin:tiny",
            auth=Authenticator(None, allow_reset=allow_reset)))
        info = TestClient(app).get("/v1/cache/info").json()  # no lifespan: no engine thread
        want = {"object": "cache.info", "model": "builtin:tiny",
                "served_model_names": ["m1", "m2"],
                "model_fingerprint": "builtin:tiny|kv=bfloat16|bs=8|layout=1",
                "block_size": 8, "kv_dtype": "bfloat16", "page_hash": "blake2b-128",
                "max_model_len": engine.max_model_len,
                "hash_root_seed_digest": seed_digest("a-random-secret")}
        assert info == (want if seed is None else {**want, "hash_root_seed": seed})
    engine.close()
