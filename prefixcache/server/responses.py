"""Engine outputs -> OpenAI responses: JSON bodies, server-sent event chunks, logprobs.

Each HTTP request is either collected into one JSON body or streamed as server-sent
events, one chunk per engine output. Streams end with ``data: [DONE]``; with
``stream_options.include_usage`` the chunk before it has ``choices: []`` and the
``usage`` of the whole request, and every other chunk has ``"usage": null`` (or, with
``continuous_usage_stats``, the running usage of its choice).

``usage.prompt_tokens_details.cached_tokens`` is the engine's ``num_cached_tokens``,
final before the first token (chunks are only sent from the first token on), so every
usage object of a request carries the same value.

With ``n`` samples per prompt (``best_of`` too), prompt ``p``'s sample ``j`` is choice
``p * n + j``, as in OpenAI's API; usage counts each prompt (and its cached tokens)
once and sums the completion tokens of every returned sample.

Stop strings: while a request runs, text that could be the beginning of a stop string
is held back (the last ``len(longest stop) - 1`` characters), so a streamed client
never receives text that the final answer cuts away.

A stream that fails (:class:`EngineFailure`) or outlives the shutdown grace period
(:class:`~.drain.ShuttingDown`) ends with an OpenAI error event, then ``[DONE]``.
"""
from __future__ import annotations

import json
import math
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from prefixcache.http.drain import ShuttingDown
from prefixcache.http.errors import SERVER_ERROR
from prefixcache.outputs import CompletionOutput, Logprob, RequestOutput
from prefixcache.sampling_params import SamplingParams
from prefixcache.server.tools import ToolPlan
from prefixcache.text.tool_parsers.streaming import (
    ArgumentsDelta,
    CallStart,
    ContentDelta,
    StreamingToolParser,
    new_call_id,
)


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
    pin_ttl_s: float | None = None             # the ``cache_ttl`` extension, seconds
    tools: ToolPlan | None = None              # chat: how the reply's calls are parsed
    chat_text: str | None = None               # chat: the rendered prompt text
    namespace: tuple | None = None             # chat: (tenant, cache_salt) of transcripts
    diagnostics: Any = None                    # a DiagnosticsRequest, when asked
    session_id: str | None = None              # the tenant's agent session, if named


