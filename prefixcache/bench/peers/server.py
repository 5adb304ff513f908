"""Serving peers: start an OpenAI-compatible server, send workloads over HTTP, stop it.

:class:`ServerPeer` owns the server process (its own process group, output to a log
file), waits until it answers, runs each workload through the async client with the
peer's per-request headers and body fields, reads the peer's Prometheus counters before
and after, samples the process tree's memory, and stops the group with SIGTERM (SIGKILL
after a grace period).
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import IO, Any

from prefixcache.bench.client import ServingTarget, get_text, parse_prometheus, run_workload
from prefixcache.bench.metrics import PeakRSS, process_tree, rss_bytes
from prefixcache.bench.peers.base import (
    Peer,
    PeerContext,
    PeerRun,
    PeerUnavailable,
    Progress,
    free_port,
)
from prefixcache.bench.prompts import Prompt
from prefixcache.bench.workloads import BenchRequest

SERVED_NAME = "bench"


class ServerProcess:
    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path,
                 cwd: Path | None = None):
        self.argv, self.env, self.log_path, self.cwd = argv, env, log_path, cwd
        self.proc: subprocess.Popen | None = None
        self._log: IO[str] | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self._log = open(self.log_path, "w")
        log.write("$ " + " ".join(self.argv) + "\n")
        log.flush()
        self.proc = subprocess.Popen(self.argv, env=self.env, cwd=self.cwd, stdout=log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, url: str, timeout_s: float) -> float:
        """Poll ``url`` until it answers 200; returns seconds waited. Raises
        PeerUnavailable when the process dies or time runs out: its first line names the
        cause and the log's last line, the lines after it are the log's tail."""
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < timeout_s:
            if not self.alive():
                code = self.proc.returncode if self.proc else None
                raise PeerUnavailable(f"server exited with code {code} during "
                                      f"start-up: {self.last_line()} (log {self.log_path})\n"
                                      f"{self.tail()}")
            if asyncio.run(get_text(url, timeout=5.0)) is not None:
                return time.perf_counter() - t0
            time.sleep(1.0)
        self.stop()
        raise PeerUnavailable(f"server not ready after {timeout_s:.0f} s: {self.last_line()} "
                              f"(log {self.log_path})\n{self.tail()}")

    def last_line(self) -> str:
        """The log's last non-empty line of output (not the command line), cut to 200
        characters; ``"no output"`` when there is none."""
        lines = [x.strip() for x in self.tail(50).splitlines()
                 if x.strip() and not x.startswith("$ ")]
        return lines[-1][:200] if lines else "no output"

    def tail(self, n: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self, grace_s: float = 20.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(10)
        if self._log:
            self._log.close()
            self._log = None


class ServerPeer(Peer):
    """Base of serving peers. Subclasses give the command line and request options."""

    modes = ("serving",)
    start_timeout_s = 300.0
    ready_path = "/v1/models"
    # Prometheus counter whose increase is the prefill tokens the engine computed, or a
    # pair (prompt tokens counter, cache-hit tokens counter) whose difference is.
    computed_counter: str | tuple[str, str] | None = None

    def __init__(self, mode: str = "serving"):
        super().__init__(mode)
        self.server: ServerProcess | None = None
        self.ctx: PeerContext | None = None
        self.port: int | None = None
        self.startup_s: float | None = None
        self.rss_after_start: int | None = None  # bytes, the server's process tree

    # -- subclass hooks ----------------------------------------------------------------
    def command(self, ctx: PeerContext, port: int) -> tuple[list[str], dict[str, str]]:
        raise NotImplementedError

    def headers(self, req: BenchRequest) -> dict:
        return {}

    def extra_body(self, req: BenchRequest, salt: str) -> dict:
        return {}

    def prepare(self, ctx: PeerContext) -> None:
        """Work before the server starts (e.g. convert the model)."""

    # -- lifecycle ---------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, ctx: PeerContext) -> None:
        self.ctx = ctx
        self.prepare(ctx)
        self.port = free_port()
        argv, env = self.command(ctx, self.port)
        full_env = {**os.environ, **env}
        self.server = ServerProcess(argv, full_env, ctx.work_dir / "logs" / f"{self.name}.log")
        self.server.start()
        self.startup_s = self.server.wait_ready(self.base_url + self.ready_path,
                                                self.start_timeout_s)
        if self.server.pid is not None:
            self.rss_after_start = rss_bytes(process_tree(self.server.pid))

    def stop(self) -> None:
        if self.server:
            self.server.stop()
            self.server = None

    def metrics(self) -> dict[str, float]:
        return parse_prometheus(asyncio.run(get_text(self.base_url + "/metrics")))

    def run(self, workload: str, reqs: list[BenchRequest], prompts: dict[str, Prompt], *,
            concurrency: int, salt: str, progress: Progress | None = None,
            time_scale: float = 1.0) -> PeerRun:
        ctx = self.ctx
        if ctx is None or not self.server or not self.server.alive():
            log = f"{ctx.work_dir}/logs/{self.name}.log" if ctx else "none (never started)"
            raise PeerUnavailable(f"{self.name}: server is not running; log {log}")
        target = ServingTarget(self.base_url, SERVED_NAME, api=ctx.api, headers=self.headers,
                               extra_body=lambda r: self.extra_body(r, salt))
        before = self.metrics()
        mem = PeakRSS(self.server.pid)
        mem.start()
        run = asyncio.run(run_workload(target, reqs, prompts, concurrency=concurrency,
                                       time_scale=time_scale, on_done=progress,
                                       on_tick=mem.sample))
        peak = mem.stop()
        after = self.metrics()
        delta = {k: after[k] - before.get(k, 0.0) for k in after}
        computed = None
        c = self.computed_counter
        if isinstance(c, str) and c in after:
            computed = int(delta[c])
        elif isinstance(c, tuple) and all(k in after for k in c):
            computed = int(delta[c[0]] - delta[c[1]])
        stats = {k: v for k, v in delta.items()
                 if "prefix_cache" in k or "prefill" in k or "prompt_tokens" in k}
        return PeerRun(run.results, run.wall_s, peak_rss=peak, prefill_tokens_computed=computed,
                       cache_stats=stats)

    def detail(self) -> dict:
        d: dict[str, Any] = {"startup_s": self.startup_s,
                             "rss_after_start_bytes": self.rss_after_start}
        if self.server:
            d["command"] = " ".join(self.server.argv)
        return d


def venv_python(ctx: PeerContext, venv: str, install_hint: str) -> Path:
    py = ctx.peers_dir / venv / "bin" / "python"
    if not py.exists():
        raise PeerUnavailable(f"not installed: {py} is missing. {install_hint}")
    return py
