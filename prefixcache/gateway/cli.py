"""``prefixcache gateway``: the caching gateway in front of one or more upstreams.

    prefixcache gateway --upstream NAME=URL[,provider=P][,models=A|B][,key-env=VAR] ... \\
        [--api-keys keys.json] [--tenant-policy policy.json] \\
        [--cache-store memory|redis://host:port/0] --host 127.0.0.1 --port 8100

``--tenant-policy`` is a JSON object ``{tenant: {"cache_ttl_s": 3600, "cache_sampled":
false, "semantic": false, "store_finish_reasons": ["stop", "length"]}}``, ``"*"`` for
every other tenant.
"""
from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from prefixcache.gateway.upstreams import parse_upstream
from prefixcache.http.bodies import DEFAULT_MAX_BODY_BYTES
from prefixcache.http.flags import add_runner_flags, check_runner_flags


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "gateway", help="caching gateway in front of OpenAI/Anthropic/DeepSeek/our servers",
        description="Serve /v1/chat/completions, /v1/completions and /v1/messages with an "
                    "exact response cache (and an opt-in semantic one), shaping requests "
                    "so that the upstream's prefix cache hits.")
    p.add_argument("--upstream", action="append", required=True, metavar="SPEC",
                   help="NAME=URL[,provider=openai|anthropic|deepseek|prefixcache|vllm]"
                        "[,models=A|B][,key-env=VAR][,timeout-s=S]; repeatable")
    p.add_argument("--api-keys", default=None, metavar="FILE",
                   help="the gateway's own key file (prefixcache serve's format); the tenant "
                        "comes from the key (default: none, single tenant)")
    p.add_argument("--tenant-policy", default=None, metavar="FILE",
                   help="JSON {tenant: {cache_ttl_s, cache_sampled, semantic, "
                        "store_finish_reasons}}, '*' for the default")
    p.add_argument("--cache-store", default="memory", metavar="STORE",
                   help="'memory' (an in-process LRU) or redis://host:port/db")
    p.add_argument("--cache-entries", type=_int_at_least(1), default=10_000, metavar="N",
                   help="entries of the in-process LRU (>= 1)")
    p.add_argument("--semantic-threshold", type=_cosine, default=None, metavar="COSINE",
                   help="layer 2's cosine threshold in (0, 1] (default: the semantic "
                        "cache's own, strict)")
    p.add_argument("--max-body-bytes", type=_int_at_least(1024),
                   default=DEFAULT_MAX_BODY_BYTES, metavar="BYTES",
                   help="largest request body, bytes (>= 1024; 413 beyond)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind")
    p.add_argument("--port", type=_port, default=8100,
                   help="TCP port to listen on (1-65535)")
    add_runner_flags(p)
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"],
                   help="log threshold")
    return p


def _cosine(text: str) -> float:
    """``--semantic-threshold``: a finite float in (0, 1]."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < v <= 1:  # False for NaN too
        raise argparse.ArgumentTypeError(f"must be in (0, 1], not {text}")
    return v


def _int_at_least(low: int):
    """An argparse type: an integer >= ``low``."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, not {v}")
        return v

    return parse


def _port(text: str) -> int:
    v = _int_at_least(1)(text)
    if v > 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port (1-65535), not {v}")
    return v


def load_policies(path: str | None):
    """Read ``--tenant-policy`` strictly (:mod:`prefixcache.gateway.policy`). Raises
    ValueError ``"--tenant-policy: TENANT.FIELD: problem"``."""
    from prefixcache.gateway.policy import parse_policies

    if path is None:
        return {}
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"--tenant-policy: {path}: not JSON: {exc}") from None
    try:
        return parse_policies(data)
    except ValueError as exc:
        raise ValueError(f"--tenant-policy: {exc}") from None


def build_app(args: argparse.Namespace):
    """The gateway app for ``args``. Raises ValueError / KeyFileError / OSError."""
    from prefixcache.gateway.app import create_app, make_client
    from prefixcache.gateway.service import Gateway
    from prefixcache.gateway.store import open_store
    from prefixcache.gateway.upstreams import Upstream
    from prefixcache.http.auth import Authenticator
    from prefixcache.http.flags import check_port

    specs = [parse_upstream(s) for s in args.upstream]
    if len({s.name for s in specs}) != len(specs):
        raise ValueError("--upstream names must be unique")
    policies = load_policies(args.tenant_policy)
    auth = Authenticator.from_file(args.api_keys)
    semantic = None
    if any(p.semantic for p in policies.values()):
        semantic = _semantic_cache(args)
    if args.cache_entries < 1:
        raise ValueError("--cache-entries must be >= 1")
    if args.max_body_bytes < 1024:
        raise ValueError("--max-body-bytes must be at least 1024")
    check_runner_flags(args)
    check_port(args.host, args.port)
    client = make_client()
    gateway = Gateway([Upstream(s, client) for s in specs],
                      open_store(args.cache_store, args.cache_entries),
                      policies=policies, semantic=semantic)
    return create_app(gateway, auth, max_body_bytes=args.max_body_bytes,
                      shutdown_grace_s=args.shutdown_grace_s)


def _semantic_cache(args: argparse.Namespace):
    """Layer 2 (only when a tenant enables it): MiniLM embeddings, persisted in the Redis
    of ``--cache-store`` when there is one."""
    try:
        from prefixcache.gateway.semantic.cache import SemanticCache
        from prefixcache.gateway.semantic.embedder import MiniLMEmbedder
    except ImportError:
        raise ValueError("--tenant-policy enables 'semantic', but the semantic layer "
                         "(prefixcache.gateway.semantic) is not installed") from None
    redis_url = args.cache_store if args.cache_store != "memory" else None
    kw = {} if args.semantic_threshold is None else {"threshold": args.semantic_threshold}
    return SemanticCache(MiniLMEmbedder(), redis_url=redis_url, **kw)


def run(args: argparse.Namespace) -> int:
    from prefixcache.http.logsafe import SafeFormatter
    from prefixcache.http.runner import serve

    handler = logging.StreamHandler()
    handler.setFormatter(SafeFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=args.log_level.upper(), handlers=[handler])
    app = build_app(args)
    serve(app, host=args.host, port=args.port, drain=app.state.drain,
          header_timeout_s=args.header_timeout_s, log_level=args.log_level,
          access_log=not args.no_access_log)
    return 0
