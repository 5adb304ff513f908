"""Engine outputs -> OpenAI responses: JSON bodies, server-sent event chunks, logprobs.

Each HTTP request is either collected into one JSON body or streamed as server-sent
events, one chunk per engine output. Streams end with ``data: [DONE]``; with
``stream_options.include_usage`` the chunk before it has ``choices: []`` and the
``usage`` of the whole request, and every other chunk has ``"usage": null`` (or, with
``continuous_usage_stats``, the running usage of its choice).

``usage.prompt_tokens_details.cached_tokens`` is the engine's ``num_cached_tokens``,
final before the first token (chunks are only sent from the first token on), so every
usage object of a request carries the same value.

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

from prefixcache.outputs import Logprob, RequestOutput
from prefixcache.sampling_params import SamplingParams
from prefixcache.server.drain import ShuttingDown
from prefixcache.server.errors import SERVER_ERROR


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
    diagnostics: Any = None                    # a DiagnosticsRequest, when asked


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
        sent: dict[int, tuple[int, int]] = {}   # index -> (tokens, characters) sent
        latest_out: dict[int, RequestOutput] = {}
        try:
            async with aclosing(updates) as it:  # type: ignore[type-var]
                async for latest in it:
                    for idx in sorted(latest):
                        latest_out[idx] = latest[idx]
                        for chunk in self._chunks(prep, head, idx, latest[idx], sent):
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
                sent: dict[int, tuple[int, int]]) -> list[dict]:
        """The chunks that bring choice ``idx`` up to ``out`` (none while nothing new may
        be shown); records what they send in ``sent``. Raises EngineFailure."""
        comp = out.outputs[0]
        if comp.finish_reason == "error":
            raise EngineFailure(out.error or "the engine failed this request")
        chat, first = prep.kind == "chat", idx not in sent
        n0, t0 = sent.get(idx, (0, 0))
        hold = max((len(s) for s in prep.params.stop or ()), default=1) - 1
        text = comp.text
        visible = text if out.finished or hold == 0 else text[:max(t0, len(text) - hold)]
        delta, new_ids = visible[t0:], comp.token_ids_from(n0)
        if not new_ids and not delta and not out.finished:
            return []
        sent[idx] = (comp.num_tokens, max(t0, len(visible)))
        usage = _usage([out]) if prep.continuous_usage else None
        chunks = []
        if chat and first:  # the role chunk carries no token yet
            role_usage = usage and {**usage, "completion_tokens": 0,
                                    "total_tokens": usage["prompt_tokens"]}
            chunks.append(self._chunk(head, prep, {
                "index": idx, "delta": {"role": "assistant", "content": ""},
                "logprobs": None, "finish_reason": None}, role_usage))
        lp = None
        new_lps = comp.logprobs_from(n0) if prep.logprobs is not None else None
        if new_lps is not None:
            lp = (self._chat_logprobs(new_ids, new_lps, prep.logprobs) if chat
                  else self._completion_logprobs(new_ids, new_lps, t0))
        finish = comp.finish_reason if out.finished else None
        if chat:
            choice = {"index": idx, "delta": {"content": delta} if delta or not finish else {},
                      "logprobs": lp, "finish_reason": finish}
        else:
            if first and prep.echo:
                delta = (prep.prompts[idx][1] or "") + delta
            choice = {"index": idx, "text": delta, "logprobs": lp, "finish_reason": finish}
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




def _usage(outputs: Any) -> dict[str, Any]:
    prompt = completion = cached = 0
    for out in outputs:
        prompt += len(out.prompt_token_ids)
        completion += out.outputs[0].num_tokens if out.outputs else 0
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

