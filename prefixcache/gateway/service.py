"""The gateway's request path: route, look up layers 1 and 2, coalesce, shape, forward.

=========  =================================================================
step       what happens
=========  =================================================================
check      field types and ranges (:mod:`.validate`; 400 naming the field)
translate  a Messages body becomes a Chat Completions body (one canonical form)
route      the upstream serving ``model`` (404 ``model_not_found`` if none)
bypass     sampled requests (temperature > 0, or unset, or n > 1) skip layers 1
           and 2 unless the tenant's policy has ``cache_sampled``
layer 1    the exact key (:mod:`.exact`) in the store; a hit is served (replayed
           as SSE when streaming)
layer 2    the tenant's semantic cache, only when its policy enables it
coalesce   one leader per key calls the upstream; followers wait for its
           answer, and one of them retries when it fails (:mod:`.singleflight`)
shape      Anthropic breakpoints added to the client's own (a Messages client's
           body is forwarded as sent) / OpenAI ``prompt_cache_key`` (:mod:`.shaping`);
           for our engine and vLLM a ``cache_salt`` from the tenant (KV isolation);
           volatile prefixes and rewritten history counted (:mod:`.history`)
store      only complete answers whose ``finish_reason`` the policy lists
           (default stop, length); never errors or broken streams
=========  =================================================================
"""
from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from prefixcache.gateway import accounting as acct
from prefixcache.gateway.completion import Completion, UpstreamError
from prefixcache.gateway.exact import exact_key, is_sampled, semantic_scope
from prefixcache.gateway.history import HistoryWatch
from prefixcache.gateway.metrics import GatewayMetrics
from prefixcache.gateway.policy import TenantPolicy
from prefixcache.gateway.requests import CLIENT_MESSAGES, BadRequest, canonical
from prefixcache.gateway.shaping import (
    ReuseClock,
    min_cacheable_tokens,
    place_breakpoints,
    prompt_cache_key,
    tenant_salt,
)
from prefixcache.gateway.upstreams import Upstream
from prefixcache.gateway.validate import check_fields
from prefixcache.server import anthropic_wire as wire

log = logging.getLogger(__name__)


@dataclass
class Outcome:
    """What the route answers: a JSON-ready completion, or a stream of items."""

    layer: str
    completion: Completion | None = None
    usage: acct.NormalUsage | None = None
    stream: AsyncIterator[str | Completion] | None = None
    final: dict = field(default_factory=dict)  # {"usage", "layer"} once a stream ends
    close: Callable[[], Awaitable[None]] | None = None  # ends a forwarded stream


