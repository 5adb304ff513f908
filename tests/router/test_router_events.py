"""The router's reading of a replica's KV event stream (no sockets): order, gaps filled
from replay or turned into a clear, restarts, duplicates, bad payloads, both of vLLM's
encodings."""
from __future__ import annotations

import msgpack
import pytest

from prefixcache.cache.events import AllPagesCleared, PageRemoved, PageStored
from prefixcache.engine.kv_events import encode_batch
from prefixcache.router.event_stream import EventStream, decode_batch

TOPIC = b"kv@aaaa@m"


def _stored(*hs: bytes) -> bytes:
    return encode_batch([PageStored(list(hs), None, bytearray(16 * 4 * len(hs)), 16)], "CPU")


def _stream(replay=None):
    applied: list[tuple[str, list[bytes]]] = []
    return EventStream(lambda k, h: applied.append((k, h)), replay), applied


def test_in_order_then_duplicate_then_restart():
    s, applied = _stream()
    s.on_message(TOPIC, 0, encode_batch([AllPagesCleared()], "CPU"))
    s.on_message(TOPIC, 1, _stored(b"a", b"b"))
    s.on_message(TOPIC, 1, _stored(b"a", b"b"))  # duplicate: ignored
    s.on_message(TOPIC, 2, encode_batch([PageRemoved([b"a"])], "CPU"))
    assert applied == [("cleared", []), ("cleared", []), ("stored", [b"a", b"b"]),
                       ("removed", [b"a"])]
    applied.clear()
    s.on_message(b"kv@bbbb@m", 0, _stored(b"c"))  # a new incarnation
    assert applied == [("cleared", []), ("stored", [b"c"])] and s.restarts == 1


def test_gaps_are_filled_from_replay_or_cleared():
    log = {1: _stored(b"x"), 2: _stored(b"y")}
    s, applied = _stream(lambda start: [(q, p) for q, p in sorted(log.items()) if q >= start])
    s.on_message(TOPIC, 0, _stored(b"w"))
    s.on_message(TOPIC, 3, _stored(b"z"))
    assert [h for k, h in applied if k == "stored"] == [[b"w"], [b"x"], [b"y"], [b"z"]]
    assert (s.gaps, s.unfilled) == (1, 0)
    applied.clear()
    s.on_message(TOPIC, 6, _stored(b"q"))  # 4 and 5 are gone from the replay buffer
    assert applied == [("cleared", []), ("stored", [b"q"])] and s.unfilled == 1
    applied.clear()
    s.on_message(TOPIC, 7, b"\xc1not msgpack")
    assert applied == [("cleared", [])] and s.bad == 1


def test_decodes_vllm_array_encoding_and_int_hashes():
    old = msgpack.packb([1.5, [["BlockStored", [7, 8], None, [1] * 32, 16, None, "GPU"],
                              ["BlockRemoved", [7], "GPU"], ["AllBlocksCleared"]]])
    b = decode_batch(old)
    eight = (7).to_bytes(8, "big", signed=True)
    assert b.ts == 1.5 and b.events == [("stored", [eight, (8).to_bytes(8, "big")]),
                                        ("removed", [eight]), ("cleared", [])]
    with pytest.raises(ValueError, match="unknown KV event type"):
        decode_batch(msgpack.packb({"ts": 0, "events": [{"type": "Nope"}]}))


def test_a_topic_without_incarnation_restarts_when_its_sequence_goes_back():
    s, applied = _stream()
    s.on_message(b"kv-events", 0, encode_batch([AllPagesCleared()], "CPU"))
    s.on_message(b"kv-events", 1, _stored(b"a"))
    s.on_message(b"kv-events", 2, _stored(b"b"))
    assert s.restarts == 0
    applied.clear()
    # a vLLM publisher restarted: its topic is the same, its sequence starts again
    s.on_message(b"kv-events", 0, encode_batch([AllPagesCleared()], "CPU"))
    assert applied == [("cleared", []), ("cleared", [])] and s.restarts == 1
    s.on_message(b"kv-events", 1, _stored(b"c"))
    assert applied[-1] == ("stored", [b"c"]) and s.last_seq == 1 and s.restarts == 1


def test_a_batch_sent_again_to_a_joining_subscriber_is_a_duplicate_not_a_restart():
    s, applied = _stream()
    s.on_message(TOPIC, 0, encode_batch([AllPagesCleared()], "CPU"))
    s.on_message(TOPIC, 1, _stored(b"a"))
    applied.clear()
    s.on_message(TOPIC, 1, _stored(b"a"))  # the publisher's answer to another subscriber
    s.on_message(TOPIC, 0, encode_batch([AllPagesCleared()], "CPU"))
    assert applied == [] and s.restarts == 0
    # the restarted publisher's first batch, sent again when the subscriber reconnects:
    # the entries of the old incarnation go at once, and the restart is counted
    s.on_message(b"kv@bbbb@m", 0, encode_batch([AllPagesCleared()], "CPU"))
    assert applied == [("cleared", []), ("cleared", [])] and s.restarts == 1
