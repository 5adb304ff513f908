"""Reading and parsing request bodies without stalling the event loop.

A body is read up to ``limit`` bytes (413 beyond, whether ``Content-Length`` says so
up front or a chunked body grows past it). A body of :data:`PARSE_IN_THREAD_BYTES` or
more is parsed on a worker thread, one at a time, so a large body does not hold up
other streams' events while pydantic builds it; smaller ones are parsed in place,
which costs less than the thread hop. The limit bounds the rest: pydantic holds the
GIL while it parses, so the default limit (2 MiB, far above any prompt that fits a
model's context) keeps the worst case near 100 ms.

A client that disconnects while its body is being read raises starlette's
``ClientDisconnect``; the app answers it quietly (no traceback, no counted error).
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor
from typing import TypeVar

from starlette.requests import Request

from prefixcache.http.errors import APIError

T = TypeVar("T")

DEFAULT_MAX_BODY_BYTES = 2 << 20    # 2 MiB
PARSE_IN_THREAD_BYTES = 64 << 10    # 64 KiB


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, at most ``limit`` bytes.

    Raises:
        APIError: 400 for a malformed ``Content-Length``, 413 beyond ``limit``.
        starlette.requests.ClientDisconnect: the client went away mid-body.
    """
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise APIError(400, "invalid Content-Length header") from None
        if size > limit:
            raise too_large(size, limit)
    chunks, total = [], 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise too_large(total, limit)
        chunks.append(chunk)
    return b"".join(chunks)


async def parse_off_loop(parse: Callable[[bytes], T], raw: bytes, pool: Executor) -> T:
    """``parse(raw)``, on ``pool`` when ``raw`` is :data:`PARSE_IN_THREAD_BYTES` or more.
    Raises what ``parse`` raises (an :class:`APIError` 400 naming the field)."""
    if len(raw) < PARSE_IN_THREAD_BYTES:
        return parse(raw)
    return await asyncio.get_running_loop().run_in_executor(pool, parse, raw)


def too_large(size: int, limit: int) -> APIError:
    return APIError(413, f"the request body ({size} bytes) exceeds the limit of {limit} "
                    "bytes", code="request_too_large")
