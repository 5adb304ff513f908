"""``prefixcache deploy-ray``'s flags (no Ray cluster: the application is only built)."""
from __future__ import annotations

import pytest

pytest.importorskip("ray.serve")

from prefixcache.cli import build_parser, main  # noqa: E402
from prefixcache.deploy.ray.app import DeploySettings  # noqa: E402
from prefixcache.deploy.ray.cli import build  # noqa: E402


def _args(*argv: str):
    argv = ("deploy-ray", "--model", "builtin:tiny", *argv)
    return build_parser(list(argv)).parse_args(list(argv))


def test_flags_reach_the_application():
    app = build(_args("--replicas", "3", "--request-router", "pow2",
                      "--cpus-per-replica", "0.5"))
    engine = app._bound_deployment.init_args[0]  # the ingress is bound to the engine app
    opts = engine._bound_deployment
    assert opts.name == "PrefixCacheEngine"
    assert opts._deployment_config.num_replicas == 3
    assert opts.ray_actor_options["num_cpus"] == 0.5
    assert engine._bound_deployment.init_args[2] is False  # no KV events without our router
    ours = build(_args("--balance-abs-tokens", "65536"))._bound_deployment.init_args[0]
    cfg = ours._bound_deployment._deployment_config.request_router_config
    assert cfg.request_router_kwargs == {"balance_abs_tokens": 65536}
    assert ours._bound_deployment.init_args[2] is True


def test_bad_values_are_refused_by_name(capsys):
    assert main(["deploy-ray", "--model", "builtin:tiny", "--replicas", "2",
                 "--autoscale-max-replicas", "1"]) == 2
    assert "--autoscale-max-replicas" in capsys.readouterr().err
    assert main(["deploy-ray", "--model", "builtin:tiny", "--request-router", "pow2",
                 "--balance-rel", "2"]) == 2
    assert "--balance-rel" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _args("--request-router", "random")
    assert "--request-router" in capsys.readouterr().err
    with pytest.raises(ValueError, match="replicas"):
        DeploySettings(replicas=0)
    with pytest.raises(ValueError, match="router"):
        DeploySettings(router="random")
