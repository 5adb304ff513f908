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
import math
import time
from collections.abc import AsyncIterator, Callable

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from prefixcache.cache.hashing import blake2b_128
from prefixcache.gateway.shaping import LOOKBACK_BLOCKS, min_cacheable_tokens
from prefixcache.server import anthropic_wire as wire

OPENAI_MIN, OPENAI_STEP, OPENAI_IDLE_S = 1024, 128, 600.0
DEEPSEEK_UNIT = 64


def _tok(text: str) -> int:
    return math.ceil(len(text) / 4)


def _h(text: str) -> bytes:
    return blake2b_128(text.encode())


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
        self._cache: dict[tuple[str, bytes], float] = {}  # (org, prefix hash) -> expiry
        self.app = FastAPI()
        path = "/v1/messages" if provider == "anthropic" else "/v1/chat/completions"
        self.app.add_api_route(path, self._serve, methods=["POST"])

    @property
    def calls(self) -> int:
        return len(self.bodies)

    # -- caching rules -------------------------------------------------------------------
    def _alive(self, key: tuple[str, bytes]) -> bool:
        exp = self._cache.get(key)
        return exp is not None and exp > self.clock()

    def _openai_usage(self, org: str, prompt: str, out: int) -> dict:
        n = _tok(prompt)
        step = DEEPSEEK_UNIT if self.provider == "deepseek" else OPENAI_STEP
        low = DEEPSEEK_UNIT if self.provider == "deepseek" else OPENAI_MIN
        marks = list(range(low, n + 1, step)) if n >= low else []
        hit = max((m for m in marks if self._alive((org, _h(prompt[:4 * m])))), default=0)
        for m in marks:
            self._cache[(org, _h(prompt[:4 * m]))] = self.clock() + OPENAI_IDLE_S
        if self.provider == "deepseek":
            return {"prompt_tokens": n, "completion_tokens": out, "total_tokens": n + out,
                    "prompt_cache_hit_tokens": hit, "prompt_cache_miss_tokens": n - hit}
        return {"prompt_tokens": n, "completion_tokens": out, "total_tokens": n + out,
                "prompt_tokens_details": {"cached_tokens": hit}}

    def _anthropic_usage(self, org: str, body: dict, out: int) -> dict:
        blocks: list[tuple[str, dict]] = [(json.dumps({k: v for k, v in t.items()
                                                       if k != "cache_control"},
                                                      sort_keys=True), t)
                                          for t in body.get("tools") or []]
        system = body.get("system") or []
        if isinstance(system, str):
            system = [{"type": "text", "text": system}]
        for m in body.get("messages", []):
            c = m["content"]
            parts = [{"type": "text", "text": c}] if isinstance(c, str) else c
            system = [*system, *[{**p, "_role": m["role"]} for p in parts]]
        for b in system:
            text = b.get("text") if b.get("type") == "text" else json.dumps(
                {k: v for k, v in b.items() if k not in ("cache_control", "_role")},
                sort_keys=True)
            blocks.append((f"{b.get('_role', 'system')}:{text}", b))
        sums, hashes, acc = [0], [], ""
        for text, _ in blocks:
            acc += text + "\x00"
            sums.append(sums[-1] + _tok(text))
            hashes.append(_h(acc))
        bps = [i for i, (_, b) in enumerate(blocks) if b.get("cache_control")]
        minimum = min_cacheable_tokens(str(body.get("model")))
        read = 0
        for bp in bps:
            for i in range(bp, max(-1, bp - LOOKBACK_BLOCKS), -1):
                if self._alive((org, hashes[i])):
                    read = max(read, sums[i + 1])
                    break
        eligible = [bp for bp in bps if sums[bp + 1] >= minimum]
        for bp in eligible:
            ttl = blocks[bp][1]["cache_control"].get("ttl", "5m")
            self._cache[(org, hashes[bp])] = self.clock() + wire.TTL_S[ttl]
        w5 = w1 = 0
        if eligible:
            last = eligible[-1]
            written = max(0, sums[last + 1] - read)
            if blocks[last][1]["cache_control"].get("ttl", "5m") == "1h":
                w1 = written
            else:
                w5 = written
        total = sums[-1]
        return {"input_tokens": total - read - w5 - w1, "cache_creation_input_tokens": w5 + w1,
                "cache_read_input_tokens": read,
                "cache_creation": {"ephemeral_5m_input_tokens": w5,
                                   "ephemeral_1h_input_tokens": w1},
                "output_tokens": out}

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
            if len([1 for _ in _breakpoints(body)]) > 4:
                return JSONResponse(wire.error_body("A maximum of 4 blocks with cache_control "
                                                    "may be provided."), status_code=400)
            prompt = json.dumps([body.get("system"), body.get("messages")], sort_keys=True)
        else:
            prompt = "".join(f"{m.get('role')}:{m.get('content')}\n"
                             for m in body.get("messages", []))
            prompt = json.dumps(body.get("tools"), sort_keys=True) + prompt
        text = f"[{self.provider}] answer {_h(prompt).hex()[:12]}"
        out = _tok(text)
        usage = (self._anthropic_usage(org, body, out) if self.provider == "anthropic"
                 else self._openai_usage(org, prompt, out))
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
            yield wire.stream_start("msg_emu", model, {**usage, "output_tokens": 0})
        for i, p in enumerate(pieces):
            if anth:
                yield wire.stream_delta(p)
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
            yield wire.stream_stop(finish, usage, calls)
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


def _breakpoints(body: dict):
    for t in body.get("tools") or []:
        if t.get("cache_control"):
            yield t
    system = body.get("system")
    for b in system if isinstance(system, list) else []:
        if b.get("cache_control"):
            yield b
    for m in body.get("messages", []):
        for b in m["content"] if isinstance(m["content"], list) else []:
            if b.get("cache_control"):
                yield b


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
