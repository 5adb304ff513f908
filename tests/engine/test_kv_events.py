"""KV events: the cache's event log, vLLM's wire schema over ZeroMQ, sequence numbers,
replay, and a new incarnation per engine."""
from __future__ import annotations

import socket

import msgpack
import pytest
import zmq

from prefixcache.cache.events import AllPagesCleared, CacheEventLog, PageRemoved, PageStored
from prefixcache.cache.hashing import PageHasher, tokens_to_bytes
from prefixcache.engine.llm import LLM
from prefixcache.router.event_stream import EventSubscriber, decode_batch
from prefixcache.sampling_params import SamplingParams
from tests.helpers.wait import DEADLINE_S, wait_until

BS = 16


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _chain(ids: list[int], model: str, tenant=None) -> list[bytes]:
    h = PageHasher(model)
    root = h.root_hash(h.root_key(tenant, None))
    n = len(ids) // BS
    return h.chain(root, tokens_to_bytes(ids[:n * BS]), h.extra_bytes(), 4 * BS)


def test_event_log_merges_a_chain_and_collapses_when_full():
    log = CacheEventLog(BS, max_events=3)
    log.stored(b"a", None, tokens_to_bytes(range(16)))
    log.stored(b"b", b"a", tokens_to_bytes(range(16, 32)))
    log.stored(b"x", b"q", tokens_to_bytes(range(16)))
    log.removed(b"a")
    log.removed(b"x")
    ev = log.drain()
    assert len(ev) == 3 and len(log) == 0
    assert isinstance(ev[0], PageStored) and ev[0].page_hashes == [b"a", b"b"]
    assert ev[0].parent_hash is None and ev[0].token_ids == list(range(32))
    assert isinstance(ev[2], PageRemoved) and ev[2].page_hashes == [b"a", b"x"]
    for i in range(3):  # the 4th event overflows: what was held collapses to a clear
        log.removed(bytes([i]))
        log.stored(bytes([i]), b"zz", tokens_to_bytes(range(16)))
    ev = log.drain()
    assert log.overflows == 1 and [type(e) for e in ev] == [AllPagesCleared, PageRemoved,
                                                            PageStored]
    assert ev[1].page_hashes == [b"\x02"] and ev[2].page_hashes == [b"\x02"]
    with pytest.raises(ValueError, match="max_events"):
        CacheEventLog(BS, max_events=0)


def _recv_all(sub: zmq.Socket, until) -> list[tuple[bytes, int, bytes]]:
    """Messages received until ``until(messages so far)`` holds."""
    got: list[tuple[bytes, int, bytes]] = []

    def done() -> bool:
        if sub.poll(100):
            topic, seq, payload = sub.recv_multipart()
            got.append((topic, int.from_bytes(seq, "big"), payload))
        return until(got)

    wait_until(done, lambda: f"KV events (got {len(got)})", poll_s=0)
    return got


