"""Forwarding one OpenAI request to the chosen replica, streaming it through.

The body goes out byte for byte with the caller's ``Authorization`` (replicas use the
same key file, so they derive the same tenant). A replica that cannot be reached is
marked unhealthy (its index entries dropped); one that answers 429 or 503 sheds new
traffic for its ``Retry-After`` (1 s by default); either way the request is tried on
the next best replica, and when none is left the caller gets 503. Any other answer is
passed through unchanged: status, body, and the SSE stream event by event (a chunk is
held until its event is complete), with ``usage.cached_tokens`` exactly as the replica
reported it. The response carries ``x-prefixcache-replica: <number>``.

A replica that fails once its answer has begun (it died mid-stream: the connection
breaks) is marked unhealthy and counted in ``router_upstream_errors_total``; a stream
then ends cleanly with an OpenAI error event, ``data: {"error": {..., "code":
"upstream_error"}}`` and ``data: [DONE]`` (the partial event before the break is
dropped), a JSON answer becomes 502 with that error object.

Load accounting (:class:`~.replicas.Routed`): the request's prefill counts as queued on
its replica until the first byte of the answer, and it counts as running until the
answer ends (or the client goes away: the upstream stream is closed, so the replica
aborts it).
"""
from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable, Sequence

import httpx
from starlette.responses import Response, StreamingResponse

from prefixcache.http.errors import SERVER_ERROR, APIError, error_body
from prefixcache.router.metrics import RouterMetrics
from prefixcache.router.replicas import ReplicaSet, Routed

log = logging.getLogger(__name__)

FORWARDED_HEADERS = ("authorization", "content-type", "accept", "x-request-id",
                     "x-session-id")
DEFAULT_SHED_S = 1.0


def cached_tokens(body: dict) -> int | None:
    """``usage.prompt_tokens_details.cached_tokens`` of a response or chunk, if any."""
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return None
    details = usage.get("prompt_tokens_details") or {}
    value = details.get("cached_tokens") if isinstance(details, dict) else None
    return value if isinstance(value, int) else None


def _retry_after(resp: httpx.Response) -> float:
    try:
        return max(0.1, float(resp.headers.get("retry-after", DEFAULT_SHED_S)))
    except ValueError:
        return DEFAULT_SHED_S


def sse_event(data: dict | str) -> bytes:
    """One SSE ``data:`` event (a dict as compact JSON)."""
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {text}\n\n".encode()


