"""The server's request bodies: read with the HTTP foundation's limit
(:mod:`prefixcache.http.bodies`), parsed into the OpenAI request types of :mod:`.protocol`
(on a worker thread when large)."""
from __future__ import annotations

from concurrent.futures import Executor
from functools import partial

from prefixcache.http.bodies import DEFAULT_MAX_BODY_BYTES, parse_off_loop, read_body, too_large
from prefixcache.server.protocol import _Body, parse_body

__all__ = ["DEFAULT_MAX_BODY_BYTES", "parse_json", "read_body", "too_large"]


async def parse_json(model: type[_Body], raw: bytes, pool: Executor) -> _Body:
    """``parse_body(model, raw)``, on ``pool`` when ``raw`` is large. Raises APIError 400
    as :func:`~prefixcache.server.protocol.parse_body` does."""
    return await parse_off_loop(partial(parse_body, model), raw, pool)
