"""The HTTP ingress: authenticates, parses and hashes a request, then hands it to a replica.

``POST /v1/completions``, ``/v1/chat/completions`` and ``/v1/messages`` are parsed and
tokenized with the server's own :class:`~prefixcache.server.requests.RequestPreparer`
(Anthropic bodies through the server's :func:`~prefixcache.server.messages.translate`),
so a malformed request gets the server's 400 naming the field before any replica is
busy; the prompt is hashed under the caller's tenant into the engines' page hashes
(:class:`~prefixcache.cache.page_keys.PromptKeys`). The whole HTTP request then goes to
a replica through the engine deployment's handle, whose request router
(:mod:`.request_router`) reads the hashes. Every other route (``/v1/models``,
``/health``, ``/metrics``, ``/v1/cache/*``, ``/reset_prefix_cache``) goes to one replica
as is. The replica's server app answers; the ingress adds two headers:
``x-prefixcache-replica`` (the replica's Ray actor name) and
``x-prefixcache-predicted-cached-tokens`` (what the router predicted there).

A replica that dies while serving: a request that had no answer yet gets 503
(``code: replica_failed``); a stream that had started ends with an error event (OpenAI's
``data: {"error": ...}``, Anthropic's ``event: error``), never a hang.
"""
from __future__ import annotations

import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from prefixcache.cache.page_keys import PromptKeys
from prefixcache.deploy.ray.messages import PREDICTED_HEADER, ReplicaRequest, ResponseHead
from prefixcache.http.auth import Authenticator
from prefixcache.http.errors import SERVER_ERROR, APIError, error_body
from prefixcache.server.anthropic_sse import stream_error
from prefixcache.server.bodies import DEFAULT_MAX_BODY_BYTES, parse_json, read_body
from prefixcache.server.messages import error_response, translate
from prefixcache.server.protocol import ChatCompletionRequest, CompletionRequest
from prefixcache.server.requests import RequestPreparer

log = logging.getLogger(__name__)

REPLICA_FAILED = "replica_failed"
_HOP = {"host", "content-length", "transfer-encoding", "connection"}


@dataclass
class IngressSettings:
    """What the ingress needs.

    Attributes:
        tokenizer: the replicas' tokenizer (chat template included).
        keys: the replicas' page hashing.
        model_names: names accepted as ``model`` (the replicas' served names and root).
        auth: the replicas' key file.
        max_body_bytes: largest request body (413 beyond).
    """

    tokenizer: Any
    keys: PromptKeys
    model_names: list[str]
    auth: Authenticator
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES


def create_ingress_app(handle: Any, settings: IngressSettings) -> FastAPI:
    """The ingress app over ``handle`` (the engine deployment's ``DeploymentHandle``)."""
    preparer = RequestPreparer(tokenizer=settings.tokenizer, model_names=settings.model_names,
                               validate=lambda ids, params: None)  # the replica validates
    pool = ThreadPoolExecutor(1, thread_name_prefix="prefixcache-ingress-parse")
    stream = handle.options(stream=True)
    app = FastAPI(title="prefixcache on Ray Serve", docs_url=None, redoc_url=None)

    async def prepared(request: Request, kind: str) -> ReplicaRequest:
        arrival = time.perf_counter()
        principal = settings.auth.authenticate(request.headers.get("authorization"))
        raw = await read_body(request, settings.max_body_bytes)
        if kind == "messages":
            chat, _, _ = translate(raw)
            prep = await preparer.chat(chat, arrival)
        elif kind == "chat":
            body = await parse_json(ChatCompletionRequest, raw, pool)
            assert isinstance(body, ChatCompletionRequest)
            prep = await preparer.chat(body, arrival)
        else:
            completion = await parse_json(CompletionRequest, raw, pool)
            assert isinstance(completion, CompletionRequest)
            prep = await preparer.completion(completion, arrival)
        ids = prep.prompts[0][0]
        text = prep.prompts[0][1]
        return ReplicaRequest(
            request.method, _path(request), _headers(request), raw,
            page_hashes=settings.keys.page_hashes(ids, principal.tenant, prep.cache_salt),
            prompt_tokens=sum(len(p) for p, _ in prep.prompts),
            prompt=text if isinstance(text, str) else settings.tokenizer.decode(ids))

    async def forward(req: ReplicaRequest, anthropic: bool) -> Response:
        gen = stream.handle.remote(req)
        try:
            head = await gen.__anext__()
        except Exception as exc:  # the replica died before it answered
            log.warning("replica failed before answering %s: %s", req.path, exc)
            return _failed(exc, anthropic)
        assert isinstance(head, ResponseHead)
        headers = {k: v for k, v in head.headers if k.lower() not in _HOP}
        if req.predicted is not None:
            headers[PREDICTED_HEADER] = str(req.predicted.hit_tokens)
        if not headers.get("content-type", "").startswith("text/event-stream"):
            chunks = []
            try:
                async for chunk in gen:
                    chunks.append(chunk)
            except Exception as exc:
                return _failed(exc, anthropic)
            return Response(b"".join(chunks), status_code=head.status, headers=headers)

        async def body():
            try:
                async for chunk in gen:
                    yield chunk
            except Exception as exc:
                log.warning("replica failed while streaming %s: %s", req.path, exc)
                yield _failed_event(exc, anthropic)

        return StreamingResponse(body(), status_code=head.status, headers=headers)

    async def completions(request: Request) -> Response:
        return await forward(await prepared(request, "completion"), False)

    async def chat_completions(request: Request) -> Response:
        return await forward(await prepared(request, "chat"), False)

    async def messages(request: Request) -> Response:
        try:
            req = await prepared(request, "messages")
        except APIError as exc:
            return error_response(exc)
        return await forward(req, True)

    async def passthrough(request: Request) -> Response:
        body = await read_body(request, settings.max_body_bytes)
        return await forward(ReplicaRequest(request.method, _path(request),
                                            _headers(request), body), False)

    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, APIError)
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    app.add_exception_handler(APIError, api_error)
    app.add_api_route("/v1/completions", completions, methods=["POST"])
    app.add_api_route("/v1/chat/completions", chat_completions, methods=["POST"])
    app.add_api_route("/v1/messages", messages, methods=["POST"])
    app.add_api_route("/{path:path}", passthrough,
                      methods=["GET", "POST", "DELETE", "PUT", "PATCH"])
    return app


def _path(request: Request) -> str:
    query = request.url.query
    return request.url.path + (f"?{query}" if query else "")


def _headers(request: Request) -> list[tuple[str, str]]:
    return [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP]


def _message(exc: Exception) -> str:
    return f"the replica serving this request failed ({type(exc).__name__}); retry"


def _failed(exc: Exception, anthropic: bool) -> Response:
    if anthropic:
        return error_response(APIError(503, _message(exc)))
    return JSONResponse(error_body(_message(exc), type=SERVER_ERROR, code=REPLICA_FAILED),
                        status_code=503)


def _failed_event(exc: Exception, anthropic: bool) -> bytes:
    if anthropic:
        return stream_error(_message(exc)).encode()
    obj = error_body(_message(exc), type=SERVER_ERROR, code=REPLICA_FAILED)
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()
