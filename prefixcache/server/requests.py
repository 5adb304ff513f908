"""OpenAI request bodies -> :class:`~.responses.Prepared` requests for the engine.

Checks the model name and the features prefixcache does not implement, turns the
OpenAI fields into :class:`SamplingParams` (validated there, where the request enters
the engine; a :class:`ParamError` becomes a 400 naming the OpenAI field), and
tokenizes prompts or renders the chat template off the event loop.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from prefixcache.cache.pins import MAX_PIN_TTL_S, MIN_PIN_TTL_S
from prefixcache.engine.miss_diagnostics import message_anchors
from prefixcache.http.errors import APIError, bad_request
from prefixcache.http.logsafe import name_list
from prefixcache.outputs import RequestOutput
from prefixcache.sampling_params import ParamError, SamplingParams, StructuredOutputsParams
from prefixcache.server.diagnostics import openai_ask
from prefixcache.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    check_unsupported,
    ignored_fields,
    message_dicts,
)
from prefixcache.server.responses import Prepared
from prefixcache.server.sessions import request_session
from prefixcache.server.structured import rename_for, structured_outputs
from prefixcache.server.tools import ToolPlan, forced_grammar, plan_tools
from prefixcache.server.transcripts import TranscriptTokens

log = logging.getLogger(__name__)

MAX_PROMPTS_PER_REQUEST = 256
_NO_HEADERS: dict[str, str] = {}
SEED_RANGE = (-(1 << 63), (1 << 64) - 1)


class RequestPreparer:
    """Validates OpenAI requests and tokenizes their prompts.

    Args:
        tokenizer: the model's tokenizer (``None``: token-id prompts only).
        model_names: the names clients may send as ``model`` (first is reported).
        validate: ``LLMEngine.validate`` (pure: reads the vocabulary and context length).
        tool_parser: the tool-call parser's name (:func:`.tools.choose_parser`).
    """

    def __init__(self, *, tokenizer: Any, model_names: list[str],
                 validate: Callable[[list[int], SamplingParams], None],
                 tool_parser: str = "hermes"):
        self.tokenizer = tokenizer
        self.tool_parser = tool_parser
        self.transcripts = TranscriptTokens()
        self.model_names = list(model_names)
        self.validate = validate
        # Tokenization and chat templates run off the event loop, one at a time (Hugging
        # Face fast tokenizers must not be entered by two threads at once).
        self._tokenize_pool = ThreadPoolExecutor(1, thread_name_prefix="prefixcache-tokenize")

    async def _off_loop(self, fn: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._tokenize_pool, fn)

    # -- entry points ------------------------------------------------------------------
    async def completion(self, req: CompletionRequest, arrival: float,
                         headers: Any = _NO_HEADERS) -> Prepared:
        """A ``/v1/completions`` request, ready for the engine. Raises APIError."""
        model = self._common(req, "completions")
        params = self._sampling_params(req)
        rename = self._so_rename(req)
        p = req.prompt
        if isinstance(p, str):
            raw: list[str | list[int]] = [p]
        elif not p:
            raise bad_request("prompt must not be empty", "prompt")
        elif isinstance(p[0], int):
            raw = [p]
        else:
            raw = list(p)
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

        session = request_session(req.session_id, req.prompt_cache_key, headers)
        if session is not None and len(raw) > 1:
            raise bad_request("a session's call has one prompt (a session keeps one "
                              "transcript); send the prompts one per request",
                              "session_id" if req.session_id is not None else "prompt")
        prompts = await self._off_loop(encode)
        for ids, _ in prompts:
            await self._validate(ids, params, rename)
        if req.echo and self.tokenizer is not None:
            prompts = [(ids, text if text is not None else self.tokenizer.decode(ids))
                       for ids, text in prompts]
        return Prepared("completions", f"cmpl-{uuid.uuid4().hex}", model, prompts, params,
                        bool(req.stream), *self._stream_opts(req), bool(req.echo),
                        req.logprobs, req.cache_salt, arrival, request_pin_ttl(req),
                        diagnostics=openai_ask(req.prompt_cache_diagnostics, headers),
                        session_id=session)

    async def chat(self, req: ChatCompletionRequest, arrival: float,
                   tenant: str | None = None, headers: Any = _NO_HEADERS) -> Prepared:
        """A ``/v1/chat/completions`` request, ready for the engine; its prompt reuses
        the ids of a recorded transcript it starts with (:mod:`.transcripts`, per
        ``tenant`` and ``cache_salt``); ``headers`` may ask for cache diagnostics. Raises
        APIError."""
        model = self._common(req, "chat")
        rename = {"logprobs": "top_logprobs", "prompt": "messages"}
        if req.max_completion_tokens is not None:
            rename["max_tokens"] = "max_completion_tokens"
        asked = (req.max_completion_tokens if req.max_completion_tokens is not None
                 else req.max_tokens)
        if isinstance(asked, int) and asked < 1:  # before the generic ">= 0" check
            name = rename.get("max_tokens", "max_tokens")
            raise bad_request(f"{name} must be at least 1 here, got {asked}; max_tokens 0 "
                              "(prefill only) is a /v1/completions feature", name)
        params = self._sampling_params(req, rename=rename)
        rename |= self._so_rename(req)
        plan = plan_tools(req.tools, req.tool_choice, req.parallel_tool_calls,
                          self.tool_parser)
        if plan is not None:
            params = self._constrain(plan, params)
            if plan.forced:
                rename["structured_outputs.grammar"] = "tools"
        if self.tokenizer is None:
            raise bad_request("this model has no tokenizer, so no chat template", "messages")
        messages = message_dicts(req)
        ask = openai_ask(req.prompt_cache_diagnostics, headers)
        session = request_session(req.session_id, req.prompt_cache_key, headers)
        if ask is not None:
            ask = replace(ask, anchors=message_anchors(messages, req.tools))
        add_gen = req.add_generation_prompt is not False

        namespace = (tenant, req.cache_salt)

        def render() -> tuple[str, list[int]]:
            text = self.tokenizer.render_chat(messages, tools=req.tools,
                                              add_generation_prompt=add_gen)
            return text, self.transcripts.encode(
                namespace, text, lambda t: self.tokenizer.encode(t, add_special_tokens=False))
        try:
            text, ids = await self._off_loop(render)
        except (ValueError, TypeError) as exc:  # TypeError: text the tokenizer refuses
            # (a lone surrogate, from a \ud800 escape in a tool call's arguments)
            raise bad_request(f"cannot apply the chat template: {exc}", "messages") from None
        await self._validate(ids, params, rename)
        top = (req.top_logprobs or 0) if req.logprobs else None
        return Prepared("chat", f"chatcmpl-{uuid.uuid4().hex}", model, [(ids, None)], params,
                        bool(req.stream), *self._stream_opts(req), False, top,
                        req.cache_salt, arrival, request_pin_ttl(req), plan, text, namespace,
                        diagnostics=ask, session_id=session)

    def record(self, prep: Prepared, out: RequestOutput) -> None:
        """Record a finished chat reply's transcript (:mod:`.transcripts`): the prompt's
        ids and the reply's, without a final token whose text the reply does not show
        (a stop token)."""
        comp = out.outputs[0] if out.outputs else None
        if (prep.chat_text is None or prep.namespace is None or comp is None
                or comp.finish_reason not in ("stop", "length") or self.tokenizer is None):
            return
        ids = list(comp.token_ids)
        for n in (len(ids), len(ids) - 1):
            if n >= 0 and self.tokenizer.decode(ids[:n], skip_special_tokens=False) == comp.text:
                self.transcripts.record(prep.namespace, prep.chat_text + comp.text,
                                        list(prep.prompts[0][0]) + ids[:n])
                return

    @staticmethod
    def _constrain(plan: ToolPlan, params: SamplingParams) -> SamplingParams:
        """``params`` for a request whose reply is parsed for calls: markers that are
        special tokens are kept in the text; a forced choice is a grammar."""
        if plan.forced and params.structured_outputs is not None:
            raise bad_request("tool_choice 'required' or a named function cannot be "
                              "combined with another output constraint", "tool_choice")
        changes: dict[str, Any] = {}
        if plan.forced:
            changes["structured_outputs"] = StructuredOutputsParams(
                grammar=forced_grammar(plan))
        if plan.parser is not None and not plan.parser.skip_special_tokens:
            changes["skip_special_tokens"] = False
        return dataclasses.replace(params, **changes) if changes else params

    # -- checks ----------------------------------------------------------------------------
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

    @staticmethod
    def _stream_opts(req: CompletionRequest | ChatCompletionRequest) -> tuple[bool, bool]:
        so = req.stream_options
        include = bool(so and so.include_usage)
        return include, bool(include and so is not None and so.continuous_usage_stats)

    async def _validate(self, ids: list[int], params: SamplingParams,
                        rename: dict[str, str]) -> None:
        """``LLMEngine.validate``; with structured outputs it compiles the grammar (a
        cache miss takes a while), so that runs off the event loop."""
        try:
            if params.structured_outputs is None:
                self.validate(ids, params)
            else:
                await self._off_loop(lambda: self.validate(ids, params))
        except ParamError as exc:
            raise param_error(exc, rename) from None

    @staticmethod
    def _so_rename(req: CompletionRequest | ChatCompletionRequest) -> dict[str, str]:
        return rename_for(structured_outputs(req)[1])

    def _sampling_params(self, req: CompletionRequest | ChatCompletionRequest, *,
                         rename: dict[str, str] | None = None) -> SamplingParams:
        if req.seed is not None and not SEED_RANGE[0] <= req.seed <= SEED_RANGE[1]:
            raise bad_request("seed must fit in 64 bits", "seed")
        if isinstance(req, ChatCompletionRequest):
            max_tokens = (req.max_completion_tokens if req.max_completion_tokens is not None
                          else req.max_tokens)
            logprobs = (req.top_logprobs or 0) if req.logprobs else None
        else:
            max_tokens, logprobs = req.max_tokens, req.logprobs
        kw: dict[str, Any] = dict(
            n=1 if req.n is None else req.n,
            best_of=req.best_of if isinstance(req, CompletionRequest) else None,
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
            repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
            structured_outputs=structured_outputs(req)[0])
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                     "repetition_penalty"):
            if not math.isfinite(kw[name]):
                raise bad_request(f"{name} must be a finite number", name)
        try:
            return SamplingParams(**kw)
        except ParamError as exc:
            raise param_error(exc, rename or {}) from None


_TTL_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
MIN_CACHE_TTL_S = MIN_PIN_TTL_S  # shared with the offline API (cache/pins.py)
MAX_CACHE_TTL_S = MAX_PIN_TTL_S


def request_pin_ttl(req: CompletionRequest | ChatCompletionRequest) -> float | None:
    """The pin TTL a body asks for, in seconds: ``cache_ttl``, or ``cache_control``
    (``{"type": "ephemeral", "ttl": "5m" | "1h" | ...}``). Raises APIError (400)."""
    cc = req.cache_control
    if cc is None:
        return pin_ttl(req.cache_ttl)
    if req.cache_ttl is not None:
        raise bad_request("send cache_ttl or cache_control, not both", "cache_control")
    if cc.get("type") != "ephemeral" or set(cc) - {"type", "ttl"}:
        raise bad_request("cache_control must be {'type': 'ephemeral', 'ttl': ...}",
                          "cache_control")
    try:
        return pin_ttl(cc.get("ttl", "5m"))
    except APIError as exc:
        raise bad_request(exc.message.replace("cache_ttl", "cache_control.ttl", 1),
                          "cache_control.ttl") from None


def pin_ttl(value: float | str | None) -> float | None:
    """The ``cache_ttl`` extension in seconds: a number of seconds, or a string such as
    ``"30s"``, ``"5m"``, ``"1h"`` (Anthropic's ``ttl`` shape). Raises APIError (400,
    ``cache_ttl``) unless it is finite, at least :data:`MIN_CACHE_TTL_S` (1 s) and at most
    :data:`MAX_CACHE_TTL_S` (a week)."""
    if value is None:
        return None
    seconds: float | None = None
    if isinstance(value, str):
        num, unit = value[:-1], value[-1:]
        if unit in _TTL_UNITS and num.replace(".", "", 1).isdigit():
            seconds = float(num) * _TTL_UNITS[unit]
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    if seconds is None or not (MIN_CACHE_TTL_S <= seconds <= MAX_CACHE_TTL_S):
        raise bad_request(f"cache_ttl must be a number of seconds or a duration such as "
                          f"'30s', '5m', '1h', from {MIN_CACHE_TTL_S:.0f} s to "
                          f"{MAX_CACHE_TTL_S:.0f} s; got {value!r}", "cache_ttl")
    return seconds


def param_error(exc: ParamError, rename: dict[str, str]) -> APIError:
    """The 400 answer to ``exc``, its parameter renamed by ``rename`` (engine name ->
    OpenAI field of this endpoint)."""
    param = rename.get(exc.param, exc.param)
    msg = str(exc)
    if param != exc.param and msg.startswith(exc.param):
        msg = param + msg[len(exc.param):]
    return bad_request(msg, param)

