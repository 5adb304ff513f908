"""Helpers of the server tests: real ``prefixcache serve`` processes on loopback.

Two session-scoped servers run ``builtin:tiny`` (random weights, loads instantly):

* ``server``: single-tenant (no key file), ``--allow-reset``, served as ``tiny`` and
  ``builtin:tiny``, a short ``--header-timeout-s``;
* ``tenant_server``: ``--api-keys`` with tenants ``alice``, ``bob`` (a quota of half the
  pool) and an admin key, and
  a small queue (``--max-num-seqs 2 --max-waiting-requests 2``) for the 429 test.

Each test uses prompts that start with a fresh nonce (:func:`unique_prompt`), so tests
never hit each other's cache pages.
"""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import httpx

from tests.helpers.wait import DEADLINE_S, wait_until

REPO = Path(__file__).resolve().parents[2]
BLOCK = 16
HEADER_TIMEOUT_S = 2.0  # the single-tenant server's --header-timeout-s
KEYS = {
    "sk-alice": {"tenant": "alice", "admin": False},
    "sk-alice-2": {"tenant": "alice", "admin": False},
    "sk-bob": {"tenant": "bob", "admin": False, "quota": 0.5},  # 256 of the 512 pages
    "sk-ops": {"tenant": "ops", "admin": True},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """A ``prefixcache serve`` subprocess (own process group, log to a file), on ``port``
    (default: a free one)."""

    def __init__(self, args: list[str], log_path: Path, port: int | None = None):
        self.port = port or free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        argv = [sys.executable, "-m", "prefixcache.cli", "serve", "--model", "builtin:tiny",
                "--host", "127.0.0.1", "--port", str(self.port), "--num-pages", "512",
                "--num-threads", "1", "--log-level", "warning", "--no-access-log", *args]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=self._log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)

    @property
    def v1(self) -> str:
        return self.base + "/v1"

    def wait_ready(self, timeout: float = 120.0) -> None:
        def healthy() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited ({self.proc.returncode}):\n{self.log()}")
            return httpx.get(self.base + "/health", timeout=30).status_code == 200

        try:
            wait_until(healthy, f"{self.base}/health", deadline_s=timeout, poll_s=0.2,
                       ignore=(httpx.HTTPError,))
        except AssertionError as exc:
            self.stop()
            raise RuntimeError(f"server not ready: {exc}\n{self.log()}") from None

    def log_size(self) -> int:
        """Bytes the server has logged so far (read the new ones with :meth:`log_since`)."""
        return self.log_path.stat().st_size

    def log_since(self, offset: int) -> bytes:
        with open(self.log_path, "rb") as f:
            f.seek(offset)
            return f.read()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self._log.close()

    # -- helpers -------------------------------------------------------------------------
    def metrics(self) -> dict[str, float]:
        """``{name{labels}: value}`` of the current /metrics scrape."""
        return scrape(self.base)

    def wait_idle(self, timeout: float = DEADLINE_S) -> dict[str, float]:
        """Poll /metrics until no request runs or waits and no page is live; that scrape."""
        seen: dict[str, float] = {}

        def idle() -> dict[str, float] | None:
            seen.update(self.metrics())
            busy = seen["kv_pages_live"] or seen["requests_running"] or seen["requests_waiting"]
            return None if busy else dict(seen)

        return wait_until(idle, lambda: (
            f"an idle server (live={seen['kv_pages_live']} "
            f"running={seen['requests_running']} waiting={seen['requests_waiting']})"),
            deadline_s=timeout)


def scrape(base: str) -> dict[str, float]:
    """``{name{labels}: value}`` of ``base``'s /metrics (a server, router or gateway)."""
    out = {}
    for line in httpx.get(base + "/metrics", timeout=60).text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(None, 1)
            out[key] = float(value)
    return out


def unique_prompt(n_words: int = 24) -> str:
    """A prompt no other test sends (its first page is unique), about 6 tokens a word."""
    return f"[{uuid.uuid4().hex}] " + " ".join(f"word{i}" for i in range(n_words))


def expected_hit(prompt_tokens: int) -> int:
    """Cached tokens of an exact repeat: whole pages, never the last prompt token."""
    return (prompt_tokens - 1) // BLOCK * BLOCK


def labelled(metrics: dict[str, float], name: str, **labels: str) -> float:
    """Value of ``name{labels}`` (label order as the exposition writes it)."""
    for key, v in metrics.items():
        m = re.fullmatch(rf"{re.escape(name)}(?:\{{(.*)\}})?", key)
        if not m:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
        if got == labels:
            return v
    raise KeyError(f"{name}{labels} not in metrics")
