"""The Ray Serve application: an HTTP ingress over N engine replicas.

:func:`build_application` binds two deployments: ``PrefixCacheEngine`` (N replicas of
:class:`~.replica.EngineReplica`, routed by the chosen request router) and
``PrefixCacheIngress`` (the HTTP ingress, :mod:`.ingress`), and returns the application
for ``serve.run``. Request routers (``router``):

- ``prefixcache``: :class:`~.request_router.PrefixCacheRouter` (the router's policy over
  the KV-event page index);
- ``prefix_affinity``: Ray's ``PrefixCacheAffinityRouter`` (a character prefix tree of
  past prompts per replica), for comparison;
- ``pow2``: Ray's default power-of-two-choices router.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ray import serve
from ray.serve.config import RequestRouterConfig

from prefixcache.cache.page_keys import PromptKeys
from prefixcache.config import EngineConfig
from prefixcache.deploy.ray.ingress import IngressSettings, create_ingress_app
from prefixcache.deploy.ray.messages import ROUTERS
from prefixcache.deploy.ray.replica import EngineReplica
from prefixcache.deploy.ray.request_router import PrefixCacheRouter
from prefixcache.server.app import ServerSettings

RAY_PREFIX_ROUTER = ("ray.llm._internal.serve.routing_policies.prefix_aware."
                     "prefix_aware_router.PrefixCacheAffinityRouter")
ENGINE_DEPLOYMENT = "PrefixCacheEngine"
INGRESS_DEPLOYMENT = "PrefixCacheIngress"


@dataclass
class DeploySettings:
    """How the application is laid out.

    Attributes:
        replicas: engine replicas (>= 1); ignored when ``autoscaling`` is given.
        router: one of :data:`ROUTERS`.
        router_kwargs: the request router's ``initialize_state`` arguments.
        cpus_per_replica: Ray CPUs reserved per engine replica.
        max_ongoing_requests: requests Ray sends one replica at once (more wait in the
            ingress's handle).
        autoscaling: Ray's ``autoscaling_config`` for the engine deployment, or ``None``.
        stats_period_s: how often Ray collects each replica's routing stats (the KV
            events address), seconds.
    """

    replicas: int = 2
    router: str = "prefixcache"
    router_kwargs: dict[str, Any] = field(default_factory=dict)
    cpus_per_replica: float = 1.0
    max_ongoing_requests: int = 64
    autoscaling: dict[str, Any] | None = None
    stats_period_s: float = 0.5

    def __post_init__(self) -> None:
        if self.router not in ROUTERS:
            raise ValueError(f"router must be one of {', '.join(ROUTERS)}, got {self.router!r}")
        if self.replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {self.replicas}")
        if not self.cpus_per_replica >= 0:
            raise ValueError(f"cpus_per_replica must be >= 0, got {self.cpus_per_replica}")
        if self.max_ongoing_requests < 1:
            raise ValueError(f"max_ongoing_requests must be >= 1, got "
                             f"{self.max_ongoing_requests}")


def _router_config(s: DeploySettings) -> RequestRouterConfig:
    kwargs: dict[str, Any] = {
        "request_routing_stats_period_s": s.stats_period_s,
        "request_routing_stats_timeout_s": max(5.0, 4 * s.stats_period_s)}
    if s.router == "prefixcache":
        kwargs["request_router_class"] = PrefixCacheRouter
    elif s.router == "prefix_affinity":
        kwargs["request_router_class"] = RAY_PREFIX_ROUTER
    if s.router != "pow2":
        kwargs["request_router_kwargs"] = dict(s.router_kwargs)
    return RequestRouterConfig(**kwargs)


class IngressReplica:
    """The ingress deployment: builds :func:`~.ingress.create_ingress_app` once it has
    asked a replica how prompts are hashed there."""

    async def __init__(self, engine: Any, config: EngineConfig,  # type: ignore[misc]
                       settings: ServerSettings) -> None:
        from prefixcache.model.loader import load_tokenizer

        info = await engine.cache_info.remote()
        tokenizer, _ = load_tokenizer(config.model, config.revision, config.quantization)
        names = list(settings.model_names) + [settings.model_root] * (
            bool(settings.model_root) and settings.model_root not in settings.model_names)
        self.settings = IngressSettings(
            tokenizer=tokenizer,
            keys=PromptKeys(info["model_fingerprint"], info["hash_root_seed"],
                            info["block_size"]),
            model_names=names, auth=settings.auth, max_body_bytes=settings.max_body_bytes)
        self.engine = engine

    def __serve_build_asgi_app__(self) -> Any:
        return create_ingress_app(self.engine, self.settings)


def build_application(config: EngineConfig, settings: ServerSettings,
                      deploy: DeploySettings) -> Any:
    """The application to pass to ``serve.run``.

    Args:
        config: every replica's engine configuration (KV events ports are picked per
            replica).
        settings: the server app's settings (served names, key file, limits).
        deploy: replicas, request router, resources.
    """
    opts: dict[str, Any] = {
        "name": ENGINE_DEPLOYMENT,
        "ray_actor_options": {"num_cpus": deploy.cpus_per_replica},
        "max_ongoing_requests": deploy.max_ongoing_requests,
        "request_router_config": _router_config(deploy),
        "health_check_period_s": 1.0,
    }
    if deploy.autoscaling is not None:
        opts["autoscaling_config"] = deploy.autoscaling
    else:
        opts["num_replicas"] = deploy.replicas
    replica: Any = serve.deployment(EngineReplica)
    engine = replica.options(**opts).bind(
        config, settings, deploy.router == "prefixcache")
    ingress_cls = serve.ingress()(IngressReplica)
    ingress_dep: Any = serve.deployment(ingress_cls)
    ingress = ingress_dep.options(
        name=INGRESS_DEPLOYMENT, ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=10_000)
    return ingress.bind(engine, dataclasses.replace(config), settings)
