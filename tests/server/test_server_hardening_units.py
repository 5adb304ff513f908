"""In-process checks of the hardening parts: stop caps, log cleaning, key-file
duplicates, off-loop body parsing, Host/Origin parsing, the drain."""
from __future__ import annotations

import asyncio
import io
import json
import logging
import threading

import pytest

from prefixcache.http.auth import KeyFileError, load_key_file
from prefixcache.http.bodies import PARSE_IN_THREAD_BYTES
from prefixcache.http.drain import Drain, ShuttingDown
from prefixcache.http.logsafe import MAX_MESSAGE_CHARS, SafeFormatter, clean, name_list
from prefixcache.sampling_params import (
    MAX_STOP_BYTES,
    MAX_STOP_STRINGS,
    MAX_STOP_TOKEN_IDS,
    ParamError,
    SamplingParams,
)
from prefixcache.server import bodies
from prefixcache.server.crosssite import default_allowed_hosts, host_name, is_json_type
from prefixcache.server.protocol import ChatCompletionRequest, CompletionRequest
from tests.helpers.wait import DEADLINE_S


# -- stop caps and dedup ---------------------------------------------------------------
def test_stop_lists_are_deduplicated_in_order():
    p = SamplingParams(stop=["b", "a", "b", "c", "a"], stop_token_ids=[5, 3, 5, 5, 9, 3])
    assert p.stop == ["b", "a", "c"]
    assert p.stop_token_ids == [5, 3, 9]
    assert SamplingParams(stop_token_ids=[7] * 1_000_000).stop_token_ids == [7]
    assert SamplingParams(stop=["x"] * 100).stop == ["x"]


