"""In-process checks of the server's parts: the engine thread, API keys, body parsing."""
from __future__ import annotations

import asyncio
import json
import sys
import threading
import time

import pytest

from prefixcache.http.auth import Authenticator, KeyFileError, load_key_file
from prefixcache.http.errors import APIError
from prefixcache.outputs import CompletionOutput, RequestMetrics, RequestOutput
from prefixcache.server.async_engine import AsyncEngine, RequestSpec
from prefixcache.server.protocol import ChatCompletionRequest, CompletionRequest, parse_body
from tests.helpers.wait import DEADLINE_S, wait_until


class FakeEngine:
    """Each request produces ``n`` tokens, one per step; ``fail_next`` makes the next
    step raise."""

    def __init__(self, n: int = 3):
        self.n = n
        self.reqs: dict[str, list[int]] = {}
        self.steps = 0
        self.fail_next = 0
        self.pending: list[RequestOutput] = []
        self.thread_ids: set[int] = set()
        self.calls: list[str] = []     # "warmup" / "add" in the order the thread made them
        self.warmup_error: Exception | None = None

    def warmup(self):
        self.thread_ids.add(threading.get_ident())
        self.calls.append("warmup")
        if self.warmup_error is not None:
            raise self.warmup_error
        return 5

    def _out(self, rid: str, finished: bool, reason: str | None) -> RequestOutput:
        toks = self.reqs.get(rid, [])
        return RequestOutput(rid, None, [1, 2], [CompletionOutput(0, "", list(toks),
                             finish_reason=reason)], finished,
                             metrics=RequestMetrics(arrival_time=0.0))

    def add_request(self, rid, ids, params, **kw):
        self.thread_ids.add(threading.get_ident())
        self.calls.append("add")
        if rid in self.reqs:
            raise ValueError("dup")
        self.reqs[rid] = []

    def abort_request(self, rid):
        self.thread_ids.add(threading.get_ident())
        if rid not in self.reqs:
            return False
        self.pending.append(self._out(rid, True, "abort"))
        del self.reqs[rid]
        return True

    def has_unfinished_requests(self):
        return bool(self.reqs)

    def step(self):
        self.thread_ids.add(threading.get_ident())
        outs, self.pending = self.pending, []
        if not self.reqs:
            return outs
        self.steps += 1
        time.sleep(0.001)  # behaviour: a step takes time
        if self.fail_next:
            self.fail_next -= 1
            raise RuntimeError("boom")
        for rid in list(self.reqs):
            self.reqs[rid].append(7)
            done = len(self.reqs[rid]) >= self.n
            outs.append(self._out(rid, done, "length" if done else None))
            if done:
                del self.reqs[rid]
        return outs


def _spec(rid: str) -> RequestSpec:
    return RequestSpec(rid, [1, 2], None)  # type: ignore[arg-type]


async def _drain(q: asyncio.Queue) -> list:
    items = []
    while True:
        idx, item = await asyncio.wait_for(q.get(), DEADLINE_S)
        items.append(item)
        if isinstance(item, BaseException) or item.finished:
            return items


def _parked(thread: threading.Thread | None) -> bool:
    """``thread`` is blocked in ``Condition.wait`` (asleep until notified)."""
    frame = None if thread is None else sys._current_frames().get(thread.ident or 0)
    return frame is not None and frame.f_code is threading.Condition.wait.__code__


def test_engine_thread_streams_and_sleeps_when_idle():
    fake = FakeEngine(n=3)
    ae = AsyncEngine(fake)
    ae.start()
    try:
        async def main():
            q1, q2 = asyncio.Queue(), asyncio.Queue()
            await ae.add_requests([_spec("a")], q1)
            await ae.add_requests([_spec("b")], q2)
            return await _drain(q1), await _drain(q2)
        a, b = asyncio.run(main())
        assert [len(o.outputs[0].token_ids) for o in a] == [1, 2, 3]
        assert a[-1].finished and b[-1].finished
        steps = fake.steps
        wait_until(lambda: _parked(ae._thread), "the engine thread waiting for work")
        assert fake.steps == steps  # idle: no stepping
        assert fake.thread_ids == {ae._thread.ident}  # every engine call on its thread
    finally:
        ae.shutdown()
    assert not ae.is_alive()


@pytest.mark.parametrize("warmup,error,calls", [
    (True, None, ["warmup", "add"]),
    (True, RuntimeError("no memory"), ["warmup", "add"]),  # a failed warmup: serving goes on
    (False, None, ["add"]),                                 # none unless asked
])
def test_warmup_runs_on_the_engine_thread_before_any_command(warmup, error, calls):
    fake = FakeEngine(n=2)
    fake.warmup_error = error
    ae = AsyncEngine(fake, warmup=warmup)
    ae.start()
    try:
        assert ae.wait_warm(DEADLINE_S)

        async def main():
            q = asyncio.Queue()
            await ae.add_requests([_spec("a")], q)
            return await _drain(q)
        out = asyncio.run(main())
        assert out[-1].finished and out[-1].outputs[0].finish_reason == "length"
        assert fake.calls == calls
        assert fake.thread_ids == {ae._thread.ident}
    finally:
        ae.shutdown()


