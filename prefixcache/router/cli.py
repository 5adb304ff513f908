"""``prefixcache router``: a cache-aware OpenAI-compatible proxy over N replicas.

    prefixcache router --replica http://127.0.0.1:8001,events=tcp://127.0.0.1:5557 \\
        --replica http://127.0.0.1:8002,events=tcp://127.0.0.1:5558 --port 8000 \\
        [--model M] [--api-keys keys.json] [--block-size 16]

``--model`` (and ``--revision``), ``--block-size``, ``--dtype``, ``--api-keys`` and
``$PREFIXCACHE_HASH_SEED`` must be the replicas' own: the router computes their page hashes
(it loads the model's tokenizer and chat template, not its weights).
"""
from __future__ import annotations

import argparse
import logging

from prefixcache.config import hash_root_seed_from_env
from prefixcache.model.registry import DEFAULT_MODEL
from prefixcache.router.index import DEFAULT_APPROX_TTL_S, DEFAULT_MAX_PAGES
from prefixcache.router.policy import (
    DEFAULT_BALANCE_ABS_TOKENS,
    DEFAULT_BALANCE_REL,
    DEFAULT_DECODE_WEIGHT,
    MODES,
)
from prefixcache.router.specs import ReplicaSpec
from prefixcache.server.bodies import DEFAULT_MAX_BODY_BYTES


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
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help="the replicas' --model (its tokenizer and chat template are loaded)")
    p.add_argument("--revision", default=None,
                   help="the replicas' --revision of a hub id --model (its commit is part of "
                        "the page keys); default: main")
    p.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                   help="the replicas' --served-model-name (default: as serve derives it)")
    p.add_argument("--block-size", type=int, default=16, help="the replicas' KV page size, "
                   "tokens")
    p.add_argument("--dtype", default="float32", help="the replicas' --dtype (part of the "
                   "model fingerprint in every page hash)")
    p.add_argument("--hash-root-seed", default=None, metavar="SEED",
                   help="the replicas' --hash-root-seed (part of every page hash); default: "
                        "$PREFIXCACHE_HASH_SEED, as for serve")
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
    """The app for ``args``. Raises ValueError / OSError on bad arguments."""
    from prefixcache.config import resolve_dtype
    from prefixcache.engine.kv_tiers import model_fingerprint
    from prefixcache.model.loader import load_tokenizer
    from prefixcache.router.app import RouterSettings, create_router_app
    from prefixcache.router.index import PageIndex
    from prefixcache.router.policy import Policy
    from prefixcache.router.prompt_keys import PromptKeys
    from prefixcache.router.replicas import ReplicaSet
    from prefixcache.server.auth import Authenticator
    from prefixcache.server.cli import check_port, served_name

    if args.block_size < 1:
        raise ValueError(f"--block-size must be >= 1, got {args.block_size}")
    if not args.health_interval_s > 0:
        raise ValueError("--health-interval-s must be > 0")
    specs = [ReplicaSpec.parse(text) for text in args.replica]
    policy = Policy(args.balance_abs_tokens, args.balance_rel, args.decode_weight,
                    args.policy)
    index = PageIndex(args.max_index_pages, args.approx_ttl_s)
    auth = Authenticator.from_file(args.api_keys)
    check_port(args.host, args.port)
    dtype = resolve_dtype(args.dtype)
    tokenizer, cache_id = load_tokenizer(args.model, args.revision)
    fingerprint = model_fingerprint(cache_id, dtype, args.block_size)
    settings = RouterSettings(
        model_names=(args.served_model_name or [served_name(args.model)]) + [args.model],
        tokenizer=tokenizer,
        keys=PromptKeys(fingerprint, args.hash_root_seed or hash_root_seed_from_env(),
                        args.block_size),
        auth=auth, max_body_bytes=args.max_body_bytes,
        health_interval_s=args.health_interval_s)
    return create_router_app(ReplicaSet(specs, index, policy), settings)


def run(args: argparse.Namespace) -> int:
    import uvicorn

    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = build_router_app(args)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0
