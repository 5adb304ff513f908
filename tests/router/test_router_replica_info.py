"""``GET /v1/cache/info`` on ``serve``, and the router set up from it: no ``--model``
needed, the replicas' served names advertised and accepted, their hash seed read with an
admin key (or given and checked against its digest), and a refusal to start naming the
field when replicas disagree with each other or with a flag."""
from __future__ import annotations

import argparse
import dataclasses
import json
import os

import httpx
import pytest

from prefixcache import LLM
from prefixcache.cache.hashing import seed_digest
from prefixcache.config import DEFAULT_HASH_ROOT_SEED, HASH_SEED_ENV
from prefixcache.router.cli import add_parser, build_router_app
from prefixcache.router.replica_info import CHECKED, ReplicaInfo, agreed, mismatch
from tests.router.conftest import RouterThread
from tests.server.live import LiveServer, free_port

ALICE = {"Authorization": "Bearer sk-alice"}
OPS = {"Authorization": "Bearer sk-ops"}  # the key file's admin key
SEED = "s3cret-odd-replica"


@pytest.fixture(scope="module")
def odd_replica(tmp_path_factory, keys_file):
    """A replica served as ``tiny-b`` with 32-token pages and its own hash seed."""
    srv = LiveServer(["--api-keys", str(keys_file), "--served-model-name", "tiny-b",
                      "--block-size", "32", "--hash-root-seed", SEED],
                     tmp_path_factory.mktemp("odd") / "server.log")
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def alice_only(tmp_path_factory):
    """A key file with no admin key: the router cannot read the seed with it."""
    path = tmp_path_factory.mktemp("alice-keys") / "keys.json"
    path.write_text(json.dumps({"sk-alice": {"tenant": "alice", "admin": False}}))
    return path


def _build(*argv: str):
    sub = argparse.ArgumentParser().add_subparsers()
    args = add_parser(sub).parse_args(["--port", str(free_port()), "--startup-timeout-s", "5",
                                       *argv])
    return build_router_app(args)


def test_serve_reports_what_it_serves_and_how_it_keys_its_pages(replicas, odd_replica):
    base = replicas[0].base
    r = httpx.get(base + "/v1/cache/info", timeout=60)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    seed = os.environ.get(HASH_SEED_ENV) or DEFAULT_HASH_ROOT_SEED
    max_len = httpx.get(base + "/v1/models", headers=ALICE, timeout=60).json()[
        "data"][0]["max_model_len"]
    info = httpx.get(base + "/v1/cache/info", headers=ALICE, timeout=60).json()
    assert info == {"object": "cache.info", "model": "builtin:tiny",
                    "served_model_names": ["builtin:tiny"],
                    "model_fingerprint": "builtin:tiny|kv=float32|bs=16|layout=1",
                    "block_size": 16, "kv_dtype": "float32", "page_hash": "blake2b-128",
                    "max_model_len": max_len, "hash_root_seed_digest": seed_digest(seed)}
    # the seed itself only to an admin key
    admin = httpx.get(base + "/v1/cache/info", headers=OPS, timeout=60).json()
    assert admin == {**info, "hash_root_seed": seed}
    odd = httpx.get(odd_replica.base + "/v1/cache/info", headers=ALICE, timeout=60).json()
    assert (odd["served_model_names"], odd["block_size"], odd["model_fingerprint"]) == (
        ["tiny-b"], 32, "builtin:tiny|kv=float32|bs=32|layout=1")
    assert odd["hash_root_seed_digest"] == seed_digest(SEED) != info["hash_root_seed_digest"]
    assert "hash_root_seed" not in odd


