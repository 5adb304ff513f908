"""What the ingress sends a replica and what comes back (picklable, no Ray types).

A :class:`ReplicaRequest` is one HTTP request forwarded whole (method, path, headers,
body) with what routing needs: the prompt's page hashes under its tenant and its length.
The request router reads those and writes its decision back into ``predicted``. A replica
answers with a :class:`ResponseHead` and then the body's bytes, in order.
"""
from __future__ import annotations

from dataclasses import dataclass, field

# request routers the application can use (see app.py)
ROUTERS = ("prefixcache", "prefix_affinity", "pow2")
REPLICA_HEADER = "x-prefixcache-replica"
PREDICTED_HEADER = "x-prefixcache-predicted-cached-tokens"


@dataclass
class Prediction:
    """The request router's choice: the replica (its Ray replica id), the predicted
    cached tokens there, and why (``cache``, ``balance``, ``overload``)."""

    replica: str
    hit_tokens: int
    reason: str


@dataclass
class ReplicaRequest:
    """One HTTP request for a replica.

    Attributes:
        method: ``GET``, ``POST``, ...
        path: the URL path (with its query string, if any, after ``?``).
        headers: ``(name, value)`` pairs as received (authorization included: the
            replica authenticates again with the same key file).
        body: the raw body.
        page_hashes: the prompt's full-page hashes (tenant-rooted chain), empty for a
            request without a prompt.
        prompt_tokens: the prompt's length, tokens (0 without a prompt).
        prompt: the rendered prompt text, for routers that match text (Ray's
            ``PrefixCacheAffinityRouter`` reads ``prompt``); ``None`` without a prompt.
        predicted: set by the request router when it places the request.
    """

    method: str
    path: str
    headers: list[tuple[str, str]]
    body: bytes = b""
    page_hashes: list[bytes] = field(default_factory=list)
    prompt_tokens: int = 0
    prompt: str | None = None
    predicted: Prediction | None = None


@dataclass
class ResponseHead:
    """The status line and headers of a replica's answer (the body follows as bytes)."""

    status: int
    headers: list[tuple[str, str]]
