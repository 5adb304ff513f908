"""Local servers that speak OpenAI, Anthropic and DeepSeek wire formats and emulate their
prompt-caching rules (``../shared/PROVIDERS.md``), for tests and the benchmark.

Tokens are estimated as characters / 4 (like :func:`~.shaping.estimate_tokens`); the
answer is a deterministic function of the prompt. Caching rules emulated:

=========  ==================================================================
openai     automatic; prefixes of >= 1024 tokens, hits in 128-token steps; entries
           expire after 600 s idle; ``usage.prompt_tokens_details.cached_tokens``
deepseek   automatic; 64-token units from token 0; ``prompt_cache_hit_tokens`` /
           ``prompt_cache_miss_tokens``
anthropic  ``cache_control`` blocks only (tools -> system -> messages); at most 4
           (400 beyond); a breakpoint reads the longest stored prefix ending at one
           of the 20 blocks up to it; prefixes under the model's minimum (price
           sheet) are not stored; 5 m / 1 h TTL refreshed by a hit;
           ``input_tokens``, ``cache_creation_input_tokens`` (+ 5m/1h split),
           ``cache_read_input_tokens``
=========  ==================================================================

Faults for tests: :attr:`Emulator.faults` is a list of modes consumed one per request:
``"500"`` (an error answer), ``"timeout"`` (no answer for ``hang_s``), ``"disconnect"``
(a stream broken after its first delta), ``"truncate"`` (a stream that ends without its
final event). Every request body is kept in :attr:`Emulator.bodies`.

Run one: ``python -m prefixcache.gateway.emulator --provider anthropic --port 8200``.
"""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from prefixcache.cache.hashing import blake2b_128
from prefixcache.gateway.emulated_cache import EmulatedCache, breakpoints, tokens
from prefixcache.server import anthropic_sse as sse
from prefixcache.server import anthropic_wire as wire


class Emulator:
    """One emulated provider; serve :attr:`app` (ASGI) with uvicorn or an ASGI transport."""

    def __init__(self, provider: str, *, delay_s: float = 0.0, hang_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic):
        if provider not in ("openai", "deepseek", "anthropic"):
            raise ValueError(f"provider must be openai, deepseek or anthropic, got {provider!r}")
        self.provider = provider
        self.delay_s = delay_s
        self.hang_s = hang_s
        self.clock = clock
        self.faults: list[str] = []
        self.tool_call = False  # True: answer a request that has tools with a call
        self.bodies: list[dict] = []
        self.usages: list[dict] = []
        self.cache = EmulatedCache(provider, clock)
        self.app = FastAPI()
        path = "/v1/messages" if provider == "anthropic" else "/v1/chat/completions"
        self.app.add_api_route(path, self._serve, methods=["POST"])

    @property
    def calls(self) -> int:
        return len(self.bodies)

    # -- serving ---------------------------------------------------------------------------
    async def _serve(self, request: Request) -> Response:
        body = await request.json()
        self.bodies.append(body)
        org = request.headers.get("authorization") or request.headers.get("x-api-key") or ""
        fault = self.faults.pop(0) if self.faults else None
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if fault == "timeout":
            await asyncio.sleep(self.hang_s)
        if fault == "500":
            return JSONResponse({"error": {"message": "emulated overload", "type": "server_error"}},
                                status_code=500)
        if self.provider == "anthropic":
            if len(list(breakpoints(body))) > 4:
                return JSONResponse(wire.error_body("A maximum of 4 blocks with cache_control "
                                                    "may be provided."), status_code=400)
            prompt = json.dumps([body.get("system"), body.get("messages")], sort_keys=True)
        else:
            prompt = "".join(f"{m.get('role')}:{m.get('content')}\n"
                             for m in body.get("messages", []))
            prompt = json.dumps(body.get("tools"), sort_keys=True) + prompt
        text = f"[{self.provider}] answer {blake2b_128(prompt.encode()).hex()[:12]}"
        out = tokens(text)
        usage = (self.cache.anthropic_usage(org, body, out) if self.provider == "anthropic"
                 else self.cache.openai_usage(org, prompt, out))
        self.usages.append(usage)
        model = str(body.get("model"))
        calls = self._calls(body)
        finish = "tool_calls" if calls else "stop"
        if not body.get("stream"):
            if self.provider == "anthropic":
                return JSONResponse(wire.message_response("msg_emu", model, text, finish,
                                                          usage, calls))
            message: dict = {"role": "assistant", "content": text}
            if calls:
                message["tool_calls"] = calls
            return JSONResponse({"id": "chatcmpl-emu", "object": "chat.completion",
                                 "model": model, "choices": [{
                                     "index": 0, "finish_reason": finish, "message": message}],
                                 "usage": usage})
        return StreamingResponse(self._stream(model, text, usage, fault, calls),
                                 media_type="text/event-stream")

    def _calls(self, body: dict) -> list[dict]:
        """The tool call answered when :attr:`tool_call` is set: the first tool, with
        arguments ``{"q": "emulated"}``."""
        tools = body.get("tools") or []
        if not (self.tool_call and tools):
            return []
        name = tools[0]["name"] if self.provider == "anthropic" else tools[0]["function"][
            "name"]
        return [{"id": "call_emu_1", "type": "function",
                 "function": {"name": name, "arguments": json.dumps({"q": "emulated"})}}]

    async def _stream(self, model: str, text: str, usage: dict, fault: str | None,
                      calls: list[dict]) -> AsyncIterator[str]:
        pieces = [text[i:i + 8] for i in range(0, len(text), 8)]
        anth = self.provider == "anthropic"
        if anth:
            yield sse.stream_start("msg_emu", model, {**usage, "output_tokens": 0})
        for i, p in enumerate(pieces):
            if anth:
                yield sse.stream_delta(p)
            else:
                yield _sse({"id": "c", "object": "chat.completion.chunk", "model": model,
                            "choices": [{"index": 0, "delta": {"content": p},
                                         "finish_reason": None}]})
            await asyncio.sleep(0)
            if i == 0 and fault == "disconnect":
                raise ConnectionResetError("emulated disconnect mid-stream")
        if fault == "truncate":
            return
        finish = "tool_calls" if calls else "stop"
        if anth:
            yield sse.stream_stop(finish, usage, calls)
            return
        for i, c in enumerate(calls):  # name first, then the arguments in two pieces
            args = c["function"]["arguments"]
            for part in ({"id": c["id"], "type": "function",
                          "function": {"name": c["function"]["name"], "arguments": ""}},
                         {"function": {"arguments": args[:5]}},
                         {"function": {"arguments": args[5:]}}):
                yield _sse({"id": "c", "object": "chat.completion.chunk", "model": model,
                            "choices": [{"index": 0, "delta": {"tool_calls": [
                                {"index": i, **part}]}, "finish_reason": None}]})
        yield _sse({"id": "c", "object": "chat.completion.chunk", "model": model,
                    "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
        yield _sse({"id": "c", "object": "chat.completion.chunk", "model": model,
                    "choices": [], "usage": usage})
        yield "data: [DONE]\n\n"


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m prefixcache.gateway.emulator --provider anthropic --port 8200``."""
    import argparse

    import uvicorn

    p = argparse.ArgumentParser(description="an emulated provider API (tests, benchmarks)")
    p.add_argument("--provider", choices=["openai", "deepseek", "anthropic"], required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8200)
    args = p.parse_args(argv)
    uvicorn.run(Emulator(args.provider).app, host=args.host, port=args.port,
                log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
