"""Async OpenAI-format HTTP client: sends a workload to a server at concurrency C.

Every request streams (``stream: true`` with ``stream_options.include_usage``), so the
client sees the first token arrive: TTFT is the time from sending the request to the
first streamed chunk that carries a choice, TPOT the spacing of the later ones. Prompt,
completion and cached token counts come from the final ``usage`` chunk
(``usage.prompt_tokens_details.cached_tokens``) where the server sends one; a server
that sends none gets its output tokens counted as content chunks and its prompt tokens
from the bench's own tokenization, and ``cached_tokens`` stays unknown.
"""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from prefixcache.bench.metrics import RequestResult
from prefixcache.bench.prompts import Prompt
from prefixcache.bench.schedule import SessionScheduler
from prefixcache.bench.workloads import BenchRequest


@dataclass
class ServingTarget:
    """Where and how to send requests.

    Attributes:
        base_url: e.g. ``http://127.0.0.1:8000`` (the client adds ``/v1/...``).
        model: the ``model`` field of each request.
        api: ``"completions"`` (rendered prompt text, or token ids) or ``"chat"``
            (``messages`` + ``tools``; the server applies its chat template).
        headers: ``f(request) -> dict`` of extra headers (``Authorization`` per tenant).
        extra_body: ``f(request) -> dict`` of extra body fields (``cache_salt``,
            ``ignore_eos``) the server understands.
    """

    base_url: str
    model: str
    api: str = "completions"
    headers: Callable[[BenchRequest], dict] = lambda req: {}
    extra_body: Callable[[BenchRequest], dict] = lambda req: {}
    timeout_s: float = 900.0


def request_body(target: ServingTarget, req: BenchRequest, prompt: Prompt) -> tuple[str, dict]:
    """``(path, JSON body)`` of one streamed request, greedy, ``max_tokens`` fixed."""
    body: dict[str, Any] = {"model": target.model, "max_tokens": req.max_tokens, "temperature": 0.0,
                            "stream": True, "stream_options": {"include_usage": True}}
    if target.api == "chat" and req.messages is not None:
        path = "/v1/chat/completions"
        body["messages"] = req.messages
        if req.tools:
            body["tools"] = req.tools
    elif target.api == "chat":
        path = "/v1/chat/completions"
        content = prompt.text if prompt.text is not None else req.prompt
        body["messages"] = [{"role": "user", "content": content}]
    else:
        path = "/v1/completions"
        body["prompt"] = prompt.text if prompt.text is not None else prompt.token_ids
    body.update(target.extra_body(req))
    return path, body


def _chunk_has_token(chunk: dict) -> bool:
    for ch in chunk.get("choices") or []:
        if "text" in ch and (ch["text"] or ch.get("finish_reason") is None):
            return True
        delta = ch.get("delta") or {}
        if delta.get("content") or delta.get("tool_calls") or delta.get("reasoning_content"):
            return True
    return False


async def send_one(client: httpx.AsyncClient, target: ServingTarget, req: BenchRequest,
                   prompt: Prompt, t0: float) -> RequestResult:
    path, body = request_body(target, req, prompt)
    send = time.perf_counter() - t0
    first = end = None
    chunks = 0
    usage: dict | None = None
    error = None
    try:
        async with client.stream("POST", target.base_url + path, json=body,
                                 headers=target.headers(req), timeout=target.timeout_s) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")
                error = f"HTTP {resp.status_code}: {text[:300]}"
            else:
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    if "error" in chunk and not chunk.get("choices"):
                        error = f"stream error: {json.dumps(chunk['error'])[:300]}"
                        break
                    if _chunk_has_token(chunk):
                        now = time.perf_counter() - t0
                        if first is None:
                            first = now
                        end = now
                        chunks += 1
                    if chunk.get("usage"):
                        usage = chunk["usage"]
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    details = (usage or {}).get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens") if usage else None
    ref = req.reference or {}
    return RequestResult(
        id=req.id, session=req.session, turn=req.turn, group=req.group, tenant=req.tenant,
        warm_expected=req.warm_expected,
        prompt_tokens=(usage or {}).get("prompt_tokens") or len(prompt.token_ids),
        cached_tokens=cached, output_tokens=(usage or {}).get("completion_tokens") or chunks,
        send_time=send, first_token_time=first, end_time=end,
        reference_prompt_tokens=ref.get("prompt_tokens"),
        reference_cached_tokens=ref.get("cached_tokens"),
        error=error if error else (None if first is not None else "no token received"))


@dataclass
class ServingRun:
    results: list[RequestResult]
    wall_s: float
    extra: dict = field(default_factory=dict)


async def run_workload(target: ServingTarget, reqs: list[BenchRequest],
                       prompts: dict[str, Prompt], *, concurrency: int, time_scale: float = 1.0,
                       on_done: Callable[[RequestResult], None] | None = None,
                       on_tick: Callable[[], None] | None = None,
                       transport: httpx.AsyncBaseTransport | None = None) -> ServingRun:
    """Send ``reqs`` following :class:`SessionScheduler`; ``on_done`` after each request
    (progress bar), ``on_tick`` about twice a second (memory sampling); ``transport``
    replaces the network (tests)."""
    sched = SessionScheduler(reqs, concurrency, time_scale=time_scale)
    limits = httpx.Limits(max_connections=concurrency + 4,
                          max_keepalive_connections=concurrency + 4)
    results: list[RequestResult] = []
    t0 = time.perf_counter()
    async with httpx.AsyncClient(limits=limits, timeout=target.timeout_s,
                                 transport=transport) as client:
        tasks: dict[asyncio.Task, BenchRequest] = {}
        while not sched.done:
            now = time.perf_counter() - t0
            while (r := sched.next_ready(now)) is not None:
                tasks[asyncio.create_task(send_one(client, target, r, prompts[r.id], t0))] = r
            wait = 0.5
            nxt = sched.next_arrival()
            if nxt is not None and len(tasks) < concurrency:
                wait = max(0.0, min(wait, nxt - now))
            if not tasks:
                await asyncio.sleep(wait)
                if on_tick:
                    on_tick()
                continue
            done, _ = await asyncio.wait(tasks, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
            if on_tick:
                on_tick()
            for t in done:
                r = tasks.pop(t)
                res = t.result()
                results.append(res)
                sched.finish(r)
                if on_done:
                    on_done(res)
    return ServingRun(results, time.perf_counter() - t0)


async def get_text(url: str, timeout: float = 10.0) -> str | None:
    try:
        async with httpx.AsyncClient(timeout=timeout) as c:
            r = await c.get(url)
            return r.text if r.status_code == 200 else None
    except httpx.HTTPError:
        return None


def parse_prometheus(text: str | None) -> dict[str, float]:
    """``{sample name: value}`` of a Prometheus text exposition, summed over label sets
    (``prometheus_client``'s parser). ``{}`` for no text, or text that is not valid
    exposition format (the run then records the counters it needs as unknown)."""
    out: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text or ""):
            for sample in family.samples:
                out[sample.name] = out.get(sample.name, 0.0) + float(sample.value)
    except ValueError:
        return {}
    return out
