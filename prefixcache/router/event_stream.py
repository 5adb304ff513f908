"""Consuming a replica's KV events (vLLM's schema, see ``engine/kv_events.py``).

:func:`decode_batch` reads a ``KVEventBatch`` payload in either of vLLM's encodings
(tagged maps, as vLLM and prefixcache publish now, or the older ``array_like`` lists).
:class:`EventStream` tracks one replica's stream and tells the caller what to apply:

==========================================  ==============================================
message                                     outcome
==========================================  ==============================================
new incarnation in the topic                ``clear`` (the replica restarted), fetch the
                                            batches before it from the replay socket,
                                            then apply
the sequence went back, on a topic without  the same (a publisher that names no
an incarnation (``seq <= last``)            incarnation, as vLLM's, restarted)
sequence number ``last + 1``                apply
a gap (``seq > last + 1``)                  ask the replay socket for ``last + 1 ..``; if
                                            it cannot fill the gap: ``clear``, then apply
an old sequence number, same incarnation    ignored (a duplicate: prefixcache's publisher
                                            sends its last batch again to a subscriber
                                            that joins, see ``engine/kv_events.py``)
``AllBlocksCleared``                        ``clear``
==========================================  ==============================================

:class:`EventSubscriber` runs that on a daemon thread over ZeroMQ (SUB + DEALER).
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import msgpack
import zmq

log = logging.getLogger(__name__)

END_SEQ = -1


@dataclass
class Batch:
    """One decoded batch: ``stored``/``removed`` hash lists in event order, as
    ``(kind, hashes)`` with kind ``"stored"``, ``"removed"`` or ``"cleared"``."""

    ts: float
    events: list[tuple[str, list[bytes]]] = field(default_factory=list)


def _hashes(raw: list) -> list[bytes]:
    return [h if isinstance(h, bytes) else int(h).to_bytes(8, "big", signed=True)
            for h in raw]


def decode_batch(payload: bytes) -> Batch:
    """A ``KVEventBatch`` payload. Block hashes given as ints (vLLM's 64-bit hashes)
    become 8 big-endian bytes.

    Raises:
        ValueError: the payload is not a KV event batch.
    """
    try:
        obj = msgpack.unpackb(payload, raw=False)
    except Exception as exc:
        raise ValueError(f"payload is not msgpack: {exc}") from None
    if isinstance(obj, dict):
        ts, events = obj.get("ts"), obj.get("events")
    elif isinstance(obj, list) and len(obj) >= 2:
        ts, events = obj[0], obj[1]
    else:
        raise ValueError("payload is not a KVEventBatch")
    if not isinstance(events, list):
        raise ValueError("KVEventBatch.events is not a list")
    out = Batch(float(ts or 0.0))
    for ev in events:
        if isinstance(ev, dict):
            kind, hashes = ev.get("type"), ev.get("block_hashes") or []
        elif isinstance(ev, list) and ev:
            kind, hashes = ev[0], (ev[1] if len(ev) > 1 else [])
        else:
            raise ValueError("a KV event is neither a map nor a list")
        if kind == "BlockStored":
            out.events.append(("stored", _hashes(hashes)))
        elif kind == "BlockRemoved":
            out.events.append(("removed", _hashes(hashes)))
        elif kind == "AllBlocksCleared":
            out.events.append(("cleared", []))
        else:
            raise ValueError(f"unknown KV event type {kind!r}")
    return out


def incarnation_of(topic: bytes) -> str:
    """The incarnation part of a ``kv@<incarnation>@<model>`` topic (else the topic)."""
    text = topic.decode("utf-8", "replace")
    return text.split("@")[1] if names_incarnation(topic) else text


def names_incarnation(topic: bytes) -> bool:
    """Whether ``topic`` is ``kv@<incarnation>@<model>`` (prefixcache's publisher)."""
    parts = topic.decode("utf-8", "replace").split("@")
    return len(parts) >= 3 and parts[0] == "kv"


Apply = Callable[[str, list[bytes]], None]  # (kind, hashes)


class EventStream:
    """Sequence tracking of one replica's stream (no sockets: see the table above).

    Args:
        apply: receives ``(kind, hashes)`` for each event, in order; ``("cleared", [])``
            means: drop everything known of this replica.
        replay: ``start_seq -> [(seq, payload), ...]`` from the replay socket, or ``None``.

    Attributes:
        gaps: gaps seen; unfilled: gaps the replay could not fill; restarts:
        incarnation changes; bad: payloads that did not decode.
    """

    def __init__(self, apply: Apply,
                 replay: Callable[[int], list[tuple[int, bytes]]] | None = None):
        self.apply, self.replay = apply, replay
        self.incarnation: str | None = None
        self.last_seq: int | None = None
        self.gaps = self.unfilled = self.restarts = self.bad = 0

    def on_message(self, topic: bytes, seq: int, payload: bytes) -> None:
        inc = incarnation_of(topic)
        went_back = (not names_incarnation(topic) and self.last_seq is not None
                     and seq <= self.last_seq)
        if inc != self.incarnation or went_back:
            if self.incarnation is not None:
                self.restarts += 1
            self.incarnation, self.last_seq = inc, None
            self.apply("cleared", [])
            if seq > 0:
                self._fill(0, seq)
        elif self.last_seq is not None and seq <= self.last_seq:
            return  # already applied
        elif self.last_seq is not None and seq > self.last_seq + 1:
            self.gaps += 1
            self._fill(self.last_seq + 1, seq)
        self._apply_payload(seq, payload)

    def _fill(self, start: int, upto: int) -> None:
        """Apply ``start .. upto - 1`` from the replay socket, or clear if it cannot."""
        got = {}
        if self.replay is not None:
            try:
                got = {s: p for s, p in self.replay(start) if start <= s < upto}
            except Exception:
                log.warning("KV event replay failed", exc_info=True)
        if len(got) != upto - start:
            self.unfilled += 1
            self.apply("cleared", [])
            return
        for s in range(start, upto):
            self._apply_payload(s, got[s])

    def _apply_payload(self, seq: int, payload: bytes) -> None:
        self.last_seq = seq
        try:
            batch = decode_batch(payload)
        except ValueError:
            self.bad += 1
            self.apply("cleared", [])  # whatever it said is lost
            return
        for kind, hashes in batch.events:
            self.apply(kind, hashes)


class EventSubscriber:
    """Subscribes to one replica's KV events on a daemon thread.

    Args:
        endpoint: the replica's PUB address (``--kv-events-endpoint``).
        replay_endpoint: its replay address, or ``None``.
        apply: as :class:`EventStream`; called on the subscriber's thread.
        replay_timeout_s: how long one replay request may take, seconds.
    """

    def __init__(self, endpoint: str, replay_endpoint: str | None, apply: Apply,
                 replay_timeout_s: float = 1.0):
        self.endpoint, self.replay_endpoint = endpoint, replay_endpoint
        self.replay_timeout_ms = int(replay_timeout_s * 1000)
        self._ctx: zmq.Context = zmq.Context.instance()
        self.stream = EventStream(apply, self._replay if replay_endpoint else None)
        self._stop = threading.Event()
        self.ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"prefixcache-kv-sub-{endpoint}")

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout: float = 2.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _replay(self, start: int) -> list[tuple[int, bytes]]:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVTIMEO, self.replay_timeout_ms)
        try:
            sock.connect(self.replay_endpoint)
            sock.send_multipart((b"", start.to_bytes(8, "big")))
            out: list[tuple[int, bytes]] = []
            while True:
                _, seq_b, payload = sock.recv_multipart()  # raises zmq.Again on timeout
                seq = int.from_bytes(seq_b, "big", signed=True)
                if seq == END_SEQ:
                    return out
                out.append((seq, payload))
        finally:
            sock.close()

    def _run(self) -> None:
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(self.endpoint)
        self.ready.set()
        try:
            while not self._stop.is_set():
                if not sub.poll(50):
                    continue
                frames = sub.recv_multipart()
                if len(frames) != 3 or len(frames[1]) != 8:
                    self.stream.bad += 1
                    continue
                topic, seq_b, payload = frames
                self.stream.on_message(topic, int.from_bytes(seq_b, "big"), payload)
        except Exception:
            log.exception("KV event subscriber for %s stopped", self.endpoint)
        finally:
            sub.close()
