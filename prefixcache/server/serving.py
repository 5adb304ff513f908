"""The OpenAI completions and chat completions endpoints over :class:`AsyncEngine`.

:class:`OpenAIServing` is the thin facade the routes call: :mod:`.requests` turns the
OpenAI body into a :class:`~.responses.Prepared` request, this module runs it (one
engine request per prompt: ``/v1/completions`` accepts an array of prompts, choice
``index`` follows prompt order), and :mod:`.responses` renders the outputs as one JSON
body or a stream of server-sent events.

Cancellation: a streaming client that disconnects cancels its generator; a
non-streaming one is watched for ``http.disconnect``. Either way the engine requests
are aborted and their pages return to the pool.

Admission: a request with more prompts than the waiting queue holds
(``--max-waiting-requests``) could never be admitted, since all its prompts enter that
queue at once: it gets 400 naming ``prompt``, not a 429 that no retry satisfies. Once
the server is shutting down (:mod:`prefixcache.http.drain`) new requests get 503; running ones that
outlive the grace period end with a ``server_shutting_down`` error (an SSE error event
then ``[DONE]``, or a JSON 503).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from prefixcache.engine.engine import QueueFullError
from prefixcache.http.auth import Principal
from prefixcache.http.drain import Drain, ShuttingDown
from prefixcache.http.errors import RATE_LIMIT, SERVER_ERROR, APIError, bad_request
from prefixcache.outputs import RequestOutput
from prefixcache.sampling_params import ParamError, SamplingParams
from prefixcache.server.async_engine import AsyncEngine, EngineDeadError, RequestSpec
from prefixcache.server.protocol import ChatCompletionRequest, CompletionRequest
from prefixcache.server.requests import RequestPreparer, param_error
from prefixcache.server.responses import EngineFailure, Prepared, ResponseRenderer

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1


class OpenAIServing:
    """Turns OpenAI requests into engine requests and engine outputs into responses.

    Args:
        engine: the running :class:`AsyncEngine`.
        tokenizer: the model's tokenizer (``None``: token-id prompts only).
        model_names: the names clients may send as ``model`` (first is reported).
        validate: ``LLMEngine.validate`` (pure: reads the vocabulary and context length).
        drain: the app's shutdown state (default: one that never begins).
        max_prompts_queued: the engine's ``max_waiting_requests`` (``None``: no limit);
            a request with more prompts can never be admitted.
        tool_parser: the tool-call parser's name (:func:`.tools.choose_parser`).
    """

    def __init__(self, engine: AsyncEngine, *, tokenizer: Any, model_names: list[str],
                 validate: Callable[[list[int], SamplingParams], None],
                 drain: Drain | None = None, max_prompts_queued: int | None = None,
                 tool_parser: str = "hermes"):
        self.engine = engine
        self.prepare = RequestPreparer(tokenizer=tokenizer, model_names=model_names,
                                       validate=validate, tool_parser=tool_parser)
        self.render = ResponseRenderer(tokenizer)
        self.drain = drain or Drain()
        self.max_prompts_queued = max_prompts_queued

    # -- entry points ------------------------------------------------------------------
    async def completions(self, req: CompletionRequest, principal: Principal,
                          request: Request, arrival: float) -> Response:
        prep = await self.prepare.completion(req, arrival, request.headers)
        return await self._serve(prep, principal, request)

    async def chat(self, req: ChatCompletionRequest, principal: Principal, request: Request,
                   arrival: float, *, pin_ttl_s: float | None = None,
                   response_id: str | None = None, diagnostics: Any = None) -> Response:
        """``pin_ttl_s``: how long the prompt's pages should stay cached (the Messages
        route's ``cache_control``), seconds; ``None`` keeps what the body asks for
        (``cache_ttl`` / ``cache_control``, or no pin). ``response_id`` and
        ``diagnostics`` (a ``DiagnosticsRequest``): the Messages route's id and ask."""
        prep = await self.prepare.chat(req, arrival, principal.tenant, request.headers)
        if pin_ttl_s is not None:
            prep.pin_ttl_s = pin_ttl_s
        if response_id is not None:
            prep.request_id = response_id
        if diagnostics is not None:
            prep.diagnostics = diagnostics
        return await self._serve(prep, principal, request)

    # -- running -----------------------------------------------------------------------
    async def _submit(self, prep: Prepared, principal: Principal
                      ) -> tuple[asyncio.Queue, list[RequestSpec]]:
        n = len(prep.prompts)
        if self.drain.draining:
            raise _shutting_down("the server is shutting down; retry on another server")
        limit = self.max_prompts_queued
        if limit is not None and n > limit:
            raise bad_request(f"this request has {n} prompts, but the server queues at most "
                              f"{limit} (--max-waiting-requests), so it could never be "
                              f"admitted; send at most {limit} prompts per request",
                              "messages" if prep.kind == "chat" else "prompt")
        specs = [RequestSpec(request_id=prep.request_id if n == 1 else f"{prep.request_id}-{i}",
                             prompt_token_ids=ids, params=prep.params, prompt=text,
                             tenant=principal.tenant, cache_salt=prep.cache_salt,
                             arrival_time=prep.arrival, index=i, pin_ttl_s=prep.pin_ttl_s,
                             diagnostics=prep.diagnostics, session_id=prep.session_id)
                 for i, (ids, text) in enumerate(prep.prompts)]
        queue: asyncio.Queue = asyncio.Queue()
        try:
            await self.engine.add_requests(specs, queue)
        except ParamError as exc:
            raise param_error(exc, {"prompt": "messages"} if prep.kind == "chat"
                              else {}) from None
        except QueueFullError as exc:
            raise APIError(429, f"the server is at capacity ({exc}); retry later",
                           type=RATE_LIMIT, code="queue_full",
                           headers={"Retry-After": str(RETRY_AFTER_S)}) from None
        except EngineDeadError as exc:
            raise APIError(503, f"the engine is not running: {exc}", type=SERVER_ERROR,
                           code="engine_unavailable",
                           headers={"Retry-After": str(RETRY_AFTER_S)}) from None
        self.drain.track(queue)
        return queue, specs

    async def _updates(self, prep: Prepared, queue: asyncio.Queue, specs: list[RequestSpec],
                       pending: set[int]) -> AsyncIterator[dict[int, RequestOutput]]:
        """Latest output per prompt index, as they come (``pending``: indices not
        finished yet, updated); a finished chat reply's transcript is recorded; aborts
        the unfinished engine requests when closed early (client gone, error)."""
        try:
            while pending:
                items = [await queue.get()]
                while not queue.empty():
                    items.append(queue.get_nowait())
                latest: dict[int, RequestOutput] = {}
                for idx, item in items:
                    if isinstance(item, ShuttingDown):
                        raise item
                    if isinstance(item, BaseException):
                        raise EngineFailure(str(item))
                    latest[idx] = item
                for idx, out in latest.items():
                    if out.finished:
                        pending.discard(idx)
                        self.prepare.record(prep, out)
                yield latest
        finally:
            self.drain.untrack(queue)
            self._abort_pending(specs, pending)

    def _abort_pending(self, specs: list[RequestSpec], pending: set[int]) -> None:
        for s in specs:
            if s.index in pending:
                pending.discard(s.index)
                self.engine.abort(s.request_id)

    async def _serve(self, prep: Prepared, principal: Principal, request: Request) -> Response:
        queue, specs = await self._submit(prep, principal)
        pending = {s.index for s in specs}
        updates = self._updates(prep, queue, specs, pending)
        if prep.stream:
            # The abort on close also covers a stream cancelled before its first chunk.
            def on_close() -> None:
                self.drain.untrack(queue)
                self._abort_pending(specs, pending)

            return _EngineStreamingResponse(
                self.render.stream(prep, updates), on_close,
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            finals = await _unless_disconnected(request, self._collect(updates))
        except EngineFailure as exc:
            raise APIError(500, str(exc), type=SERVER_ERROR, code="engine_error") from None
        except ShuttingDown as exc:
            raise _shutting_down(str(exc)) from None
        finally:
            self.drain.untrack(queue)
            self._abort_pending(specs, pending)
        if finals is None:  # client gone; the requests were aborted
            return Response(status_code=499)
        return JSONResponse(self.render.body(prep, finals))

    @staticmethod
    async def _collect(updates: AsyncIterator[dict[int, RequestOutput]]
                       ) -> dict[int, RequestOutput]:
        finals: dict[int, RequestOutput] = {}
        async with aclosing(updates) as it:  # type: ignore[type-var]
            async for latest in it:
                finals.update(latest)
        for out in finals.values():
            if any(c.finish_reason == "error" for c in out.outputs):
                raise EngineFailure(out.error or "the engine failed this request")
        return finals


# -- helpers -------------------------------------------------------------------------------
def _shutting_down(message: str) -> APIError:
    return APIError(503, message, type=SERVER_ERROR, code="server_shutting_down",
                    headers={"Retry-After": str(RETRY_AFTER_S)})


class _EngineStreamingResponse(StreamingResponse):
    """A streaming response that calls ``on_close`` however the stream ends."""

    def __init__(self, content: Any, on_close: Callable[[], None], **kw: Any):
        super().__init__(content, **kw)
        self._on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _unless_disconnected(request: Request, coro: Any) -> Any:
    """Await ``coro``; if the client disconnects first, cancel it and return ``None``."""
    work = asyncio.ensure_future(coro)
    watch = asyncio.ensure_future(_wait_disconnect(request))
    try:
        done, _ = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        work.cancel()
        watch.cancel()
        raise
    if work in done:
        watch.cancel()
        return work.result()
    work.cancel()
    try:
        await work
    except asyncio.CancelledError:
        pass
    return None