def test_the_router_needs_no_model_flag_and_serves_the_replicas_names_and_seed(
        odd_replica, keys_file):
    router = RouterThread(["--api-keys", str(keys_file), "--replica", odd_replica.base])
    try:
        models = httpx.get(router.base + "/v1/models", headers=ALICE, timeout=60).json()
        assert [m["id"] for m in models["data"]] == ["tiny-b"]
        for name in ("tiny-b", "builtin:tiny"):  # a served name, and the replica's --model
            r = httpx.post(router.base + "/v1/completions", headers=ALICE, timeout=60,
                           json={"model": name, "prompt": "hello there", "max_tokens": 1})
            assert r.status_code == 200, r.text
            assert r.json()["model"] == name  # the replica answers it
        r = httpx.post(router.base + "/v1/completions", headers=ALICE, timeout=60,
                       json={"model": "nope", "prompt": "x", "max_tokens": 1})
        assert r.status_code == 404
        assert r.json()["error"]["message"] == ("The model `nope` does not exist. Served: "
                                                "tiny-b, builtin:tiny")
        # the seed was read with the admin key: the router hashes like the replica
        keys = router.app.state.router.settings.keys
        assert keys.block_size == 32
        ids = list(range(3, 3 + 128))
        engine = LLM("builtin:tiny", num_pages=16, block_size=32, hash_root_seed=SEED).engine
        pt = engine.cache.new_page_table("x", ids, tenant="alice")
        want = engine.cache.page_hashes(pt, 4)
        engine.cache.free(pt)
        assert keys.page_hashes(ids, "alice", None) == want
    finally:
        router.stop()


def test_without_an_admin_key_the_seed_must_be_given_and_is_checked(odd_replica, alice_only):
    keys = ["--api-keys", str(alice_only), "--replica", odd_replica.base]
    with pytest.raises(ValueError, match=r"^hash_root_seed: the replicas hash pages under "
                                         r"another root seed than the default one"):
        _build(*keys)
    with pytest.raises(ValueError, match=r"^hash_root_seed: .* than --hash-root-seed"):
        _build(*keys, "--hash-root-seed", "wrong")
    app = _build(*keys, "--hash-root-seed", SEED)
    assert app.state.router.settings.keys.keys.hasher.root_seed == SEED.encode()


def test_replicas_that_disagree_or_flags_that_disagree_refuse_the_start(
        replicas, odd_replica, keys_file):
    keys = ["--api-keys", str(keys_file)]
    with pytest.raises(ValueError) as exc:
        _build(*keys, "--replica", replicas[0].base, "--replica", odd_replica.base)
    assert str(exc.value).startswith(
        f"replicas disagree on served_model_names: {replicas[0].base} has ['builtin:tiny'], "
        f"{odd_replica.base} has ['tiny-b']")
    odd = [*keys, "--replica", odd_replica.base]
    for flags, field in [(["--block-size", "16"], "block_size"),
                         (["--dtype", "bf16"], "kv_dtype"),
                         (["--served-model-name", "tiny"], "served_model_names"),
                         (["--hash-root-seed", "wrong"], "hash_root_seed"),
                         (["--model", "no/such/model/dir"], "model")]:
        with pytest.raises(ValueError, match=rf"^{field}: "):
            _build(*odd, *flags)
    # flags that agree are accepted
    app = _build(*odd, "--model", "builtin:tiny", "--block-size", "32", "--dtype", "float32",
                 "--served-model-name", "tiny-b", "--hash-root-seed", SEED)
    assert app.state.router.settings.model_names == ["tiny-b"]


def test_no_replica_answering_refuses_the_start():
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ValueError, match=r"^no replica answered GET /v1/cache/info within "
                                         r"1 s \(--startup-timeout-s\): http"):
        sub = argparse.ArgumentParser().add_subparsers()
        build_router_app(add_parser(sub).parse_args(
            ["--port", str(free_port()), "--startup-timeout-s", "1", "--replica", dead]))


def test_agreement_names_each_field():
    base = ReplicaInfo(("m",), "builtin:tiny", 16, "float32", "fp", "d" * 32)
    other = {"served_model_names": ("n",), "model": "x", "block_size": 32,
             "kv_dtype": "bfloat16", "model_fingerprint": "fp2",
             "hash_root_seed_digest": "e" * 32}
    assert set(other) == set(CHECKED)
    for name, value in other.items():
        changed = dataclasses.replace(base, **{name: value})
        assert mismatch(base, changed) == name
        with pytest.raises(ValueError, match=rf"^replicas disagree on {name}: a has "):
            agreed({"a": base, "b": changed})
    with_seed = dataclasses.replace(base, hash_root_seed="s")
    assert mismatch(base, with_seed) is None
    assert agreed({"a": base, "b": with_seed}) is with_seed
    with pytest.raises(ValueError, match="block_size is not a positive integer"):
        ReplicaInfo.from_json("u", {"served_model_names": ["m"], "block_size": True})