class Proxy:
    """Sends requests to replicas and streams their answers back.

    Args:
        replicas: the :class:`ReplicaSet` (routing and load accounting).
        metrics: where decisions and reported hits are counted.
        client: the HTTP client (no read timeout: generations can be long).
    """

    def __init__(self, replicas: ReplicaSet, metrics: RouterMetrics, client: httpx.AsyncClient):
        self.replicas, self.metrics, self.client = replicas, metrics, client

    async def send(self, path: str, raw: bytes, headers: dict[str, str],
                   route: Callable[[Sequence[int]], Routed | None]) -> Response:
        """Route (``route(excluded)``), forward and answer.

        Raises:
            APIError: 503 ``no_healthy_replica`` when no replica can take it.
        """
        tried: list[int] = []
        while True:
            routed = route(tried)
            if routed is None:
                self.metrics.no_replica.inc()
                raise APIError(503, "no healthy replica can take this request; retry later",
                               type=SERVER_ERROR, code="no_healthy_replica",
                               headers={"Retry-After": "1"})
            i = routed.decision.replica
            url = self.replicas.specs[i].url + path
            try:
                resp = await self.client.send(
                    self.client.build_request("POST", url, content=raw, headers=headers),
                    stream=True)
            except httpx.TransportError as exc:
                log.warning("replica %d (%s) unreachable: %s", i, url, exc)
                self._failed(routed, tried)
                self.replicas.set_health(i, False)
                continue
            if resp.status_code in (429, 503):
                await resp.aclose()
                self._failed(routed, tried)
                self.replicas.shed(i, _retry_after(resp))
                continue
            return await self._answer(routed, resp)

    def _failed(self, routed: Routed, tried: list[int]) -> None:
        self.replicas.release(routed)
        self.metrics.upstream_errors.labels(str(routed.decision.replica)).inc()
        tried.append(routed.decision.replica)

    def _count(self, routed: Routed, prompt_tokens: int) -> None:
        d = routed.decision
        r = str(d.replica)
        self.metrics.decisions.labels(r, d.reason).inc()
        self.metrics.predicted.labels(r).inc(d.hit_tokens)
        self.metrics.prompt.labels(r).inc(prompt_tokens)

    async def _answer(self, routed: Routed, resp: httpx.Response) -> Response:
        replica = str(routed.decision.replica)
        self._count(routed, routed.queued_tokens + routed.decision.hit_tokens)
        headers = {"x-prefixcache-replica": replica}
        media = resp.headers.get("content-type", "application/json")
        if not media.startswith("text/event-stream"):
            try:
                body = await resp.aread()
            except httpx.HTTPError as exc:
                return Response(json.dumps(self._broken(routed, exc)), status_code=502,
                                media_type="application/json", headers=headers)
            finally:
                await resp.aclose()
                self.replicas.release(routed)
            self._observe_json(replica, body)
            return Response(body, status_code=resp.status_code, media_type=media,
                            headers=headers)
        return StreamingResponse(self._stream(routed, resp, replica), status_code=resp.status_code,
                                 media_type=media, headers=headers)

    def _observe_json(self, replica: str, body: bytes) -> None:
        try:
            value = cached_tokens(json.loads(body))
        except ValueError:
            return
        if value is not None:
            self.metrics.reported.labels(replica).inc(value)

    async def _stream(self, routed: Routed, resp: httpx.Response, replica: str
                      ) -> AsyncIterator[bytes]:
        pending, reported = b"", None
        try:
            try:
                async for chunk in resp.aiter_raw():
                    if not routed.prefilled:
                        self.replicas.prefilled(routed)
                    data = pending + chunk
                    pending, last = self._scan(data)
                    reported = last if last is not None else reported
                    if len(data) > len(pending):
                        yield data[:len(data) - len(pending)]
            except httpx.HTTPError as exc:
                yield sse_event(self._broken(routed, exc)) + sse_event("[DONE]")
                return
            if pending:
                yield pending
        finally:
            if reported is not None:  # once per answer (each chunk may repeat the usage)
                self.metrics.reported.labels(replica).inc(reported)
            with contextlib.suppress(httpx.HTTPError):
                await resp.aclose()
            self.replicas.release(routed)

    def _broken(self, routed: Routed, exc: Exception) -> dict:
        """The replica failed after its answer began: mark it down, count it, and the
        error object the client gets."""
        i = routed.decision.replica
        log.warning("replica %d (%s) failed mid-answer: %s: %s", i, self.replicas.specs[i].url,
                    type(exc).__name__, exc)
        self.metrics.upstream_errors.labels(str(i)).inc()
        self.replicas.set_health(i, False)
        return error_body(f"replica {i} failed while answering ({type(exc).__name__}); "
                          "the answer is incomplete, retry the request",
                          type=SERVER_ERROR, code="upstream_error")

    @staticmethod
    def _scan(data: bytes) -> tuple[bytes, int | None]:
        """The incomplete rest of ``data`` after its complete SSE events, and the
        ``cached_tokens`` of the last of them carrying a usage object (``None``: none).
        Only events with ``"usage":{`` are parsed (``"usage":null`` chunks are not)."""
        *events, rest = data.split(b"\n\n")
        last = None
        for ev in events:
            for line in ev.split(b"\n"):
                if line.startswith(b"data: {") and (b'"usage":{' in line or b'"usage": {' in line):
                    try:
                        value = cached_tokens(json.loads(line[6:]))
                    except ValueError:
                        continue
                    last = value if value is not None else last
        return rest, last
