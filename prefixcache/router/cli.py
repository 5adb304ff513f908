"""``prefixcache router``: a cache-aware OpenAI-compatible proxy over N replicas.

    prefixcache router --replica http://127.0.0.1:8001,events=tcp://127.0.0.1:5557 \\
        --replica http://127.0.0.1:8002,events=tcp://127.0.0.1:5558 --port 8000 \\
        [--api-keys keys.json]

The router computes the replicas' page hashes (it loads the model's tokenizer and chat
template, not its weights) and accepts their model names. It learns all of that from the
replicas' ``GET /v1/cache/info`` (:mod:`.replica_info`): their served names, ``--model``,
block size, KV dtype and model fingerprint, and their hash seed (read with an admin key of
``--api-keys``; without one, ``--hash-root-seed`` or ``$PREFIXCACHE_HASH_SEED`` must give
it, checked against the seed's digest). ``--model`` (with ``--revision`` for a hub id),
``--served-model-name``, ``--block-size``, ``--dtype`` and the seed are optional; given,
they must agree with the replicas, and replicas must agree with each other, or the router
refuses to start naming the field. ``--api-keys`` must be the replicas' key file (it
authenticates the clients).
"""
from __future__ import annotations

import argparse
import logging
import os

from prefixcache.http.bodies import DEFAULT_MAX_BODY_BYTES
from prefixcache.http.flags import add_runner_flags, check_runner_flags
from prefixcache.router.index import DEFAULT_APPROX_TTL_S, DEFAULT_MAX_PAGES
from prefixcache.router.policy import (
    DEFAULT_BALANCE_ABS_TOKENS,
    DEFAULT_BALANCE_REL,
    DEFAULT_DECODE_WEIGHT,
    MODES,
)
from prefixcache.router.replica_info import ReplicaInfo
from prefixcache.router.specs import ReplicaSpec


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "router", help="cache-aware router over replicas",
        description="Route OpenAI requests (/v1/completions, /v1/chat/completions) to the "
                    "replica with the lowest cost: pages it would prefill plus its queued "
                    "work, from an index fed by the replicas' KV events.")
    p.add_argument("--replica", action="append", required=True, type=replica_arg,
                   metavar="URL[,events=EP[,replay=EP]]",
                   help="a replica's base URL, optionally with its KV event endpoints: "
                        "URL,events=tcp://HOST:PORT[,replay=tcp://HOST:PORT] (or ipc://PATH); "
                        "repeat per replica")
    p.add_argument("--host", default="127.0.0.1", help="address to bind")
    p.add_argument("--port", type=int, default=8000, help="TCP port to listen on")
    p.add_argument("--model", default=None,
                   help="the replicas' --model, whose tokenizer and chat template are "
                        "loaded (default: the one they report; give it when their path "
                        "differs here; its fingerprint must be theirs)")
    p.add_argument("--revision", default=None,
                   help="the replicas' --revision of a hub id --model (its commit is part of "
                        "the page keys); default: main")
    p.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                   help="the replicas' --served-model-name (default: as they report; "
                        "given, it must agree)")
    p.add_argument("--block-size", type=int, default=None,
                   help="the replicas' KV page size, tokens (default: as they report; "
                        "given, it must agree)")
    p.add_argument("--dtype", default=None, help="the replicas' KV dtype as their --dtype "
                   "(when their --kv-cache-dtype is auto; default: as they report; given, it "
                   "must agree)")
    p.add_argument("--kv-cache-dtype", default=None, metavar="DTYPE",
                   help="the replicas' KV dtype (default: as they report; given, it must "
                        "agree; replicas of different KV dtypes are refused: their pages "
                        "are keyed apart)")
    p.add_argument("--hash-root-seed", default=None, metavar="SEED",
                   help="the replicas' page-hash root seed (default: read from them with an "
                        "admin key of --api-keys, else $PREFIXCACHE_HASH_SEED, else the "
                        "default seed; checked against the digest they report)")
    p.add_argument("--startup-timeout-s", type=float, default=60.0, metavar="SECONDS",
                   help="how long to wait at start for the replicas' GET /v1/cache/info; "
                        "one that has not answered takes no request until it does and "
                        "agrees, and with none the router does not start")
    p.add_argument("--api-keys", default=None, metavar="FILE",
                   help="the replicas' key file (default: none, single tenant)")
    p.add_argument("--max-index-pages", type=int, default=DEFAULT_MAX_PAGES,
                   help="most page hashes the index holds (LRU beyond), pages")
    p.add_argument("--approx-ttl-s", type=float, default=DEFAULT_APPROX_TTL_S,
                   help="lifetime of a routing-time entry not confirmed by a KV event, "
                        "seconds")
    p.add_argument("--balance-abs-tokens", type=int, default=DEFAULT_BALANCE_ABS_TOKENS,
                   help="load gap beyond which a replica can be overloaded, tokens")
    p.add_argument("--balance-rel", type=float, default=DEFAULT_BALANCE_REL,
                   help="load ratio beyond which a replica can be overloaded")
    p.add_argument("--decode-weight", type=int, default=DEFAULT_DECODE_WEIGHT,
                   help="load of one running request, tokens")
    p.add_argument("--policy", choices=MODES, default="cache_aware",
                   help="cache_aware (pages to prefill + queued load) or round_robin "
                        "(the baseline)")
    p.add_argument("--health-interval-s", type=float, default=1.0,
                   help="seconds between health checks of each replica")
    p.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                   metavar="BYTES", help="largest request body, bytes (413 beyond)")
    add_runner_flags(p)
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"],
                   help="log threshold")
    return p


