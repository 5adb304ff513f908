"""``prefixcache serve``: the OpenAI-compatible HTTP server.

    prefixcache serve --model builtin:tiny --host 127.0.0.1 --port 8000 \\
        [--served-model-name NAME ...] [--api-keys keys.json] [--allow-reset] \\
        [--allowed-hosts HOST ...] [--shutdown-grace-s 30] [--header-timeout-s 10]
"""
from __future__ import annotations

import argparse
import logging
import sys

from prefixcache.engine.args import add_engine_args, config_from_args
from prefixcache.server.bodies import DEFAULT_MAX_BODY_BYTES
from prefixcache.server.drain import DEFAULT_GRACE_S
from prefixcache.server.http_server import DEFAULT_HEADER_TIMEOUT_S

log = logging.getLogger("prefixcache.server")


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "serve", help="OpenAI-compatible HTTP server",
        description="Serve a model over the OpenAI API (/v1/completions, "
                    "/v1/chat/completions, /v1/models), with /health, /metrics and "
                    "/reset_prefix_cache.")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                   help="names clients use as `model` (default: the --model argument); the "
                        "first is reported")
    p.add_argument("--api-keys", default=None, metavar="FILE",
                   help='JSON {"<key>": {"tenant": "<id>", "admin": false}}; keys are required '
                        "and each key's tenant gets its own cache namespace")
    p.add_argument("--allow-reset", action="store_true",
                   help="without --api-keys: let anyone call POST /reset_prefix_cache")
    p.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                   help="largest request body (413 beyond; default 2 MiB)")
    p.add_argument("--allowed-hosts", nargs="+", default=None, metavar="HOST",
                   help="Host header names answered, 421 for others (DNS rebinding); '*' "
                        "for any. Default without --api-keys: the --host address and "
                        "localhost (any host when bound to 0.0.0.0 or ::); with "
                        "--api-keys: any")
    p.add_argument("--shutdown-grace-s", type=float, default=DEFAULT_GRACE_S,
                   help="on SIGTERM, stop admitting and let running requests finish for "
                        "this long; then they end with a server_shutting_down error "
                        "(default 30)")
    p.add_argument("--header-timeout-s", type=float, default=DEFAULT_HEADER_TIMEOUT_S,
                   help="close a connection whose request headers are not complete after "
                        "this long (default 10)")
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"])
    p.add_argument("--no-access-log", action="store_true", help="no per-request log lines")
    add_engine_args(p.add_argument_group("engine"), model_required=True)
    return p


def build_app(args: argparse.Namespace):
    """The app for ``args`` (loads the model). Raises ValueError / KeyFileError /
    FileNotFoundError on bad arguments."""
    from prefixcache.engine.engine import LLMEngine
    from prefixcache.server.app import ServerSettings, create_app
    from prefixcache.server.auth import Authenticator

    auth = Authenticator.from_file(args.api_keys, allow_reset=args.allow_reset)
    if args.max_body_bytes < 1024:
        raise ValueError("--max-body-bytes must be at least 1024")
    if not args.shutdown_grace_s >= 0:
        raise ValueError("--shutdown-grace-s must be >= 0")
    if not args.header_timeout_s > 0:
        raise ValueError("--header-timeout-s must be > 0")
    allowed = allowed_hosts(args, auth.enabled)
    engine = LLMEngine(config_from_args(args))
    names = args.served_model_name or [args.model]
    settings = ServerSettings(model_names=names, model_root=args.model, auth=auth,
                              max_body_bytes=args.max_body_bytes, allowed_hosts=allowed,
                              shutdown_grace_s=args.shutdown_grace_s)
    log.info("model %s (served as %s), max_model_len %d, %d KV pages of %d tokens, "
             "%s", args.model, ", ".join(names), engine.max_model_len,
             engine.stats()["pages_total"], args.block_size,
             f"{len(auth.tenants)} tenants from {args.api_keys}" if auth.enabled
             else "single tenant, no API keys")
    return create_app(engine, settings)


def allowed_hosts(args: argparse.Namespace, keys: bool) -> list[str] | None:
    """The ``Host`` names to answer (``None``: any), from ``--allowed-hosts`` or the
    default for the bound host (none checked when API keys are required)."""
    from prefixcache.server.crosssite import default_allowed_hosts

    if args.allowed_hosts is not None:
        return None if "*" in args.allowed_hosts else list(args.allowed_hosts)
    return None if keys else default_allowed_hosts(args.host)


def run(args: argparse.Namespace) -> int:
    from prefixcache.server.auth import KeyFileError
    from prefixcache.server.http_server import serve
    from prefixcache.server.logsafe import SafeFormatter

    handler = logging.StreamHandler()
    handler.setFormatter(SafeFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=args.log_level.upper(), handlers=[handler])
    try:
        app = build_app(args)
    except (ValueError, KeyFileError, FileNotFoundError) as exc:
        print(f"prefixcache serve: {exc}", file=sys.stderr)
        return 2
    serve(app, host=args.host, port=args.port, drain=app.state.drain,
          header_timeout_s=args.header_timeout_s, log_level=args.log_level,
          access_log=not args.no_access_log)
    return 0