class ResponseRenderer:
    """Renders a :class:`Prepared` request's outputs.

    Args:
        tokenizer: the model's tokenizer, for token texts in logprobs (``None``: the
            texts the engine attached, else empty).
    """

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer

    def body(self, prep: Prepared, finals: dict[int, RequestOutput]) -> dict[str, Any]:
        """The JSON body of a non-streaming request, from its final outputs by index."""
        choices = []
        for idx, _, comp in _choices(finals):
            cidx = idx * prep.params.n + comp.index
            if prep.kind == "chat":
                message, finish = chat_message(prep.tools, comp.text, comp.finish_reason)
                choices.append({
                    "index": cidx, "message": message,
                    "logprobs": (self._chat_logprobs(comp.token_ids, comp.logprobs, prep.logprobs)
                                 if prep.logprobs is not None else None),
                    "finish_reason": finish, "stop_reason": comp.stop_reason})
            else:
                prefix = (prep.prompts[idx][1] or "") if prep.echo else ""
                choices.append({
                    "index": cidx, "text": prefix + comp.text,
                    "logprobs": (self._completion_logprobs(comp.token_ids, comp.logprobs, 0)
                                 if prep.logprobs is not None else None),
                    "finish_reason": comp.finish_reason, "stop_reason": comp.stop_reason})
        body: dict[str, Any] = {"id": prep.request_id,
                "object": "chat.completion" if prep.kind == "chat" else "text_completion",
                "created": int(time.time()), "model": prep.model, "choices": choices,
                "usage": _usage(finals.values())}
        if prep.pin_ttl_s is not None:  # extension: the pin of each prompt, by index
            body["pins"] = [finals[i].extra.get("pin") for i in sorted(finals)]
        if prep.diagnostics is not None:  # server/diagnostics.py
            diags = [finals[i].extra.get("cache_diagnostics") for i in sorted(finals)]
            body["prompt_cache_diagnostics"] = diags[0] if len(diags) == 1 else diags
        return body

    async def stream(self, prep: Prepared, updates: AsyncIterator[dict[int, RequestOutput]]
                     ) -> AsyncIterator[str]:
        """SSE lines for ``updates`` (the latest output per prompt index, as they come),
        ending with ``data: [DONE]``; a failure or shutdown ends it with an error event."""
        head = {"id": prep.request_id,
                "object": "chat.completion.chunk" if prep.kind == "chat" else "text_completion",
                "created": int(time.time()), "model": prep.model}
        sent: dict[int, tuple[int, int, bool]] = {}  # choice -> (tokens, chars, finished)
        latest_out: dict[int, RequestOutput] = {}
        calls: dict[int, StreamingToolParser] = {}  # chat with tools: per choice
        try:
            async with aclosing(updates) as it:  # type: ignore[type-var]
                async for latest in it:
                    latest_out.update(latest)
                    for idx, out, comp in _choices(latest):
                        for chunk in self._chunks(prep, head, idx, out, comp, sent, calls):
                            yield _sse(chunk)
            last: dict[str, Any] = {}
            if prep.include_usage:
                last["usage"] = _usage(latest_out.values())
            if prep.diagnostics is not None:  # server/diagnostics.py
                diags = [latest_out[i].extra.get("cache_diagnostics")
                         for i in sorted(latest_out)]
                last["prompt_cache_diagnostics"] = diags[0] if len(diags) == 1 else diags
            if last:
                yield _sse({**head, "choices": [], **last})
        except EngineFailure as exc:
            yield _error_event(str(exc), "engine_error")
        except ShuttingDown as exc:
            yield _error_event(str(exc), "server_shutting_down")
        yield "data: [DONE]\n\n"

    def _chunks(self, prep: Prepared, head: dict, idx: int, out: RequestOutput,
                comp: CompletionOutput, sent: dict[int, tuple[int, int, bool]],
                calls: dict[int, StreamingToolParser]) -> list[dict]:
        """The chunks that bring prompt ``idx``'s sample ``comp`` up to date (none while
        nothing new may be shown); records what they send in ``sent``. Raises
        EngineFailure."""
        if comp.finish_reason == "error":
            raise EngineFailure(out.error or "the engine failed this request")
        cidx = idx * prep.params.n + comp.index
        chat, first = prep.kind == "chat", cidx not in sent
        n0, t0, was_done = sent.get(cidx, (0, 0, False))
        done = comp.finish_reason is not None
        if was_done:
            return []  # a finished sample of a request whose other samples still run
        hold = max((len(s) for s in prep.params.stop or ()), default=1) - 1
        text = comp.text
        visible = text if done or hold == 0 else text[:max(t0, len(text) - hold)]
        delta, new_ids = visible[t0:], comp.token_ids_from(n0)
        if not new_ids and not delta and not done:
            return []
        sent[cidx] = (comp.num_tokens, max(t0, len(visible)), done)
        usage = _usage([out]) if prep.continuous_usage else None
        chunks = []
        if chat and first:  # the role chunk carries no token yet
            role_usage = usage and {**usage, "completion_tokens": 0,
                                    "total_tokens": usage["prompt_tokens"]}
            chunks.append(self._chunk(head, prep, {
                "index": cidx, "delta": {"role": "assistant", "content": ""},
                "logprobs": None, "finish_reason": None}, role_usage))
        lp = None
        new_lps = comp.logprobs_from(n0) if prep.logprobs is not None else None
        if new_lps is not None:
            lp = (self._chat_logprobs(new_ids, new_lps, prep.logprobs) if chat
                  else self._completion_logprobs(new_ids, new_lps, t0))
        finish = comp.finish_reason if done else None
        if chat and prep.tools is not None and prep.tools.parser is not None:
            parser = calls.setdefault(cidx, StreamingToolParser(prep.tools.parser))
            deltas = tool_deltas(parser, delta, finish is not None, prep.tools.parallel)
            if finish is not None and parser.calls_started and finish == "stop":
                finish = "tool_calls"
            if not deltas and finish is None and lp is None:
                return chunks  # nothing certain yet (a tag or an argument being written)
            deltas = deltas or [{}]
            for k, d in enumerate(deltas):
                last = k == len(deltas) - 1
                choice = {"index": cidx, "delta": d, "logprobs": lp if k == 0 else None,
                          "finish_reason": finish if last else None}
                if last and finish is not None:
                    choice["stop_reason"] = comp.stop_reason
                chunks.append(self._chunk(head, prep, choice, usage))
            return chunks
        if chat:
            choice = {"index": cidx, "delta": {"content": delta} if delta or not finish else {},
                      "logprobs": lp, "finish_reason": finish}
        else:
            if first and prep.echo:
                delta = (prep.prompts[idx][1] or "") + delta
            choice = {"index": cidx, "text": delta, "logprobs": lp, "finish_reason": finish}
        if finish is not None:
            choice["stop_reason"] = comp.stop_reason
        chunks.append(self._chunk(head, prep, choice, usage))
        return chunks

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


