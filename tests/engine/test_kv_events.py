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


def _prompt(k: int, pages: int) -> list[int]:
    """The ``k``-th of distinct prompts of ``pages`` full pages and one more token."""
    return [k // 250 % 250 + 5, k % 250 + 5] + [(7 * i) % 250 + 5 for i in range(pages * BS - 1)]


def _stored_pages(applied: list[tuple[str, int]]) -> int:
    return sum(n for kind, n in applied if kind == "stored")


def _released(endpoint: str) -> bool:
    """The endpoint's TCP port can be bound again (its old socket is closed)."""
    host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as ZeroMQ binds
        try:
            s.bind((host, int(port)))
        except OSError:
            return False
    return True


def _join(sub: zmq.Socket, llm: LLM) -> None:
    """Wait until ``sub`` receives what ``llm`` publishes. A PUB socket drops what it sends
    before a subscription reaches it, so probe pages (stored, then dropped by a reset) are
    published until one arrives."""
    probes = iter(range(1_000_000))

    def probe() -> bool:
        if sub.poll(0):
            return True
        llm.generate([{"prompt_token_ids": _prompt(next(probes), 1)}],
                     SamplingParams(max_tokens=1))
        llm.reset_prefix_cache()
        return False

    wait_until(probe, "the subscriber to receive the engine's events", poll_s=0.05)


def test_engine_publishes_vllm_schema_with_our_page_hashes():
    ep, rep = f"tcp://127.0.0.1:{_port()}", f"tcp://127.0.0.1:{_port()}"
    llm = LLM("builtin:tiny", num_pages=64, kv_events_endpoint=ep,
              kv_events_replay_endpoint=rep)
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(ep)
    try:
        _join(sub, llm)  # PUB/SUB: a subscriber sees only what is sent after it joined
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
    assert sub.ready.wait(DEADLINE_S)
    sent = 0

    def send() -> None:  # a fresh prompt of two full pages: one batch of 2 stored pages
        nonlocal sent
        llm.generate([{"prompt_token_ids": _prompt(sent, 2)}], SamplingParams(max_tokens=1))
        sent += 1

    def joined(seen) -> bool:
        """``seen()`` holds, or one more prompt is sent: the SUB socket gets only what is
        sent after it (re)connected, which takes a while."""
        if seen():
            return True
        send()
        return False

    try:
        for _ in range(3):
            send()
        wait_until(lambda: joined(lambda: _stored_pages(applied) > 0), "the first events")
        wait_until(lambda: _stored_pages(applied) == 2 * sent, lambda: f"{2 * sent} pages: "
                   f"{applied}")
        # The subscriber joined after seq 0 (the incarnation's clear): it replayed it.
        assert applied[0] == ("cleared", 0)
        assert sub.stream.unfilled == 0 and sub.stream.restarts == 0
        first = sub.stream.incarnation
        llm.engine.close()
        wait_until(lambda: _released(ep) and _released(rep), "the old endpoints released")
        applied.clear()
        sent = 0
        llm = LLM("builtin:tiny", num_pages=64, kv_events_endpoint=ep,
                  kv_events_replay_endpoint=rep)
        # whether the new incarnation's seq 0 reaches the reconnecting SUB socket or is
        # replayed, the subscriber clears first
        send()
        wait_until(lambda: joined(lambda: sub.stream.incarnation != first), "the new events")
        wait_until(lambda: _stored_pages(applied) == 2 * sent, lambda: f"{2 * sent} pages: "
                   f"{applied}")
        assert sub.stream.restarts == 1
        assert applied[0] == ("cleared", 0)  # everything of the old incarnation dropped
        assert sub.stream.last_seq == sent and sub.stream.unfilled == 0
    finally:
        sub.close()
        llm.engine.close()