def replica_arg(text: str) -> str:
    """``--replica``'s type: the spec checked at parse time (a bad one is an argparse
    error naming ``--replica``), kept as text for :func:`build_router_app`."""
    try:
        ReplicaSpec.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--replica: ")) from None
    return text


def build_router_app(args: argparse.Namespace):
    """The app for ``args``, set up from the replicas' ``GET /v1/cache/info``. Raises
    ValueError / OSError on bad arguments, and ValueError naming the field when replicas
    disagree with each other or with a flag."""
    from prefixcache.cache.page_keys import PromptKeys
    from prefixcache.http.auth import Authenticator
    from prefixcache.http.flags import check_port
    from prefixcache.router.app import RouterSettings, create_router_app
    from prefixcache.router.index import PageIndex
    from prefixcache.router.policy import Policy
    from prefixcache.router.replica_info import agreed, fetch_all, info_key
    from prefixcache.router.replicas import ReplicaSet

    if args.block_size is not None and args.block_size < 1:
        raise ValueError(f"--block-size must be >= 1, got {args.block_size}")
    if not args.health_interval_s > 0:
        raise ValueError("--health-interval-s must be > 0")
    if not args.startup_timeout_s >= 0:
        raise ValueError("--startup-timeout-s must be >= 0")
    check_runner_flags(args)
    specs = [ReplicaSpec.parse(text) for text in args.replica]
    policy = Policy(args.balance_abs_tokens, args.balance_rel, args.decode_weight,
                    args.policy)
    index = PageIndex(args.max_index_pages, args.approx_ttl_s)
    auth = Authenticator.from_file(args.api_keys)
    check_port(args.host, args.port)
    key = info_key(args.api_keys)
    infos = fetch_all([spec.url for spec in specs], key, args.startup_timeout_s)
    info = agreed({specs[i].url: infos[i] for i in sorted(infos)})
    check_flags(args, info)
    tokenizer = load_replica_tokenizer(args.model, info, args.revision)
    settings = RouterSettings(
        model_names=list(info.served_model_names), model_root=info.model,
        tokenizer=tokenizer,
        keys=PromptKeys(info.model_fingerprint, root_seed(args, info), info.block_size),
        auth=auth, max_body_bytes=args.max_body_bytes,
        health_interval_s=args.health_interval_s, replica_info=info, info_key=key,
        shutdown_grace_s=args.shutdown_grace_s)
    replicas = ReplicaSet(specs, index, policy)
    for i in range(len(specs)):
        if i not in infos:
            replicas.set_verified(i, False)
    return create_router_app(replicas, settings)


