"""What a log holds, once read: one :class:`Request` per model call.

Every log format (OpenAI JSONL, SWE-agent ``.traj``, mini-swe-agent ``.traj.json``) is
read into this one shape, so tokenizing, replaying and pricing never look at a format.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from prefixcache.analyze.usage import Usage


@dataclass
class Request:
    """One model call of a log.

    Attributes:
        request_id: unique within the analysis (loaders prefix it with the file stem).
        messages: OpenAI chat messages (``role``, ``content``, ``tool_calls``, ...), or
            ``None`` for a completions request.
        prompt: completions prompt: text, or token ids (used as they are).
        tools: the ``tools`` field of the request (rendered into the prompt).
        response: the recorded assistant message (``content``, ``tool_calls``) or
            completion text; ``None`` when the log has no response.
        usage: the recorded usage, normalised (:mod:`.usage`); ``None`` if absent.
        tenant: cache namespace owner (different tenants never share pages).
        cache_salt: vLLM-style per-request namespace, folded into the chain root.
        conversation: conversation / trajectory id (groups turns).
        turn: 0-based turn within the conversation (the number of assistant messages
            before this call when the log does not say).
        timestamp: seconds (UNIX time), or ``None``.
        model: the ``model`` field, if any.
        source: file the request came from.
    """

    request_id: str
    messages: list[dict] | None = None
    prompt: str | list[int] | None = None
    tools: list[dict] | None = None
    response: dict | str | None = None
    usage: Usage | None = None
    tenant: str | None = None
    cache_salt: str | None = None
    conversation: str | None = None
    turn: int = 0
    timestamp: float | None = None
    model: str | None = None
    source: str = ""
    extra: dict = field(default_factory=dict)


@dataclass
class TokenizedRequest:
    """A request as token ids, ready to replay.

    Attributes:
        request: the request it came from.
        prompt_ids: the prompt's tokens (what is queried for hits).
        response_ids: the recorded response's tokens, as the engine would append them
            while decoding (published after the prompt, never counted as a hit).
        boundaries: token positions where a message (or the tools block) ends inside
            the prompt, ascending; used by the breakpoint cost model.
        boundary_roles: the role of the message ending at each boundary (``"tools"``
            for the tools block).
        char_ends: character offsets in ``prompt_text`` of the same boundaries.
        segmented: ``boundaries`` are exactly where separately tokenized segments end
            (so one segment can be re-tokenized alone to map tokens to characters).
        prompt_text: the rendered prompt, when it was rendered from text.
    """

    request: Request
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    boundaries: list[int] = field(default_factory=list)
    boundary_roles: list[str] = field(default_factory=list)
    char_ends: list[int] = field(default_factory=list)
    segmented: bool = False
    prompt_text: str | None = None

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def tenant(self) -> str | None:
        return self.request.tenant