def _choices(outputs: dict[int, RequestOutput]
             ) -> list[tuple[int, RequestOutput, CompletionOutput]]:
    """``(prompt index, output, sample)`` in choice order."""
    return [(idx, outputs[idx], comp) for idx in sorted(outputs)
            for comp in sorted(outputs[idx].outputs, key=lambda c: c.index)]


def chat_message(plan: ToolPlan | None, text: str, finish: str | None
                 ) -> tuple[dict[str, Any], str | None]:
    """The assistant ``message`` of a finished reply and its ``finish_reason``: with
    a tool plan, the calls parsed out of ``text`` as ``tool_calls`` (only the first
    without ``parallel``; ``content`` is ``None`` when nothing else was said) and
    ``"tool_calls"`` for a reply that stopped."""
    if plan is None or plan.parser is None:
        return {"role": "assistant", "content": text}, finish
    content, calls = plan.parser.extract(text)
    calls = calls if plan.parallel else calls[:1]
    if not calls:
        return {"role": "assistant", "content": content}, finish
    message = {"role": "assistant", "content": content or None, "tool_calls": [
        {"id": new_call_id(), "type": "function",
         "function": {"name": c.name, "arguments": c.arguments}} for c in calls]}
    return message, "tool_calls" if finish == "stop" else finish


def tool_deltas(parser: StreamingToolParser, text: str, final: bool,
                parallel: bool = True) -> list[dict[str, Any]]:
    """The ``delta`` objects for new ``text`` of a streamed reply parsed for calls: a
    call's first delta has its index, id, type and name (arguments ``""``), later ones
    argument fragments; content outside calls as ``content`` deltas. Without
    ``parallel`` (``parallel_tool_calls: false``) only the first call is sent."""
    events = parser.feed(text) if text else []
    if final:
        events += parser.finish()
    if not parallel:
        events = [e for e in events if isinstance(e, ContentDelta) or e.index == 0]
    out: list[dict[str, Any]] = []
    for e in events:
        if isinstance(e, ContentDelta):
            out.append({"content": e.text})
        elif isinstance(e, CallStart):
            out.append({"tool_calls": [{"index": e.index, "id": e.id, "type": "function",
                                        "function": {"name": e.name, "arguments": ""}}]})
        elif isinstance(e, ArgumentsDelta):
            out.append({"tool_calls": [{"index": e.index,
                                        "function": {"arguments": e.text}}]})
    return out


def _usage(outputs: Any) -> dict[str, Any]:
    """Each prompt and its cached tokens once; completion tokens of every sample."""
    prompt = completion = cached = 0
    for out in outputs:
        prompt += len(out.prompt_token_ids)
        completion += sum(c.num_tokens for c in out.outputs)
        cached += out.num_cached_tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def _finite(x: float) -> float:
    return x if math.isfinite(x) else -9999.0


def _error_event(message: str, code: str) -> str:
    return _sse({"error": {"message": message, "type": SERVER_ERROR, "param": None,
                           "code": code}})


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"

