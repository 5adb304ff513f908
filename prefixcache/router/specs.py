"""``--replica URL[,events=EP[,replay=EP]]``: one replica's address, checked at parse time.

The URL is the replica's ``http://`` or ``https://`` base URL (a host, an optional port, an
optional path prefix; no query or fragment). ``events`` and ``replay`` are ZeroMQ endpoints
the router connects to: ``tcp://HOST:PORT`` (a name, an IPv4 address or a bracketed IPv6
one, a port in 1..65535) or ``ipc://PATH``. A bad spec is a ``ValueError`` naming
``--replica`` (the CLI turns it into an argparse error), never a ZeroMQ error at start.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

FORM = "URL[,events=tcp://HOST:PORT[,replay=tcp://HOST:PORT]] (or ipc://PATH endpoints)"
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?)$")


def _bad(text: str, why: str) -> ValueError:
    return ValueError(f"--replica: {text!r}: {why}; use {FORM}")


def check_url(url: str, text: str) -> str:
    """``url`` without a trailing ``/``. Raises ValueError naming ``--replica``."""
    if not url.startswith(("http://", "https://")):
        raise _bad(text, f"URL {url!r} does not start with http:// or https://")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise _bad(text, f"URL {url!r} is not valid ({exc})") from None
    host = parts.hostname or ""
    if not _HOST.match(f"[{host}]" if ":" in host else host):
        raise _bad(text, f"URL {url!r} has no valid host")
    if port == 0:
        raise _bad(text, f"URL {url!r} has port 0")
    if parts.query or parts.fragment:
        raise _bad(text, f"URL {url!r} has a query or fragment")
    return url.rstrip("/")


def check_endpoint(key: str, value: str, text: str) -> str:
    """A ZeroMQ endpoint to connect to: ``tcp://HOST:PORT`` or ``ipc://PATH``."""
    if value.startswith("ipc://") and len(value) > len("ipc://"):
        return value
    if value.startswith("tcp://"):
        host, sep, port = value[len("tcp://"):].rpartition(":")
        if sep and _HOST.match(host) and port.isdigit() and 0 < int(port) < 65536:
            return value
    raise _bad(text, f"{key}={value!r} is not tcp://HOST:PORT or ipc://PATH")


@dataclass
class ReplicaSpec:
    """A replica's base URL and (optionally) its KV event endpoints."""

    url: str
    events: str | None = None
    replay: str | None = None

    @classmethod
    def parse(cls, text: str) -> ReplicaSpec:
        """``URL[,events=ENDPOINT[,replay=ENDPOINT]]``.

        Raises:
            ValueError: not that form (the message names ``--replica``).
        """
        url, *opts = [p.strip() for p in text.split(",")]
        spec = cls(check_url(url, text))
        seen: set[str] = set()
        for opt in opts:
            key, sep, value = opt.partition("=")
            if not sep or key not in ("events", "replay") or not value:
                raise _bad(text, f"unknown option {opt!r}")
            if key in seen:
                raise _bad(text, f"{key}= given twice")
            seen.add(key)
            setattr(spec, key, check_endpoint(key, value, text))
        if spec.replay and not spec.events:
            raise _bad(text, "replay= without events=")
        return spec