def check_flags(args: argparse.Namespace, info: ReplicaInfo) -> None:
    """Raises ValueError naming the field when a flag given disagrees with the
    replicas."""
    from prefixcache.config import dtype_name

    given = [("--served-model-name", "served_model_names", args.served_model_name),
             ("--block-size", "block_size", args.block_size),
             ("--dtype", "kv_dtype", None if args.dtype is None else dtype_name(args.dtype)),
             ("--kv-cache-dtype", "kv_dtype", args.kv_cache_dtype)]
    for flag, name, value in given:
        theirs = info.field(name)
        if value is not None and value != theirs:
            raise ValueError(f"{name}: {flag} {value!r} disagrees with the replicas' "
                             f"{theirs!r} (GET /v1/cache/info); leave the flag out or fix it")


def load_replica_tokenizer(model: str | None, info: ReplicaInfo,
                           revision: str | None = None):
    """The tokenizer of ``model`` (default: the replicas' ``model``), checked to be the
    replicas' model: same fingerprint under their dtype and block size.

    Raises:
        ValueError: it cannot be loaded here, or it is another model (naming the field).
    """
    from prefixcache.cache.identity import model_fingerprint
    from prefixcache.model.loader import load_tokenizer

    name = model or info.model
    try:
        tokenizer, cache_id = load_tokenizer(name, revision)
    except (OSError, ValueError) as exc:
        hint = "" if model else "; give --model with the same model as found here"
        raise ValueError(f"model: the router cannot load {name!r} ({exc}){hint}") from None
    mine = model_fingerprint(cache_id, info.kv_dtype, info.block_size)
    if mine != info.model_fingerprint:
        flag = f"--model {name!r}" if model else f"the replicas' model {name!r} as found here"
        raise ValueError(f"model_fingerprint: {flag} gives {mine!r}, the replicas report "
                         f"{info.model_fingerprint!r}; the router must load their model")
    return tokenizer


def root_seed(args: argparse.Namespace, info: ReplicaInfo) -> str:
    """The replicas' page-hash root seed: read from them (admin key), else the one given
    to the router (flag, environment, default), checked against their digest.

    Raises:
        ValueError: the seed given disagrees with theirs (naming ``hash_root_seed``).
    """
    from prefixcache.cache.hashing import seed_digest
    from prefixcache.config import DEFAULT_HASH_ROOT_SEED, HASH_SEED_ENV

    given = args.hash_root_seed or os.environ.get(HASH_SEED_ENV) or None
    where = "--hash-root-seed" if args.hash_root_seed else f"${HASH_SEED_ENV}"
    if info.hash_root_seed is not None:
        if given is not None and given != info.hash_root_seed:
            raise ValueError(f"hash_root_seed: {where} disagrees with the replicas' seed")
        return info.hash_root_seed
    seed = given or DEFAULT_HASH_ROOT_SEED
    if seed_digest(seed) != info.hash_root_seed_digest:
        raise ValueError(
            "hash_root_seed: the replicas hash pages under another root seed than "
            f"{where if given else 'the default one'}; give the router their seed "
            f"(--hash-root-seed or ${HASH_SEED_ENV}) or an admin key in --api-keys, "
            "with which it reads it from their GET /v1/cache/info")
    return seed


def run(args: argparse.Namespace) -> int:
    from prefixcache.http.logsafe import SafeFormatter
    from prefixcache.http.runner import serve

    handler = logging.StreamHandler()
    handler.setFormatter(SafeFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=args.log_level.upper(), handlers=[handler])
    app = build_router_app(args)
    serve(app, host=args.host, port=args.port, drain=app.state.drain,
          header_timeout_s=args.header_timeout_s, log_level=args.log_level,
          access_log=not args.no_access_log)
    return 0
