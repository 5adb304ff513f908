"""Upstream adapters: where the gateway forwards a request, in the upstream's wire format.

``--upstream NAME=URL[,provider=P][,models=A|B][,key-env=VAR][,timeout-s=S]``:

=============  ===================================================================
provider       wire format
=============  ===================================================================
openai         Chat Completions / Completions at ``URL/v1/...`` (the default)
deepseek       the same wire format; usage ``prompt_cache_hit/miss_tokens``
prefixcache    our server (OpenAI format; ``cached_tokens`` from the engine)
vllm           the same as prefixcache
anthropic      Messages at ``URL/v1/messages`` (requests translated, see
               :mod:`prefixcache.server.anthropic_wire`); no ``/v1/completions``
=============  ===================================================================

``models`` lists the model names this upstream serves (none: it serves any model not
claimed by another upstream). The upstream's API key is read from the environment
variable ``key-env`` names: the gateway never forwards its clients' keys.

Every request body here is a Chat Completions (or Completions) body; the adapter
translates it and the answer (:class:`~.completion.Completion`, or text deltas then a
Completion when streaming). Failures raise :class:`~.completion.UpstreamError`.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx

from prefixcache.gateway.completion import Completion, UpstreamError
from prefixcache.gateway.stream_parse import ToolCalls, anthropic_event, openai_chunk
from prefixcache.server import anthropic_wire as wire

PROVIDERS = ("openai", "anthropic", "deepseek", "prefixcache", "vllm")
ANTHROPIC_VERSION = "2023-06-01"


@dataclass(frozen=True)
class UpstreamSpec:
    name: str
    url: str
    provider: str = "openai"
    models: tuple[str, ...] = ()
    key_env: str | None = None
    timeout_s: float = 60.0


def parse_upstream(text: str) -> UpstreamSpec:
    """Parse one ``--upstream`` value. Raises ValueError naming ``--upstream``."""
    name, sep, rest = text.partition("=")
    url, *opts = rest.split(",")
    if not sep or not name or not url.startswith(("http://", "https://")):
        raise ValueError(f"--upstream must be NAME=URL[,provider=...], got {text!r}")
    kw: dict = {}
    for opt in opts:
        k, eq, v = opt.partition("=")
        if not eq or k not in ("provider", "models", "key-env", "timeout-s"):
            raise ValueError(f"--upstream {name}: unknown option {opt!r} (provider, models, "
                             "key-env, timeout-s)")
        if k == "provider":
            if v not in PROVIDERS:
                raise ValueError(f"--upstream {name}: provider must be one of "
                                 f"{', '.join(PROVIDERS)}, got {v!r}")
            kw["provider"] = v
        elif k == "models":
            kw["models"] = tuple(m for m in v.split("|") if m)
        elif k == "key-env":
            kw["key_env"] = v
        else:
            try:
                kw["timeout_s"] = float(v)
            except ValueError:
                raise ValueError(f"--upstream {name}: timeout-s must be a number") from None
            if not (math.isfinite(kw["timeout_s"]) and kw["timeout_s"] > 0):
                raise ValueError(f"--upstream {name}: timeout-s must be > 0 and finite")
    return UpstreamSpec(name, url.rstrip("/"), **kw)


class Upstream:
    """One upstream: sends requests in its wire format over ``client``."""

    def __init__(self, spec: UpstreamSpec, client: httpx.AsyncClient):
        self.spec = spec
        self.client = client

    @property
    def provider(self) -> str:
        return self.spec.provider

    def _headers(self) -> dict[str, str]:
        key = os.environ.get(self.spec.key_env) if self.spec.key_env else None
        if self.provider == "anthropic":
            h = {"anthropic-version": ANTHROPIC_VERSION}
            return {**h, "x-api-key": key} if key else h
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _request(self, kind: str, body: dict, stream: bool) -> tuple[str, dict]:
        if self.provider == "anthropic":
            if kind != "chat":
                raise UpstreamError(400, f"upstream {self.spec.name} (anthropic) has no "
                                    "/v1/completions", "unsupported_endpoint")
            msg = body if "_messages" not in body else body["_messages"]
            return "/v1/messages", {**msg, "stream": stream}
        out = {k: v for k, v in body.items() if not k.startswith("_")}
        out["stream"] = stream
        if stream:
            out["stream_options"] = {"include_usage": True}
        else:
            out.pop("stream_options", None)
        return ("/v1/chat/completions" if kind == "chat" else "/v1/completions"), out

    async def complete(self, kind: str, body: dict) -> Completion:
        """Send ``body`` (a ``kind`` = "chat" | "completions" body; an Anthropic
        upstream reads the Messages body in ``body["_messages"]``) and return the
        answer. Raises UpstreamError."""
        path, payload = self._request(kind, body, False)
        try:
            r = await self.client.post(self.spec.url + path, json=payload,
                                       headers=self._headers(), timeout=self.spec.timeout_s)
        except httpx.TimeoutException:
            raise _timeout(self.spec) from None
        except httpx.HTTPError as exc:
            raise _broken(self.spec, exc) from None
        _check(r.status_code, r.content, self.spec)
        try:
            return self._parse(kind, r.json(), body.get("model"))
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise UpstreamError(502, f"upstream {self.spec.name} sent an unreadable answer: "
                                f"{exc}", "upstream_bad_response") from None

    def _parse(self, kind: str, d: dict, model: str | None) -> Completion:
        if self.provider == "anthropic":
            text = "".join(b.get("text", "") for b in d["content"] if b.get("type") == "text")
            return Completion(text, wire.STOP_TO_FINISH.get(str(d.get("stop_reason")), "stop"),
                              d.get("usage") or {}, self.provider, model or d.get("model", ""),
                              wire.tool_calls_of(d["content"]))
        c = d["choices"][0]
        text = c["message"].get("content") or "" if kind == "chat" else c["text"]
        calls = [{"id": t.get("id"), "type": "function", "function": {
            "name": (t.get("function") or {}).get("name"),
            "arguments": (t.get("function") or {}).get("arguments") or ""}}
            for t in (c["message"].get("tool_calls") or [] if kind == "chat" else [])]
        return Completion(text, c.get("finish_reason"), d.get("usage") or {}, self.provider,
                          model or d.get("model", ""), calls)

    async def stream(self, kind: str, body: dict) -> AsyncIterator[str | Completion]:
        """Text deltas, then the final :class:`Completion`. Raises UpstreamError (also
        mid-stream: a broken connection, an error event, a stream without its end)."""
        path, payload = self._request(kind, body, True)
        parts: list[str] = []
        finish: str | None = None
        usage: dict = {}
        tools = ToolCalls()
        ended = False
        try:
            async with self.client.stream("POST", self.spec.url + path, json=payload,
                                          headers=self._headers(),
                                          timeout=self.spec.timeout_s) as r:
                if r.status_code >= 400:
                    _check(r.status_code, await r.aread(), self.spec)
                event = ""
                async for line in r.aiter_lines():
                    if line.startswith("event:"):
                        event = line[6:].strip()
                        continue
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        ended = True
                        break
                    obj = json.loads(data)
                    if event == "error" or "error" in obj:
                        err = obj.get("error") or {}
                        raise UpstreamError(502, f"upstream {self.spec.name} failed mid-stream: "
                                            f"{err.get('message', 'error event')}",
                                            "upstream_error")
                    if self.provider == "anthropic":
                        delta, f, u, ended = anthropic_event(obj, ended, tools)
                    else:
                        delta, f, u = openai_chunk(obj, kind, tools)
                    finish = f or finish
                    usage = {**usage, **u} if u else usage
                    if delta:
                        parts.append(delta)
                        yield delta
                    if ended and self.provider == "anthropic":
                        break
        except httpx.TimeoutException:
            raise _timeout(self.spec) from None
        except (httpx.HTTPError, json.JSONDecodeError) as exc:
            raise _broken(self.spec, exc) from None
        if not ended:
            raise UpstreamError(502, f"upstream {self.spec.name} closed the stream before "
                                "its end", "upstream_disconnected")
        yield Completion("".join(parts), finish, usage, self.provider, body.get("model", ""),
                         tools.calls())


def _check(status: int, content: bytes, spec: UpstreamSpec) -> None:
    if status < 400:
        return
    try:
        err = json.loads(content).get("error") or {}
        msg = err.get("message") if isinstance(err, dict) else str(err)
    except (ValueError, AttributeError):
        msg = None
    msg = f"upstream {spec.name} answered {status}" + (f": {msg}" if msg else "")
    if status >= 500:
        raise UpstreamError(502, msg, "upstream_error")
    raise UpstreamError(status, msg, "upstream_rejected")


def _timeout(spec: UpstreamSpec) -> UpstreamError:
    return UpstreamError(504, f"upstream {spec.name} did not answer within {spec.timeout_s:g} s",
                         "upstream_timeout")


def _broken(spec: UpstreamSpec, exc: Exception) -> UpstreamError:
    return UpstreamError(502, f"upstream {spec.name} connection failed: {type(exc).__name__}",
                         "upstream_disconnected")
