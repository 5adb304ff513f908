"""Our engine behind ``prefixcache serve`` (OpenAI API), prefix caching on or off.

Tenants come from API keys, as in production: the bench writes a keys file mapping one
key per tenant (``bench-<tenant>``, plus ``bench-default``) and sends each request with
its tenant's ``Authorization: Bearer`` key. Each run sends its own ``cache_salt`` so runs
start from a cold cache without restarting the server.
"""
from __future__ import annotations

import json
import sys

from prefixcache.bench.peers.base import PeerContext, PeerUnavailable
from prefixcache.bench.peers.server import SERVED_NAME, ServerPeer
from prefixcache.bench.workloads import BenchRequest


class OursServer(ServerPeer):
    start_timeout_s = 300.0
    ready_path = "/health"
    computed_counter = "prefill_tokens_computed_total"

    def __init__(self, mode: str = "serving", *, prefix_caching: bool = True):
        super().__init__(mode)
        self.prefix_caching = prefix_caching
        self.name = "prefixcache" if prefix_caching else "prefixcache-nocache"
        self.description = ("our engine, `prefixcache serve`, prefix caching "
                            f"{'on' if prefix_caching else 'off'}")

    def check(self, ctx: PeerContext) -> None:
        try:
            import prefixcache.server.cli  # noqa: F401
        except ImportError as exc:
            raise PeerUnavailable(f"{self.name}: the server is not importable ({exc})") from None

    def command(self, ctx: PeerContext, port: int) -> tuple[list[str], dict[str, str]]:
        keys = {"bench-default": {"tenant": "default", "admin": False}}
        keys.update({f"bench-{t}": {"tenant": t, "admin": False} for t in ctx.tenants})
        keys_file = ctx.work_dir / "logs" / "api-keys.json"
        keys_file.parent.mkdir(parents=True, exist_ok=True)
        keys_file.write_text(json.dumps(keys, indent=1))
        # a model from a GGUF file: the file itself, so that --quantization applies to it
        model = str(ctx.gguf_file) if ctx.gguf_file is not None else ctx.model
        argv = [sys.executable, "-m", "prefixcache.cli", "serve", "--model", model,
                "--host", "127.0.0.1", "--port", str(port), "--api-keys", str(keys_file),
                "--served-model-name", SERVED_NAME, "--dtype", ctx.dtype,
                "--block-size", str(ctx.block_size), "--max-model-len", str(ctx.max_model_len),
                "--kv-cache-gib", str(ctx.kv_cache_gib), "--quantization", ctx.quantization,
                "--log-level", "warning", "--no-access-log"]
        if not self.prefix_caching:
            argv.append("--no-prefix-caching")
        if ctx.threads == 0:  # torch's own default
            return argv, {}
        argv += ["--num-threads", str(ctx.threads)]
        return argv, {"OMP_NUM_THREADS": str(ctx.threads)}

    def headers(self, req: BenchRequest) -> dict:
        return {"Authorization": f"Bearer bench-{req.tenant or 'default'}"}

    def extra_body(self, req: BenchRequest, salt: str) -> dict:
        return {"ignore_eos": True, "cache_salt": salt}

    def detail(self) -> dict:
        d = super().detail()
        d.update(prefix_caching=self.prefix_caching,
                 tenant_isolation="API key -> tenant, plus cache_salt per run")
        return d
