"""``prefixcache serve``: the OpenAI-compatible HTTP server.

    prefixcache serve [--model smollm2-135m-instruct-q4_1] --host 127.0.0.1 --port 8000 \\
        [--served-model-name NAME ...] [--api-keys keys.json] [--allow-reset] \\
        [--allowed-hosts HOST ...] [--shutdown-grace-s 30] [--header-timeout-s 10]

The model defaults to the one ``demo`` runs (``DEFAULT_MODEL``). Clients name it by
:func:`served_name` (a registered name, a directory's or ``.gguf`` file's name) unless
``--served-model-name`` is given; the full ``--model`` string is accepted too. The port is
bound (and released) before the model loads, so a busy port fails at once.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
from pathlib import Path

from prefixcache.engine.args import add_engine_args, config_from_args
from prefixcache.http.bodies import DEFAULT_MAX_BODY_BYTES
from prefixcache.http.flags import add_runner_flags, check_port, check_runner_flags
from prefixcache.model.registry import DEFAULT_MODEL, MODELS
from prefixcache.text.tool_parsers.registry import PARSERS

log = logging.getLogger("prefixcache.server")


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "serve", help="OpenAI-compatible HTTP server",
        description="Serve a model over the OpenAI API (/v1/completions, "
                    "/v1/chat/completions, /v1/models), with /health, /metrics and "
                    "/reset_prefix_cache.")
    p.add_argument("--host", default="127.0.0.1", help="address to bind")
    p.add_argument("--port", type=int, default=8000, help="TCP port to listen on")
    p.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                   help="names clients use as `model`; the first is reported (default: "
                        "the registered name, else the model directory's or .gguf file's "
                        "name); the full --model string is accepted too")
    p.add_argument("--api-keys", default=None, metavar="FILE",
                   help='JSON {"<key>": {"tenant": "<id>", "admin": false}}; keys are required '
                        "and each key's tenant gets its own cache namespace (default: none, "
                        "single tenant)")
    p.add_argument("--allow-reset", action="store_true",
                   help="without --api-keys: let anyone call POST /reset_prefix_cache")
    p.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                   metavar="BYTES", help="largest request body, bytes (413 beyond)")
    p.add_argument("--allowed-hosts", nargs="+", default=None, metavar="HOST",
                   help="Host header names answered, 421 for others (DNS rebinding); '*' "
                        "for any. Default without --api-keys: the --host address and "
                        "localhost (any host when bound to 0.0.0.0 or ::); with "
                        "--api-keys: any")
    add_runner_flags(p)
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"],
                   help="server log threshold")
    p.add_argument("--no-warmup", action="store_true",
                   help="open the port without first running one full-size step on the "
                        "engine thread (the first request then pays for its set-up)")
    t = p.add_argument_group("tool calls")
    t.add_argument("--tool-call-parser", default=None, choices=sorted(PARSERS),
                   help="how replies are parsed into tool_calls (vLLM's names); default: "
                        "the chat template's tool syntax, else hermes (a template without "
                        "tool syntax gets Hermes-style tool instructions in its system turn)")
    t.add_argument("--enable-auto-tool-choice", action="store_true",
                   help="accepted for vLLM command lines: tool_choice 'auto' always parses "
                        "replies here, with or without it")
    add_engine_args(p.add_argument_group("engine"), defaults={"model": DEFAULT_MODEL})
    return p


def served_name(model: str) -> str:
    """The name clients use for ``model`` when ``--served-model-name`` is not given: a
    registered name itself, a ``.gguf`` file's stem, a directory's name (``~/m/SmolLM2/``
    gives ``SmolLM2``), else ``model`` unchanged (``builtin:tiny``)."""
    if model in MODELS or model.startswith("builtin:"):
        return model
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return path.stem
    if path.is_dir():
        return path.resolve().name or model
    return model


def build_app(args: argparse.Namespace):
    """The app for ``args``: checks the flags and that the port can be bound, then loads
    the model. Raises ValueError / KeyFileError / OSError (FileNotFoundError, a busy
    port) on bad arguments."""
    from prefixcache.engine.engine import LLMEngine
    from prefixcache.http.auth import Authenticator
    from prefixcache.progress import imports_done
    from prefixcache.server.app import ServerSettings, create_app

    imports_done()
    auth = Authenticator.from_file(args.api_keys, allow_reset=args.allow_reset)
    if args.max_body_bytes < 1024:
        raise ValueError("--max-body-bytes must be at least 1024")
    check_runner_flags(args)
    allowed = allowed_hosts(args, auth.enabled)
    check_port(args.host, args.port)
    config = config_from_args(args)
    if auth.quotas:  # the key file's per-tenant quotas
        config = dataclasses.replace(config, tenant_quotas=auth.quotas)
    engine = LLMEngine(config)
    names = args.served_model_name or [served_name(args.model)]
    settings = ServerSettings(model_names=names, model_root=args.model, auth=auth,
                              max_body_bytes=args.max_body_bytes, allowed_hosts=allowed,
                              shutdown_grace_s=args.shutdown_grace_s,
                              warmup=not args.no_warmup,
                              tool_call_parser=args.tool_call_parser)
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
    from prefixcache.http.logsafe import SafeFormatter
    from prefixcache.http.runner import serve

    handler = logging.StreamHandler()
    handler.setFormatter(SafeFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=args.log_level.upper(), handlers=[handler])
    app = build_app(args)  # a user error (ValueError, OSError) is printed by cli.main
    serve(app, host=args.host, port=args.port, drain=app.state.drain,
          header_timeout_s=args.header_timeout_s, log_level=args.log_level,
          access_log=not args.no_access_log)
    return 0
