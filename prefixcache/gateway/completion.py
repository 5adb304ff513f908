"""What an upstream answers, in one shape for every provider and wire format.

A :class:`Completion` is a complete response (what layer 1 stores: a 16-byte BLAKE2b
checksum of the JSON, then the JSON; never pickled): its
text and its tool calls; a stream is a sequence of text deltas (``str``) ending with a
:class:`Completion` whose ``text`` is the whole answer (tool calls arrive with it).
:class:`UpstreamError` is a failed upstream call, carrying the HTTP status and
OpenAI-style ``code`` the gateway answers with.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field


@dataclass
class Completion:
    """A complete answer. ``usage`` is the upstream's own usage object (its provider's
    field names); ``provider`` says how to read it (:mod:`.accounting`)."""

    text: str
    finish_reason: str | None
    usage: dict = field(default_factory=dict)
    provider: str = "openai"
    model: str = ""
    tool_calls: list = field(default_factory=list)  # OpenAI form: {id, type, function}

    def to_bytes(self) -> bytes:
        body = json.dumps(asdict(self), separators=(",", ":")).encode()
        return _checksum(body) + body

    @classmethod
    def from_bytes(cls, raw: bytes) -> Completion:
        """Raises ValueError for bytes that are not a stored completion (a bad checksum,
        a truncated or foreign value)."""
        body = raw[CHECKSUM_BYTES:]
        if len(raw) <= CHECKSUM_BYTES or raw[:CHECKSUM_BYTES] != _checksum(body):
            raise ValueError("not a stored completion: checksum mismatch")
        try:
            d = json.loads(body)
            return cls(str(d["text"]), d["finish_reason"], dict(d["usage"]),
                       str(d["provider"]), str(d["model"]), list(d.get("tool_calls") or []))
        except (KeyError, TypeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not a stored completion: {exc}") from None


CHECKSUM_BYTES = 16


def _checksum(body: bytes) -> bytes:
    return hashlib.blake2b(body, digest_size=CHECKSUM_BYTES).digest()


class UpstreamError(Exception):
    """An upstream call that failed: ``status`` is the gateway's answer (502 for a 5xx
    or a broken connection, 504 for a timeout, the upstream's own 4xx otherwise)."""

    def __init__(self, status: int, message: str, code: str):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