class Gateway:
    def __init__(self, upstreams: list[Upstream], store: Any, *,
                 policies: dict[str, TenantPolicy] | None = None, semantic: Any = None,
                 shape: bool = True):
        from prefixcache.gateway.singleflight import SingleFlight

        self.upstreams = upstreams
        self.store = store
        self.policies = policies or {}
        self.semantic = semantic
        self.shape = shape  # False: forward unshaped (to measure what shaping gains)
        self.flights = SingleFlight()
        self.metrics = GatewayMetrics()
        self.history = HistoryWatch()
        self.reuse = ReuseClock()

    def policy(self, tenant: str | None) -> TenantPolicy:
        return self.policies.get(str(tenant)) or self.policies.get("*") or TenantPolicy()

    def route(self, model: Any) -> Upstream:
        if not isinstance(model, str) or not model:
            raise BadRequest(400, "model is required", "model")
        for u in self.upstreams:
            if model in u.spec.models:
                return u
        for u in self.upstreams:
            if not u.spec.models:
                return u
        raise BadRequest(404, f"no upstream serves model {model!r}", "model", "model_not_found")

    async def handle(self, tenant: str | None, client: str, body: Any) -> Outcome:
        """Serve one request. Raises BadRequest, or UpstreamError before any answer."""
        if not isinstance(body, dict):
            raise BadRequest(400, "the request body must be a JSON object", None)
        check_fields(client, body, min_max_tokens=0 if client == "completions" else 1)
        kind, req = canonical(client, body)
        upstream = self.route(req.get("model"))
        if body.get("max_tokens") == 0 and upstream.provider != "prefixcache":
            raise BadRequest(400, "max_tokens: must be an integer >= 1 (0, a prefill, for "
                             "prefixcache upstreams only), not 0", "max_tokens")
        stream = bool(body.get("stream"))
        policy = self.policy(tenant)
        if is_sampled(req) and not policy.cache_sampled:
            return await self._forward(tenant, kind, req, upstream, stream, "bypass", None)
        key = exact_key(tenant, kind, req, upstream.provider)
        while True:
            hit = await self._lookup(tenant, kind, req, key, policy)
            if hit is not None:
                return hit
            fut = self.flights.claim(key)
            if fut is None:
                break
            try:  # never longer than computing it ourselves would take
                outcome = await asyncio.wait_for(asyncio.shield(fut), upstream.spec.timeout_s)
            except asyncio.TimeoutError:
                return await self._forward(tenant, kind, req, upstream, stream, "miss", key,
                                           lead=False)
            if outcome is not None:  # the leader's answer, stored or not
                return self._hit(tenant, "exact", outcome)
        return await self._forward(tenant, kind, req, upstream, stream, "miss", key)

    async def _lookup(self, tenant: str | None, kind: str, req: dict, key: bytes,
                      policy: TenantPolicy) -> Outcome | None:
        raw = await self.store.get(key)
        if raw is not None:
            try:
                return self._hit(tenant, "exact", Completion.from_bytes(raw))
            except ValueError:  # corrupt: a miss, and the entry goes (DESIGN.md)
                log.warning("an unreadable layer-1 entry was removed")
                await self.store.delete(key)
        if policy.semantic and self.semantic is not None and kind == "chat":
            found = semantic_scope(tenant, req)
            if found is not None:
                scope, text = found
                hit = await asyncio.to_thread(self.semantic.lookup, scope, text)
                if hit is not None:
                    try:
                        return self._hit(tenant, "semantic", Completion.from_bytes(hit.value))
                    except ValueError:
                        log.warning("an unreadable layer-2 entry was ignored")
        return None

    def _hit(self, tenant: str | None, layer: str, comp: Completion) -> Outcome:
        u = acct.normalize(comp.provider, comp.usage)
        self.metrics.request(tenant, layer)
        self.metrics.saved(tenant, u, acct.cost(comp.provider, comp.model, u),
                           acct.cost_uncached(comp.provider, comp.model, u))
        return Outcome(layer, comp, u)

    def _shape(self, tenant: str | None, kind: str, req: dict, upstream: Upstream) -> dict:
        out = dict(req)
        if upstream.provider in ("prefixcache", "vllm") and tenant is not None:
            out["cache_salt"] = tenant_salt(tenant, req.get("cache_salt"))
        if kind != "chat":
            return out
        found = self.history.observe(tenant, req)
        self.metrics.breaker(tenant, found.volatile_span is not None, found.rewritten_tokens)
        if upstream.provider == "anthropic":
            try:  # a Messages client's body goes as sent; a chat body is translated
                msg = (copy.deepcopy(req[CLIENT_MESSAGES]) if CLIENT_MESSAGES in req
                       else wire.chat_to_messages(req))
            except (wire.WireError, ValueError) as exc:
                raise BadRequest(400, f"cannot translate to Messages: {exc}", "messages") \
                    from None
            if self.shape:
                place_breakpoints(msg, self.reuse.ttl(tenant, req),
                                  min_cacheable_tokens(str(req.get("model"))))
            out["_messages"] = msg
        elif upstream.provider == "openai" and self.shape and "prompt_cache_key" not in out:
            out["prompt_cache_key"] = prompt_cache_key(tenant, req)
        return out

    def _done(self, tenant: str | None, kind: str, req: dict, key: bytes | None,
              comp: Completion) -> acct.NormalUsage:
        u = acct.normalize(comp.provider, comp.usage)
        self.metrics.upstream(tenant, u, acct.cost(comp.provider, comp.model, u),
                              acct.cost_uncached(comp.provider, comp.model, u))
        if kind == "chat":
            self.history.answered(tenant, req, comp.text)
        return u

    async def _store(self, tenant: str | None, req: dict, key: bytes, comp: Completion) -> None:
        policy = self.policy(tenant)
        if comp.finish_reason not in policy.store_finish_reasons:
            return
        value = comp.to_bytes()
        await self.store.set(key, value, policy.cache_ttl_s)
        if policy.semantic and self.semantic is not None:
            found = semantic_scope(tenant, req)
            if found is not None:
                scope, text = found
                await asyncio.to_thread(self.semantic.store, scope, text, value)

    async def _forward(self, tenant: str | None, kind: str, req: dict, upstream: Upstream,
                       stream: bool, layer: str, key: bytes | None, *, lead: bool = True
                       ) -> Outcome:
        """Call the upstream; ``key``: store the answer under it; ``lead``: this call is
        the key's single-flight leader (it reports the outcome however it ends)."""
        flight = key if lead else None
        try:
            shaped = self._shape(tenant, kind, req, upstream)
            if not stream:
                comp = await upstream.complete(kind, shaped)
                u = self._done(tenant, kind, req, key, comp)
                if key is not None:
                    await self._store(tenant, req, key, comp)
                if flight is not None:
                    self.flights.finish(flight, comp)
                self.metrics.request(tenant, layer)
                return Outcome(layer, comp, u)
            items = upstream.stream(kind, shaped)
            first = await items.__anext__()  # a failure before any text keeps its status
        except BaseException as exc:
            if flight is not None:
                self.flights.finish(flight, None)
            if isinstance(exc, UpstreamError):
                self.metrics.request(tenant, "error")
            raise
        outcome = Outcome(layer)
        state: dict = {}

        async def close() -> None:  # idempotent; also runs when the relay never started
            if state.get("done"):
                return
            state["done"] = True
            if flight is not None:
                self.flights.finish(flight, state.get("comp"))
            await items.aclose()  # type: ignore[attr-defined]

        outcome.close = close
        outcome.stream = self._relay(tenant, kind, req, key, first, items, outcome, state)
        return outcome

    async def _relay(self, tenant: str | None, kind: str, req: dict, key: bytes | None,
                     first: str | Completion, items: AsyncIterator[str | Completion],
                     outcome: Outcome, state: dict) -> AsyncIterator[str | Completion]:
        try:
            item = first
            while True:
                if isinstance(item, Completion):
                    comp = state["comp"] = item
                    outcome.final["usage"] = self._done(tenant, kind, req, key, comp)
                    outcome.final["layer"] = outcome.layer
                    if key is not None:
                        await self._store(tenant, req, key, comp)
                    self.metrics.request(tenant, outcome.layer)
                    yield comp
                    return
                yield item
                item = await items.__anext__()
        except UpstreamError:
            self.metrics.request(tenant, "error")
            raise
        finally:
            assert outcome.close is not None
            await outcome.close()


def replay(comp: Completion, outcome: Outcome) -> AsyncIterator[str | Completion]:
    """A stored answer as a stream: its text as one delta, then the Completion."""
    outcome.final.update(usage=outcome.usage, layer=outcome.layer)

    async def gen() -> AsyncIterator[str | Completion]:
        if comp.text:
            yield comp.text
        yield comp

    return gen()