def test_engine_publishes_vllm_schema_with_our_page_hashes():
    ep, rep = f"tcp://127.0.0.1:{_port()}", f"tcp://127.0.0.1:{_port()}"
    llm = LLM("builtin:tiny", num_pages=64, kv_events_endpoint=ep,
              kv_events_replay_endpoint=rep)
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(ep)
    try:
        # joining is answered with the last batch sent: the incarnation's clear, seq 0
        hello = _recv_all(sub, lambda g: len(g) == 1)
        assert hello[0][0] == f"kv@{llm.engine.kv_events.incarnation}@builtin:tiny".encode()
        assert hello[0][1] == 0 and decode_batch(hello[0][2]).events == [("cleared", [])]
        ids = list(range(5, 5 + 3 * BS + 3))
        chain = _chain(ids, llm.engine.fingerprint)
        llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=1))
        # skips what is left of the probes: the batch that stores this prompt's pages
        got = _recv_all(sub, lambda g: bool(g) and any(
            e["type"] == "BlockStored" and e["block_hashes"] == chain
            for e in msgpack.unpackb(g[-1][2])["events"]))
        topic, seq, payload = got[-1]
        assert topic == f"kv@{llm.engine.kv_events.incarnation}@builtin:tiny".encode()
        batch = msgpack.unpackb(payload, raw=False)
        assert set(batch) == {"ts", "events", "data_parallel_rank"}
        stored = [e for e in batch["events"] if e["type"] == "BlockStored"]
        assert len(stored) == 1
        ev = stored[0]
        # our tenant-rooted page hashes, rooted in the model fingerprint
        assert ev["block_hashes"] == _chain(ids, llm.engine.fingerprint)
        assert ev["parent_block_hash"] is None and ev["block_size"] == BS
        assert ev["token_ids"] == ids[:3 * BS]
        assert ev["medium"] == "CPU" and ev["lora_id"] is None and "lora_name" in ev
        llm.reset_prefix_cache()
        got = _recv_all(sub, lambda g: any(b"BlockRemoved" in p for _, _, p in g))
        removed = [e for e in msgpack.unpackb(got[-1][2])["events"]
                   if e["type"] == "BlockRemoved"]
        assert sorted(removed[0]["block_hashes"]) == sorted(_chain(ids, llm.engine.fingerprint))
        assert got[-1][1] == seq + 1  # consecutive sequence numbers
        # the replay socket returns the whole history, first the incarnation's clear
        dealer = zmq.Context.instance().socket(zmq.DEALER)
        dealer.setsockopt(zmq.RCVTIMEO, int(DEADLINE_S * 1000))
        dealer.connect(rep)
        dealer.send_multipart((b"", (0).to_bytes(8, "big")))
        replayed = []
        while True:
            _, s, p = dealer.recv_multipart()
            if int.from_bytes(s, "big", signed=True) == -1:
                break
            replayed.append((int.from_bytes(s, "big"), p))
        dealer.close(0)
        assert [s for s, _ in replayed] == list(range(seq + 2))
        first = decode_batch(replayed[0][1])
        assert first.events == [("cleared", [])]
    finally:
        sub.close(0)
        llm.engine.close()


def test_subscriber_detects_restart_and_fills_gaps_from_replay():
    ep, rep = f"tcp://127.0.0.1:{_port()}", f"tcp://127.0.0.1:{_port()}"
    applied: list[tuple[str, int]] = []
    llm = LLM("builtin:tiny", num_pages=64, kv_events_endpoint=ep,
              kv_events_replay_endpoint=rep)
    sub = EventSubscriber(ep, rep, lambda kind, hs: applied.append((kind, len(hs))),
                          replay_timeout_s=DEADLINE_S)
    sub.start()
    try:
        wait_until(lambda: sub.stream.last_seq == 0, "the joining subscriber got no batch")
        for k in range(3):
            ids = list(range(100 * k + 1, 100 * k + 1 + 2 * BS + 1))
            llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=1))
        wait_until(lambda: sum(n for kind, n in applied if kind == "stored") == 6, str(applied))
        assert applied[0] == ("cleared", 0)  # the incarnation's clear, seq 0
        assert sub.stream.unfilled == 0 and sub.stream.restarts == 0
        first, last = sub.stream.incarnation, sub.stream.last_seq
        assert last is not None and last >= 3
        # a second subscriber joining makes the publisher send its last batch again:
        # the first one ignores it as a duplicate
        announced = llm.engine.kv_events.announced
        other = EventSubscriber(ep, rep, lambda kind, hs: None)
        other.start()
        wait_until(lambda: other.stream.last_seq == last, "the second subscriber got no batch")
        other.close()
        assert llm.engine.kv_events.announced == announced + 1
        assert sub.stream.restarts == 0 and sub.stream.last_seq == last
        llm.engine.close()
        applied.clear()
        llm = LLM("builtin:tiny", num_pages=64, kv_events_endpoint=ep,
                  kv_events_replay_endpoint=rep)
        # no request: the new incarnation is known as soon as the SUB socket reconnects
        wait_until(lambda: sub.stream.restarts == 1, "the restart was not seen")
        assert sub.stream.incarnation == llm.engine.kv_events.incarnation != first
        assert applied == [("cleared", 0), ("cleared", 0)]  # dropped, then its seq 0
        assert sub.stream.last_seq == 0 and sub.stream.unfilled == 0
        llm.generate([{"prompt_token_ids": list(range(1, 2 * BS + 2))}],
                     SamplingParams(max_tokens=1))
        wait_until(lambda: ("stored", 2) in applied, str(applied))
        assert sub.stream.restarts == 1 and sub.stream.last_seq == 1
    finally:
        sub.close()
        llm.engine.close()
