"""A real ``redis-server`` for tests: 127.0.0.1, a free port, no persistence, LRU under
32 MB, its own temporary directory; stopped by its pid."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from tests.helpers.wait import wait_until

PACKAGE = "redis-server"  # Debian's package (make test and .ci/run install it)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """``redis-server --port P --save "" --appendonly no --maxmemory 32mb
    --maxmemory-policy allkeys-lru --dir TMP``."""

    def __init__(self, tmp: Path):
        binary = shutil.which("redis-server")
        if binary is None:
            if os.environ.get("CI") == "true":
                pytest.fail(f"redis-server is not installed (Debian package {PACKAGE})")
            pytest.skip(f"redis-server is not installed (Debian package {PACKAGE})")
        self.port = _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--maxmemory", "32mb", "--maxmemory-policy",
             "allkeys-lru", "--dir", str(tmp)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        try:
            wait_until(self._accepts, "redis-server to accept connections", ignore=(OSError,))
        except AssertionError as exc:
            self.stop()
            raise RuntimeError(f"redis-server did not start: {exc}") from None

    def _accepts(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"redis-server exited ({self.proc.returncode})")
        with socket.create_connection(("127.0.0.1", self.port), timeout=10):
            return True

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
