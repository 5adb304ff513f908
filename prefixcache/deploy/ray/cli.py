"""``prefixcache deploy-ray``: the server on Ray Serve, N engine replicas behind one ingress.

    prefixcache deploy-ray [--model M] --replicas 2 [--address auto] \\
        [--request-router prefixcache|prefix_affinity|pow2] [--api-keys keys.json] \\
        [--host 127.0.0.1] [--port 8000] [engine flags: --kv-store-url redis://... ...]

Without ``--address`` it starts a local Ray cluster on this machine (127.0.0.1) for a
one-machine try; with ``--address auto`` (or ``HOST:6379``) it joins a cluster started
with ``ray start --head`` / ``ray start --address``. Every replica gets the same engine
flags. Ray itself is imported only when the command runs (the ``ray`` extra).
"""
from __future__ import annotations

import argparse
import logging
import threading

from prefixcache.deploy.ray.messages import ROUTERS
from prefixcache.engine.args import add_engine_args, config_from_args
from prefixcache.model.registry import DEFAULT_MODEL
from prefixcache.server.bodies import DEFAULT_MAX_BODY_BYTES

log = logging.getLogger("prefixcache.deploy")

APP_NAME = "prefixcache"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "deploy-ray", help="the server on Ray Serve (N replicas, cache-aware routing)",
        description="Serve a model on Ray Serve: N engine replicas behind one HTTP "
                    "ingress speaking the same OpenAI and Anthropic APIs as `serve`, routed "
                    "by the cache-aware request router (needs the `ray` extra).")
    p.add_argument("--host", default="127.0.0.1", help="address Ray Serve's HTTP proxy binds")
    p.add_argument("--port", type=int, default=8000, help="Ray Serve's HTTP port")
    p.add_argument("--address", default=None,
                   help="Ray cluster to join (`auto`, or HOST:PORT of `ray start --head`); "
                        "default: start a local cluster on 127.0.0.1")
    p.add_argument("--replicas", type=int, default=2, help="engine replicas")
    p.add_argument("--request-router", default="prefixcache", choices=ROUTERS,
                   help="prefixcache: our policy over the KV-event page index; "
                        "prefix_affinity: Ray's PrefixCacheAffinityRouter; pow2: Ray's "
                        "default power-of-two choices")
    p.add_argument("--balance-abs-tokens", type=int, default=None, metavar="TOKENS",
                   help="our router's balance threshold, tokens (as `prefixcache router`; "
                        "default: the router's)")
    p.add_argument("--balance-rel", type=float, default=None, metavar="RATIO",
                   help="our router's relative balance threshold (default: the router's)")
    p.add_argument("--cpus-per-replica", type=float, default=1.0,
                   help="Ray CPUs reserved per engine replica")
    p.add_argument("--max-ongoing-requests", type=int, default=64,
                   help="requests Ray sends one replica at once (the rest wait in the "
                        "ingress)")
    p.add_argument("--autoscale-max-replicas", type=int, default=None, metavar="N",
                   help="autoscale on queue length between --replicas and N replicas "
                        "(Ray's autoscaling_config); default: a fixed --replicas")
    p.add_argument("--autoscale-target-ongoing", type=float, default=8.0, metavar="R",
                   help="with --autoscale-max-replicas: Ray's target_ongoing_requests per "
                        "replica")
    p.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                   help="names clients use as `model` (default: as `serve`)")
    p.add_argument("--api-keys", default=None, metavar="FILE",
                   help="the key file of `serve` (tenants); default: none, single tenant")
    p.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                   metavar="BYTES", help="largest request body, bytes (413 beyond)")
    p.add_argument("--num-cpus", type=int, default=None,
                   help="CPUs of the local cluster (without --address); default: Ray's")
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"],
                   help="log threshold")
    add_engine_args(p.add_argument_group("engine"), defaults={"model": DEFAULT_MODEL})
    return p


def build(args: argparse.Namespace):
    """The Ray Serve application for ``args`` (not started). Raises ValueError / OSError
    / KeyFileError on bad arguments."""
    from prefixcache.deploy.ray.app import DeploySettings, build_application
    from prefixcache.http.auth import Authenticator
    from prefixcache.server.app import ServerSettings
    from prefixcache.server.cli import served_name

    auth = Authenticator.from_file(args.api_keys)
    config = config_from_args(args)
    if auth.quotas:
        import dataclasses

        config = dataclasses.replace(config, tenant_quotas=auth.quotas)
    names = args.served_model_name or [served_name(args.model)]
    autoscaling = None
    if args.autoscale_max_replicas is not None:
        if args.autoscale_max_replicas < args.replicas:
            raise ValueError("--autoscale-max-replicas must be >= --replicas")
        autoscaling = {"min_replicas": args.replicas,
                       "max_replicas": args.autoscale_max_replicas,
                       "target_ongoing_requests": args.autoscale_target_ongoing}
    kwargs = {k: v for k, v in (("balance_abs_tokens", args.balance_abs_tokens),
                                ("balance_rel", args.balance_rel)) if v is not None}
    if kwargs and args.request_router != "prefixcache":
        raise ValueError("--balance-abs-tokens and --balance-rel apply to "
                         "--request-router prefixcache only")
    deploy = DeploySettings(replicas=args.replicas, router=args.request_router,
                            router_kwargs=kwargs,
                            cpus_per_replica=args.cpus_per_replica,
                            max_ongoing_requests=args.max_ongoing_requests,
                            autoscaling=autoscaling)
    settings = ServerSettings(model_names=names, model_root=args.model, auth=auth,
                              max_body_bytes=args.max_body_bytes)
    return build_application(config, settings, deploy)


def run(args: argparse.Namespace) -> int:
    import ray
    from ray import serve

    from prefixcache.http.flags import check_port

    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    check_port(args.host, args.port)
    app = build(args)
    if args.address is None:
        ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False,
                 _node_ip_address="127.0.0.1")
    else:
        ray.init(address=args.address)
    serve.start(http_options={"host": args.host, "port": args.port})
    serve.run(app, name=APP_NAME, route_prefix="/")
    log.info("serving on http://%s:%d (%d replicas, %s request router)", args.host,
             args.port, args.replicas, args.request_router)
    try:
        threading.Event().wait()
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0
