"""The OpenAI completions and chat completions endpoints over :class:`AsyncEngine`.

A request becomes one engine request per prompt (``/v1/completions`` accepts an array
of prompts; choice ``index`` follows prompt order). Each HTTP request is either
collected into one JSON body or streamed as server-sent events, one chunk per engine
output. Streams end with ``data: [DONE]``; with ``stream_options.include_usage`` the
chunk before it has ``choices: []`` and the ``usage`` of the whole request, and every
other chunk has ``"usage": null`` (or, with ``continuous_usage_stats``, the running
usage of its choice).

``usage.prompt_tokens_details.cached_tokens`` is the engine's ``num_cached_tokens``,
final before the first token (chunks are only sent from the first token on), so every
usage object of a request carries the same value.

Stop strings: while a request runs, text that could be the beginning of a stop string
is held back (the last ``len(longest stop) - 1`` characters), so a streamed client
never receives text that the final answer cuts away.

Cancellation: a streaming client that disconnects cancels its generator; a
non-streaming one is watched for ``http.disconnect``. Either way the engine requests
are aborted and their pages return to the pool.

Admission: a request with more prompts than the waiting queue holds
(``--max-waiting-requests``) could never be admitted, since all its prompts enter that
queue at once: it gets 400 naming ``prompt``, not a 429 that no retry satisfies. Once
the server is shutting down (:mod:`.drain`) new requests get 503; running ones that
outlive the grace period end with a ``server_shutting_down`` error (an SSE error event
then ``[DONE]``, or a JSON 503).
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from prefixcache.engine.engine import QueueFullError
from prefixcache.outputs import Logprob, RequestOutput
from prefixcache.sampling_params import ParamError, SamplingParams
from prefixcache.server.async_engine import AsyncEngine, EngineDeadError, RequestSpec
from prefixcache.server.auth import Principal
from prefixcache.server.drain import Drain, ShuttingDown
from prefixcache.server.errors import RATE_LIMIT, SERVER_ERROR, APIError, bad_request
from prefixcache.server.logsafe import name_list
from prefixcache.server.protocol import (ChatCompletionRequest, CompletionRequest,
                                         check_unsupported, ignored_fields, message_dicts)

log = logging.getLogger(__name__)

MAX_PROMPTS_PER_REQUEST = 256
RETRY_AFTER_S = 1
SEED_RANGE = (-(1 << 63), (1 << 64) - 1)


class EngineFailure(RuntimeError):
    """The engine failed a request (a failed model step, or shutdown)."""


@dataclass
class Prepared:
    """A validated request, ready for the engine."""

    kind: str                                  # "completions" | "chat"
    request_id: str
    model: str
    prompts: list[tuple[list[int], str | None]]
    params: SamplingParams
    stream: bool
    include_usage: bool
    continuous_usage: bool
    echo: bool
    logprobs: int | None                       # top-k alternatives to return, or None
    cache_salt: str | None
    arrival: float


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
    """

    def __init__(self, engine: AsyncEngine, *, tokenizer: Any, model_names: list[str],
                 validate: Callable[[list[int], SamplingParams], None],
                 drain: Drain | None = None, max_prompts_queued: int | None = None):
        self.engine = engine
        self.tokenizer = tokenizer
        self.model_names = list(model_names)
        self.validate = validate
        self.drain = drain or Drain()
        self.max_prompts_queued = max_prompts_queued
        # Tokenization and chat templates run off the event loop, one at a time (Hugging
        # Face fast tokenizers must not be entered by two threads at once).
        self._tokenize_pool = ThreadPoolExecutor(1, thread_name_prefix="prefixcache-tokenize")

    async def _off_loop(self, fn: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._tokenize_pool, fn)

    # -- entry points ------------------------------------------------------------------
    async def completions(self, req: CompletionRequest, principal: Principal,
                          request: Request, arrival: float) -> Response:
        prep = await self._prepare_completion(req, arrival)
        return await self._serve(prep, principal, request)

    async def chat(self, req: ChatCompletionRequest, principal: Principal, request: Request,
                   arrival: float) -> Response:
        prep = await self._prepare_chat(req, arrival)
        return await self._serve(prep, principal, request)

    # -- preparation -------------------------------------------------------------------
    def _check_model(self, model: str | None) -> str:
        if model is None:
            return self.model_names[0]
        if model not in self.model_names:
            raise APIError(404, f"The model `{model}` does not exist. Served: "
                           f"{', '.join(self.model_names)}", param="model",
                           code="model_not_found")
        return model

    def _common(self, req: CompletionRequest | ChatCompletionRequest, kind: str) -> str:
        model = self._check_model(req.model)
        check_unsupported(req)
        ignored = ignored_fields(req, kind)
        if ignored:
            log.warning("ignoring request fields not used by prefixcache: %s",
                        name_list(ignored))
        return model

    async def _prepare_completion(self, req: CompletionRequest, arrival: float) -> Prepared:
        model = self._common(req, "completions")
        params = self._sampling_params(req, chat=False)
        p = req.prompt
        if isinstance(p, str):
            raw: list[str | list[int]] = [p]
        elif not p:
            raise bad_request("prompt must not be empty", "prompt")
        elif isinstance(p[0], int):
            raw = [p]  # type: ignore[list-item]
        else:
            raw = list(p)  # type: ignore[arg-type]
        if len(raw) > MAX_PROMPTS_PER_REQUEST:
            raise bad_request(f"at most {MAX_PROMPTS_PER_REQUEST} prompts per request",
                              "prompt")
        if any(len(x) == 0 for x in raw):
            raise bad_request("prompt must not be empty", "prompt")
        if self.tokenizer is None and any(isinstance(x, str) for x in raw):
            raise bad_request("this model has no tokenizer; send token ids", "prompt")
        add_special = req.add_special_tokens is not False

        def encode() -> list[tuple[list[int], str | None]]:
            return [(self.tokenizer.encode(x, add_special_tokens=add_special), x)
                    if isinstance(x, str) else (list(x), None) for x in raw]

        prompts = await self._off_loop(encode)
        for ids, _ in prompts:
            self._validate(ids, params, {})
        if req.echo and self.tokenizer is not None:
            prompts = [(ids, text if text is not None else self.tokenizer.decode(ids))
                       for ids, text in prompts]
        return Prepared("completions", f"cmpl-{uuid.uuid4().hex}", model, prompts, params,
                        bool(req.stream), *self._stream_opts(req), bool(req.echo),
                        req.logprobs, req.cache_salt, arrival)

    async def _prepare_chat(self, req: ChatCompletionRequest, arrival: float) -> Prepared:
        model = self._common(req, "chat")
        rename = {"logprobs": "top_logprobs", "prompt": "messages"}
        if req.max_completion_tokens is not None:
            rename["max_tokens"] = "max_completion_tokens"
        params = self._sampling_params(req, chat=True, rename=rename)
        if self.tokenizer is None:
            raise bad_request("this model has no tokenizer, so no chat template", "messages")
        messages = message_dicts(req)
        add_gen = req.add_generation_prompt is not False

        def render() -> list[int]:
            return self.tokenizer.apply_chat_template(messages, tools=req.tools,
                                                      add_generation_prompt=add_gen)
        try:
            ids = await self._off_loop(render)
        except ValueError as exc:
            raise bad_request(f"cannot apply the chat template: {exc}", "messages") from None
        self._validate(ids, params, rename)
        top = (req.top_logprobs or 0) if req.logprobs else None
        return Prepared("chat", f"chatcmpl-{uuid.uuid4().hex}", model, [(ids, None)], params,
                        bool(req.stream), *self._stream_opts(req), False, top,
                        req.cache_salt, arrival)

    @staticmethod
    def _stream_opts(req: CompletionRequest | ChatCompletionRequest) -> tuple[bool, bool]:
        so = req.stream_options
        include = bool(so and so.include_usage)
        return include, bool(include and so.continuous_usage_stats)

    def _validate(self, ids: list[int], params: SamplingParams, rename: dict[str, str]) -> None:
        try:
            self.validate(ids, params)
        except ParamError as exc:
            raise _param_error(exc, rename) from None

    def _sampling_params(self, req: CompletionRequest | ChatCompletionRequest, *, chat: bool,
                         rename: dict[str, str] | None = None) -> SamplingParams:
        if req.seed is not None and not SEED_RANGE[0] <= req.seed <= SEED_RANGE[1]:
            raise bad_request("seed must fit in 64 bits", "seed")
        if chat:
            max_tokens = (req.max_completion_tokens if req.max_completion_tokens is not None
                          else req.max_tokens)
            logprobs = (req.top_logprobs or 0) if req.logprobs else None
        else:
            max_tokens, logprobs = req.max_tokens, req.logprobs
        kw: dict[str, Any] = dict(
            n=1 if req.n is None else req.n,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=0 if req.top_k is None else req.top_k,
            min_p=0.0 if req.min_p is None else req.min_p,
            seed=req.seed, max_tokens=max_tokens, min_tokens=req.min_tokens or 0,
            stop=req.stop, stop_token_ids=req.stop_token_ids,
            ignore_eos=bool(req.ignore_eos), logprobs=logprobs,
            skip_special_tokens=req.skip_special_tokens is not False,
            include_stop_str_in_output=bool(req.include_stop_str_in_output),
            presence_penalty=req.presence_penalty or 0.0,
            frequency_penalty=req.frequency_penalty or 0.0,
            repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty)
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                     "repetition_penalty"):
            if not math.isfinite(kw[name]):
                raise bad_request(f"{name} must be a finite number", name)
        try:
            return SamplingParams(**kw)
        except ParamError as exc:
            raise _param_error(exc, rename or {}) from None

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
                             arrival_time=prep.arrival, index=i)
                 for i, (ids, text) in enumerate(prep.prompts)]
        queue: asyncio.Queue = asyncio.Queue()
        try:
            await self.engine.add_requests(specs, queue)
        except ParamError as exc:
            raise _param_error(exc, {"prompt": "messages"} if prep.kind == "chat" else {}) from None
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

    async def _updates(self, queue: asyncio.Queue, specs: list[RequestSpec], pending: set[int]
                       ) -> AsyncIterator[dict[int, RequestOutput]]:
        """Latest output per prompt index, as they come (``pending``: indices not
        finished yet, updated); aborts the unfinished engine requests when closed early
        (client gone, error)."""
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
        updates = self._updates(queue, specs, pending)
        if prep.stream:
            # The abort on close also covers a stream cancelled before its first chunk.
            def on_close() -> None:
                self.drain.untrack(queue)
                self._abort_pending(specs, pending)

            return _EngineStreamingResponse(
                self._stream(prep, updates), on_close,
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
        return JSONResponse(self._body(prep, finals))

    @staticmethod
    async def _collect(updates: AsyncIterator[dict[int, RequestOutput]]
                       ) -> dict[int, RequestOutput]:
        finals: dict[int, RequestOutput] = {}
        async with aclosing(updates) as it:
            async for latest in it:
                finals.update(latest)
        for out in finals.values():
            if out.outputs and out.outputs[0].finish_reason == "error":
                raise EngineFailure(out.error or "the engine failed this request")
        return finals

    # -- responses ---------------------------------------------------------------------
    def _body(self, prep: Prepared, finals: dict[int, RequestOutput]) -> dict[str, Any]:
        choices = []
        for idx in sorted(finals):
            out = finals[idx]
            comp = out.outputs[0]
            if prep.kind == "chat":
                choices.append({
                    "index": idx,
                    "message": {"role": "assistant", "content": comp.text},
                    "logprobs": (self._chat_logprobs(comp.token_ids, comp.logprobs, prep.logprobs)
                                 if prep.logprobs is not None else None),
                    "finish_reason": comp.finish_reason, "stop_reason": comp.stop_reason})
            else:
                prefix = (prep.prompts[idx][1] or "") if prep.echo else ""
                choices.append({
                    "index": idx, "text": prefix + comp.text,
                    "logprobs": (self._completion_logprobs(comp.token_ids, comp.logprobs, 0)
                                 if prep.logprobs is not None else None),
                    "finish_reason": comp.finish_reason, "stop_reason": comp.stop_reason})
        return {"id": prep.request_id,
                "object": "chat.completion" if prep.kind == "chat" else "text_completion",
                "created": int(time.time()), "model": prep.model, "choices": choices,
                "usage": _usage(finals.values())}

    async def _stream(self, prep: Prepared, updates: AsyncIterator[dict[int, RequestOutput]]
                      ) -> AsyncIterator[str]:
        chat = prep.kind == "chat"
        head = {"id": prep.request_id,
                "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()), "model": prep.model}
        hold = max((len(s) for s in prep.params.stop), default=1) - 1
        sent_text: dict[int, int] = {}
        sent_tokens: dict[int, int] = {}
        latest_out: dict[int, RequestOutput] = {}
        try:
            async with aclosing(updates) as it:
                async for latest in it:
                    for idx in sorted(latest):
                        out = latest[idx]
                        latest_out[idx] = out
                        comp = out.outputs[0]
                        if comp.finish_reason == "error":
                            raise EngineFailure(out.error or "the engine failed this request")
                        first = idx not in sent_tokens
                        n0, t0 = sent_tokens.get(idx, 0), sent_text.get(idx, 0)
                        text = comp.text
                        visible = (text if out.finished or hold == 0
                                   else text[:max(t0, len(text) - hold)])
                        delta = visible[t0:] if len(visible) > t0 else ""
                        new_ids = comp.token_ids[n0:]
                        if not new_ids and not delta and not out.finished:
                            continue
                        sent_tokens[idx] = len(comp.token_ids)
                        sent_text[idx] = max(t0, len(visible))
                        usage = _usage([out]) if prep.continuous_usage else None
                        if chat and first:  # the role chunk carries no token yet
                            role_usage = usage and {**usage, "completion_tokens": 0,
                                                    "total_tokens": usage["prompt_tokens"]}
                            yield _sse(self._chunk(head, prep, {
                                "index": idx, "delta": {"role": "assistant", "content": ""},
                                "logprobs": None, "finish_reason": None}, role_usage))
                        lp = None
                        if prep.logprobs is not None and comp.logprobs is not None:
                            new_lps = comp.logprobs[n0:]
                            lp = (self._chat_logprobs(new_ids, new_lps, prep.logprobs) if chat
                                  else self._completion_logprobs(new_ids, new_lps, t0))
                        finish = comp.finish_reason if out.finished else None
                        if chat:
                            choice = {"index": idx,
                                      "delta": {"content": delta} if delta or not finish else {},
                                      "logprobs": lp, "finish_reason": finish}
                        else:
                            if first and prep.echo:
                                delta = (prep.prompts[idx][1] or "") + delta
                            choice = {"index": idx, "text": delta, "logprobs": lp,
                                      "finish_reason": finish}
                        if finish is not None:
                            choice["stop_reason"] = comp.stop_reason
                        yield _sse(self._chunk(head, prep, choice, usage))
            if prep.include_usage:
                yield _sse({**head, "choices": [], "usage": _usage(latest_out.values())})
        except EngineFailure as exc:
            yield _sse({"error": {"message": str(exc), "type": SERVER_ERROR, "param": None,
                                  "code": "engine_error"}})
        except ShuttingDown as exc:
            yield _sse({"error": {"message": str(exc), "type": SERVER_ERROR, "param": None,
                                  "code": "server_shutting_down"}})
        yield "data: [DONE]\n\n"

    @staticmethod
    def _chunk(head: dict, prep: Prepared, choice: dict, usage: dict | None) -> dict:
        chunk = {**head, "choices": [choice]}
        if prep.include_usage:
            chunk["usage"] = usage
        return chunk

    # -- logprobs ----------------------------------------------------------------------
    def _token_text(self, token_id: int, lp: Logprob | None) -> str:
        if lp is not None and lp.decoded_token is not None:
            return lp.decoded_token
        if self.tokenizer is not None:
            return self.tokenizer.decode_token(token_id)
        return ""

    def _completion_logprobs(self, token_ids: list[int], lps: list[dict[int, Logprob]] | None,
                             offset: int) -> dict[str, Any]:
        tokens, token_lps, tops, offsets = [], [], [], []
        for tid, d in zip(token_ids, lps or []):
            s = self._token_text(tid, d.get(tid))
            tokens.append(s)
            token_lps.append(_finite(d[tid].logprob) if tid in d else None)
            tops.append({self._token_text(t, v): _finite(v.logprob) for t, v in d.items()})
            offsets.append(offset)
            offset += len(s)
        return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops,
                "text_offset": offsets}

    def _chat_logprobs(self, token_ids: list[int], lps: list[dict[int, Logprob]] | None,
                       top: int | None) -> dict[str, Any]:
        content = []
        for tid, d in zip(token_ids, lps or []):
            s = self._token_text(tid, d.get(tid))
            ranked = sorted(d.items(), key=lambda kv: kv[1].rank if kv[1].rank is not None
                            else 1 << 30)
            alts = [{"token": self._token_text(t, v), "logprob": _finite(v.logprob),
                     "bytes": list(self._token_text(t, v).encode("utf-8"))}
                    for t, v in ranked if v.rank is not None and v.rank <= (top or 0)]
            content.append({"token": s, "logprob": _finite(d[tid].logprob) if tid in d else None,
                            "bytes": list(s.encode("utf-8")), "top_logprobs": alts})
        return {"content": content}


# -- helpers -------------------------------------------------------------------------------
def _param_error(exc: ParamError, rename: dict[str, str]) -> APIError:
    param = rename.get(exc.param, exc.param)
    msg = str(exc)
    if param != exc.param and msg.startswith(exc.param):
        msg = param + msg[len(exc.param):]
    return bad_request(msg, param)


def _shutting_down(message: str) -> APIError:
    return APIError(503, message, type=SERVER_ERROR, code="server_shutting_down",
                    headers={"Retry-After": str(RETRY_AFTER_S)})


def _usage(outputs: Any) -> dict[str, Any]:
    prompt = completion = cached = 0
    for out in outputs:
        prompt += len(out.prompt_token_ids)
        completion += len(out.outputs[0].token_ids) if out.outputs else 0
        cached += out.num_cached_tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def _finite(x: float) -> float:
    return x if math.isfinite(x) else -9999.0


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


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