def test_step_error_does_not_kill_the_thread():
    fake = FakeEngine(n=2)
    ae = AsyncEngine(fake)
    ae.start()
    try:
        async def main():
            q = asyncio.Queue()
            fake.fail_next = 1
            await ae.add_requests([_spec("x")], q)
            failed = await _drain(q)
            q2 = asyncio.Queue()
            await ae.add_requests([_spec("y")], q2)
            return failed, await _drain(q2)
        failed, ok = asyncio.run(main())
        assert isinstance(failed[-1], RuntimeError) and "boom" in str(failed[-1])
        assert ok[-1].finished and ok[-1].outputs[0].finish_reason == "length"
        assert ae.is_alive() and ae.step_errors == 1
        assert not fake.reqs  # the failed request was aborted
    finally:
        ae.shutdown()


def test_add_errors_propagate_and_add_is_atomic():
    fake = FakeEngine(n=10**9)
    ae = AsyncEngine(fake)
    ae.start()
    try:
        async def main():
            q = asyncio.Queue()
            await ae.add_requests([_spec("dup")], q)
            with pytest.raises(ValueError):
                await ae.add_requests([_spec("new"), _spec("dup")], q)
            assert await ae.call(lambda e: sorted(e.reqs)) == ["dup"]  # "new" was undone
            ae.abort("dup")
            assert await ae.call(lambda e: e.reqs) == {}
        asyncio.run(main())
    finally:
        ae.shutdown()


def test_key_file(tmp_path):
    good = tmp_path / "keys.json"
    good.write_text(json.dumps({"k1": {"tenant": "a"}, "k2": {"tenant": "b", "admin": True}}))
    auth = Authenticator.from_file(good)
    assert auth.tenants == ["a", "b"]
    assert auth.authenticate("Bearer k1").tenant == "a"
    assert auth.authenticate("bearer k2").admin
    for header in (None, "", "Bearer", "Bearer k3", "Token k1"):
        with pytest.raises(APIError) as e:
            auth.authenticate(header)
        assert e.value.status == 401
    with pytest.raises(APIError) as e:
        auth.require_admin(auth.authenticate("Bearer k1"))
    assert e.value.status == 403
    for bad in ([], {}, {"k": "a"}, {"k": {"tenant": ""}}, {"k": {"tenant": "a", "admin": "yes"}},
                {"k": {"tenant": "a", "role": "x"}}, {" k": {"tenant": "a"}}):
        good.write_text(json.dumps(bad))
        with pytest.raises(KeyFileError):
            load_key_file(good)
    good.write_text("{not json")
    with pytest.raises(KeyFileError):
        load_key_file(good)
    with pytest.raises(KeyFileError):
        load_key_file(tmp_path / "missing.json")
    single = Authenticator.from_file(None)
    assert single.authenticate(None).tenant is None and not single.authenticate(None).admin
    assert Authenticator.from_file(None, allow_reset=True).authenticate("Bearer x").admin


@pytest.mark.parametrize("model,body,param", [
    (CompletionRequest, b'{"prompt": [1, [2]]}', "prompt"),
    (CompletionRequest, b'{"prompt": "x", "max_tokens": "3"}', "max_tokens"),
    (CompletionRequest, b'{"prompt": "x", "stream": 1}', "stream"),
    (ChatCompletionRequest, b'{"messages": [{"role": "user", "content": 5}]}',
     "messages[0].content"),
    (ChatCompletionRequest, b'{"messages": [{"role": "user"}, {"role": 3}]}', "messages[1].role"),
    (ChatCompletionRequest, b'{"messages": {}}', "messages"),
    (CompletionRequest, b'nope', None),
    (CompletionRequest, b'"a string"', None),
])
def test_parse_errors_name_the_parameter(model, body, param):
    with pytest.raises(APIError) as e:
        parse_body(model, body)
    assert e.value.status == 400 and e.value.param == param


def test_unknown_fields_are_kept_aside():
    req = parse_body(CompletionRequest, b'{"prompt": "x", "frobnicate": 1, "user": "u"}')
    assert req.model_extra == {"frobnicate": 1}
    assert req.user == "u"


def _stream_text(chunks: list[str]) -> str:
    text = ""
    for c in chunks:
        if c.startswith("data: {"):
            obj = json.loads(c[6:])
            text += "".join(ch.get("text", "") for ch in obj["choices"])
    return text


def test_stream_holds_back_a_possible_stop_string():
    from prefixcache.sampling_params import SamplingParams
    from prefixcache.server.responses import Prepared, ResponseRenderer

    render = ResponseRenderer(tokenizer=None)
    params = SamplingParams(stop=["END"], max_tokens=10)
    prep = Prepared("completions", "cmpl-1", "m", [([1, 2], None)], params, True, True, False,
                    False, None, None, 0.0)

    def out(text: str, n: int, reason: str | None) -> RequestOutput:
        return RequestOutput("cmpl-1", None, [1, 2],
                             [CompletionOutput(0, text, [5] * n, finish_reason=reason)],
                             reason is not None, num_cached_tokens=0)

    async def updates():
        for o in (out("hello E", 1, None), out("hello EN", 2, None), out("hello ", 3, "stop")):
            yield {0: o}

    async def main():
        return [c async for c in render.stream(prep, updates())]

    chunks = asyncio.run(main())
    assert _stream_text(chunks) == "hello "
    assert chunks[-1] == "data: [DONE]\n\n"
    usage = json.loads(chunks[-2][6:])["usage"]
    assert usage == {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5,
                     "prompt_tokens_details": {"cached_tokens": 0}}
