"""Request bodies as the gateway reads them: one canonical form, checked once.

A Messages body is translated to Chat Completions (:mod:`prefixcache.server.
anthropic_wire`, its text blocks kept as text parts), and the body as sent is kept for a
Messages upstream (:data:`CLIENT_MESSAGES`); a chat body needs a non-empty ``messages``
array, a completions body one prompt (a string or one token-id array); ``n`` must be 1,
in every format (the fields' types and ranges are :mod:`.validate`'s, checked before).
Errors are :class:`BadRequest`, naming the field.
"""
from __future__ import annotations

from typing import Any

from prefixcache.server import anthropic_wire as wire

# Where a Messages client's body, as sent, rides along with its chat translation (keys
# starting with "_" are never keyed nor forwarded to an OpenAI-format upstream).
CLIENT_MESSAGES = "_client_messages"


class BadRequest(ValueError):
    """A request the gateway refuses: HTTP ``status``, the field at fault (``param``)."""

    def __init__(self, status: int, message: str, param: str | None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


def canonical(client: str, body: Any) -> tuple[str, dict]:
    """``(kind, chat-or-completions body)``. Raises BadRequest."""
    if not isinstance(body, dict):
        raise BadRequest(400, "the request body must be a JSON object", None)
    if (body.get("n") or 1) != 1:
        raise BadRequest(400, "n: must be 1 (the gateway serves one answer a request)", "n")
    if client == "messages":
        try:
            req = wire.messages_to_chat(body, keep_text_blocks=True)
        except wire.WireError as exc:
            raise BadRequest(400, str(exc), exc.param) from None
        req[CLIENT_MESSAGES] = body
        return "chat", req
    if client == "chat" and not (isinstance(body.get("messages"), list)
                                 and body["messages"]):
        raise BadRequest(400, "messages must be a non-empty array", "messages")
    if client == "completions":
        prompt = body.get("prompt")
        if not isinstance(prompt, str) and not (
                isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)):
            raise BadRequest(400, "prompt must be one string or one array of token ids "
                             "(the gateway serves one prompt per request)", "prompt")
    return client, body
