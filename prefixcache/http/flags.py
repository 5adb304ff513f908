"""The command-line flags of the HTTP runner, shared by ``serve``, ``router`` and
``gateway``: ``--shutdown-grace-s``, ``--header-timeout-s``, ``--no-access-log``; and the
check that the port can be bound before anything slow is loaded."""
from __future__ import annotations

import argparse
import socket

from prefixcache.http.drain import DEFAULT_GRACE_S
from prefixcache.http.runner import DEFAULT_HEADER_TIMEOUT_S


def add_runner_flags(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """Adds the runner's flags to ``p``."""
    p.add_argument("--shutdown-grace-s", type=float, default=DEFAULT_GRACE_S,
                   metavar="SECONDS",
                   help="on SIGTERM, stop admitting and let running requests finish for "
                        "this long, seconds; then they end with a server_shutting_down error")
    p.add_argument("--header-timeout-s", type=float, default=DEFAULT_HEADER_TIMEOUT_S,
                   metavar="SECONDS",
                   help="close a connection whose request headers are not complete after "
                        "this long, seconds")
    p.add_argument("--no-access-log", action="store_true", help="no per-request log lines")


def check_runner_flags(args: argparse.Namespace) -> None:
    """Raises ValueError naming the flag out of range."""
    if not args.shutdown_grace_s >= 0:
        raise ValueError("--shutdown-grace-s must be >= 0")
    if not args.header_timeout_s > 0:
        raise ValueError("--header-timeout-s must be > 0")


def check_port(host: str, port: int) -> None:
    """Bind ``host:port`` as uvicorn will (``SO_REUSEADDR``, IPv6 when ``host`` has a
    colon) and release it at once, so a busy port is found before the model loads.

    Raises:
        OSError: the address cannot be resolved or bound; the message names host:port.
    """
    ipv6 = ":" in host  # uvicorn's own rule for the socket family
    where = f"[{host}]:{port}" if ipv6 else f"{host}:{port}"
    if not 0 <= port <= 65535:
        raise ValueError(f"--port must be 0-65535, got {port}")
    try:
        family = socket.AF_INET6 if ipv6 else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
    except OSError as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise OSError(f"cannot listen on {where}: {reason}") from None