def test_stop_caps_name_the_parameter():
    SamplingParams(stop_token_ids=list(range(MAX_STOP_TOKEN_IDS)))
    SamplingParams(stop=[f"{i:02d}" for i in range(MAX_STOP_STRINGS)])
    SamplingParams(stop=["é" * (MAX_STOP_BYTES // 2)])             # 2 bytes a character
    cases = [({"stop_token_ids": list(range(MAX_STOP_TOKEN_IDS + 1))}, "stop_token_ids"),
             ({"stop_token_ids": list(range(1_000_000))}, "stop_token_ids"),
             ({"stop_token_ids": [1, True]}, "stop_token_ids"),
             ({"stop_token_ids": [1, -2]}, "stop_token_ids"),
             ({"stop": [f"s{i}" for i in range(MAX_STOP_STRINGS + 1)]}, "stop"),
             ({"stop": ["é" * (MAX_STOP_BYTES // 2) + "x"]}, "stop"),
             ({"stop": ["a" * 3000, "b" * 3000]}, "stop"),
             ({"stop": ["ok", ""]}, "stop")]
    for kw, param in cases:
        with pytest.raises(ParamError) as e:
            SamplingParams(**kw)
        assert e.value.param == param, kw


# -- log cleaning ------------------------------------------------------------------------
def test_clean_escapes_control_characters_and_truncates():
    assert clean("ok_name") == "ok_name"
    assert clean("a\nb\r\x1b[31m\u2028") == "a\\nb\\r\\x1b[31m\\u2028"
    assert clean("x" * 100) == "x" * 64 + "..."
    assert clean("\x00" * 64) == "\\x00" * 16 + "..."               # cut after escaping
    out = clean("".join(chr(c) for c in range(0x20)) + "é" * 50)
    assert out.isascii() and out.isprintable() and len(out) <= 67


def test_name_list_bounds_the_names():
    assert name_list(["a", "b\n"]) == "a, b\\n"
    long = name_list([f"n{i}" + "z" * 500 for i in range(1000)])
    assert long.endswith("(+992 more)") and long.count(", ") == 7
    assert len(long) <= 8 * 67 + 7 * 2 + 12


def test_safe_formatter_keeps_each_record_on_its_own_lines():
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(SafeFormatter("%(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("test-safe-formatter")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("path %s", "/x\nERROR forged: \x1b[2J\r")
        try:
            raise ValueError("bad\nERROR forged too")
        except ValueError:
            logger.exception("failed on %s", "/y")
        logger.warning("%s", "z" * (MAX_MESSAGE_CHARS + 500))
    finally:
        logger.removeHandler(handler)
    lines = buf.getvalue().splitlines()
    assert lines[0] == "WARNING test-safe-formatter: path /x\\nERROR forged: \\x1b[2J\\r"
    assert lines[1] == "ERROR test-safe-formatter: failed on /y"
    assert lines[2] == "    Traceback (most recent call last):"
    assert "    ERROR forged too" in lines             # indented: not a record of its own
    records = [ln for ln in lines if not ln.startswith(" ")]
    assert [r.split()[0] for r in records] == ["WARNING", "ERROR", "WARNING"]
    assert records[-1].endswith("... (+500 chars)")
    assert len(records[-1]) < MAX_MESSAGE_CHARS + 100
    assert "\x1b" not in buf.getvalue()


# -- key files ---------------------------------------------------------------------------
def _key_file(tmp_path, text: str):
    path = tmp_path / "keys.json"
    path.write_text(text)
    return path


def test_a_key_listed_twice_is_refused_by_position(tmp_path):
    secret = "sk-very-secret-key"
    cases = [  # (file, expected message part)
        (f'{{"sk-other": {{"tenant": "a"}}, "{secret}": {{"tenant": "a"}}, '
         f'"{secret}": {{"tenant": "a"}}}}', "key #3 repeats key #2;"),
        (f'{{"{secret}": {{"tenant": "a"}}, "sk-b": {{"tenant": "b"}}, '
         f'"{secret}": {{"tenant": "b"}}}}', "key #3 repeats key #1 to another tenant"),
        (f'{{"sk-a": {{"tenant": "a"}}, "{secret}": {{"tenant": "a", "tenant": "b"}}}}',
         "key #2: a field is listed twice"),
        (f'{{"sk-a": {{"tenant": "a"}}, "{secret}": {{"tenant": "a", "admin": 1}}}}',
         "key #2: 'admin' must be true or false"),
    ]
    for text, expected in cases:
        with pytest.raises(KeyFileError) as e:
            load_key_file(_key_file(tmp_path, text))
        msg = str(e.value)
        assert expected in msg, msg
        assert secret[:4] not in msg and "secret" not in msg
    ok = load_key_file(_key_file(tmp_path, '{"k1": {"tenant": "a"}, "k2": {"tenant": "a"}}'))
    assert ok == {"k1": {"tenant": "a", "admin": False}, "k2": {"tenant": "a", "admin": False}}


def test_serve_refuses_a_duplicate_key_at_start(tmp_path, capsys):
    from prefixcache.cli import main

    keys = _key_file(tmp_path, '{"sk-dup": {"tenant": "a"}, "sk-dup": {"tenant": "b"}}')
    assert main(["serve", "--model", "builtin:tiny", "--api-keys", str(keys)]) == 2
    err = capsys.readouterr().err
    assert "key #2 repeats key #1 to another tenant" in err and "sk-dup" not in err


# -- body parsing off the event loop -------------------------------------------------------
def test_large_bodies_are_parsed_on_the_worker_thread(monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    threads: list[str] = []
    real = bodies.parse_body

    def spy(model, raw):
        threads.append(threading.current_thread().name)
        return real(model, raw)

    monkeypatch.setattr(bodies, "parse_body", spy)
    small = json.dumps({"prompt": "hi"}).encode()
    large = json.dumps({"messages": [{"role": "user", "content": "x" * 30}] * 4000}).encode()
    assert len(small) < PARSE_IN_THREAD_BYTES <= len(large)
    pool = ThreadPoolExecutor(1, thread_name_prefix="test-parse")

    async def main():
        a = await bodies.parse_json(CompletionRequest, small, pool)
        b = await bodies.parse_json(ChatCompletionRequest, large, pool)
        return a, b

    try:
        a, b = asyncio.run(main())
    finally:
        pool.shutdown()
    assert a.prompt == "hi" and len(b.messages) == 4000
    assert threads[0] == threading.main_thread().name
    assert threads[1].startswith("test-parse")


# -- Host and Origin parsing ---------------------------------------------------------------
def test_host_names_and_defaults():
    assert host_name("Example.COM:8000") == "example.com"
    assert host_name("[::1]:8000") == "::1"
    assert host_name("::1") == "::1"
    assert host_name("localhost") == "localhost"
    assert default_allowed_hosts("127.0.0.1") == ["127.0.0.1", "::1", "localhost"]
    assert default_allowed_hosts("myhost.lan") == ["127.0.0.1", "::1", "localhost", "myhost.lan"]
    assert default_allowed_hosts("0.0.0.0") is None and default_allowed_hosts("::") is None
    assert is_json_type("application/json") and is_json_type("APPLICATION/JSON; charset=utf-8")
    assert is_json_type("application/merge-patch+json")
    for t in (None, "", "text/plain", "multipart/form-data", "application/jsonx"):
        assert not is_json_type(t), t


# -- the drain ---------------------------------------------------------------------------
def test_drain_tells_running_queues_when_the_grace_period_ends():
    async def main():
        drain = Drain(grace_s=0.05)
        drain.bind(asyncio.get_running_loop())
        q1: asyncio.Queue = asyncio.Queue()
        q2: asyncio.Queue = asyncio.Queue()
        drain.track(q1)
        drain.track(q2)
        drain.untrack(q2)                    # finished before the shutdown
        drain.begin_threadsafe()
        await asyncio.sleep(0)               # begin runs on the loop
        assert drain.draining and not drain.expired and q1.empty()
        idx, item = await asyncio.wait_for(q1.get(), DEADLINE_S)
        assert idx == -1 and isinstance(item, ShuttingDown)
        assert drain.expired and q2.empty()
        late: asyncio.Queue = asyncio.Queue()
        drain.track(late)                    # tracked after expiry: told at once
        assert isinstance(late.get_nowait()[1], ShuttingDown)

    asyncio.run(main())
    with pytest.raises(ValueError):
        Drain(grace_s=-1)
