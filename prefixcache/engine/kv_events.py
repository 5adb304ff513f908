"""KV events on the wire: vLLM's schema, msgpack over a ZeroMQ PUB socket, with replay.

What a replica's pool published and dropped (:mod:`prefixcache.cache.events`) goes out
after every engine step in vLLM's format (``vllm/distributed/kv_events.py``), so routers
built for vLLM (llm-d, Dynamo) consume ours:

- a message is three frames: ``topic``, the sequence number (8 bytes, big-endian) and
  the msgpack payload;
- the payload is a ``KVEventBatch`` map ``{"ts": float, "events": [...],
  "data_parallel_rank": 0}``; each event is a map tagged by ``"type"``:
  ``BlockStored`` (``block_hashes``, ``parent_block_hash``, ``token_ids``,
  ``block_size``, ``lora_id``, ``medium``, ``lora_name``), ``BlockRemoved``
  (``block_hashes``, ``medium``) or ``AllBlocksCleared``;
- block hashes are our 16-byte page hashes (the tenant-rooted chain), as msgpack bin;
- the replay socket (ROUTER) answers a request ``(b"", start_seq as 8 bytes)`` with every
  buffered ``(b"", seq, payload)`` from ``start_seq`` on, then ``(b"", -1 as 8 signed
  bytes, b"")``.

Gaps and restarts are detectable: sequence numbers are assigned when a batch is queued
(a batch dropped because the queue is full leaves a hole), and the topic is
``kv@<incarnation>@<model>`` with a fresh random incarnation per process, whose first
batch is ``AllBlocksCleared``.

A new incarnation is announced to every subscriber, not only to those that happened to be
connected when it started (a PUB socket drops what is sent before a subscriber joins, and
a subscriber reconnects to a restarted replica only after its first batch went out): the
socket is an XPUB (the same wire protocol as PUB, so vLLM's consumers read it unchanged)
that sees each subscription as it arrives, and answers it by sending the last batch sent
again, with its own sequence number. A subscriber that knows this incarnation ignores it
as a duplicate; one that does not learns the new topic, drops what it held of the
replica, and fetches the batches before it from the replay socket.

Sending runs on one daemon thread that owns the sockets; the engine thread only queues
(never blocks).
"""
from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import deque

import msgpack
import zmq

from prefixcache.cache.events import AllPagesCleared, CacheEvent, PageRemoved, PageStored

log = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)
DEFAULT_BUFFER_STEPS = 10_000
DEFAULT_MAX_QUEUE = 10_000


def event_to_wire(event: CacheEvent, medium: str) -> dict:
    """One cache event as vLLM's tagged map."""
    if isinstance(event, PageStored):
        return {"type": "BlockStored", "block_hashes": list(event.page_hashes),
                "parent_block_hash": event.parent_hash, "token_ids": event.token_ids,
                "block_size": event.block_size, "lora_id": None, "medium": medium,
                "lora_name": None}
    if isinstance(event, PageRemoved):
        return {"type": "BlockRemoved", "block_hashes": list(event.page_hashes),
                "medium": medium}
    return {"type": "AllBlocksCleared"}


def encode_batch(events: list[CacheEvent], medium: str, ts: float | None = None) -> bytes:
    """A ``KVEventBatch`` payload (msgpack bytes)."""
    return msgpack.packb({"ts": time.time() if ts is None else ts,
                          "events": [event_to_wire(e, medium) for e in events],
                          "data_parallel_rank": 0}, use_bin_type=True)


def new_incarnation() -> str:
    """16 random hex digits naming this process's event stream."""
    return os.urandom(8).hex()


class KVEventPublisher:
    """Publishes cache event batches on ``endpoint`` (bound), replays on
    ``replay_endpoint`` (bound, optional).

    Args:
        endpoint: ZeroMQ address to bind the PUB socket, e.g. ``tcp://127.0.0.1:5557``.
        replay_endpoint: ZeroMQ address for the ROUTER replay socket, or ``None``.
        model: the served model's name, the topic's last part.
        medium: ``"GPU"`` for a CUDA pool, ``"CPU"`` otherwise.
        buffer_steps: batches kept for replay.
        max_queue: batches queued for the sender thread; beyond it a batch is dropped
            (counted in :attr:`dropped`; consumers see a sequence gap).

    Raises:
        zmq.ZMQError: an endpoint cannot be bound (the message names it).
    """

    def __init__(self, endpoint: str, replay_endpoint: str | None = None, *,
                 model: str = "", medium: str = "CPU",
                 buffer_steps: int = DEFAULT_BUFFER_STEPS, max_queue: int = DEFAULT_MAX_QUEUE):
        self.incarnation = new_incarnation()
        self.topic = f"kv@{self.incarnation}@{model}".encode()
        self.medium = medium
        self.endpoint, self.replay_endpoint = endpoint, replay_endpoint
        self.published = 0
        self.dropped = 0
        self.announced = 0  # batches sent again to a subscriber that joined
        self._last: tuple[int, bytes] | None = None
        self._seq = 0
        self._queue: queue.Queue[tuple[int, bytes] | None] = queue.Queue(max_queue)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._ctx: zmq.Context = zmq.Context.instance()
        self._pub = self._bind(zmq.XPUB, endpoint, verbose=True)
        self._replay = None if replay_endpoint is None else self._bind(zmq.ROUTER,
                                                                      replay_endpoint)
        self._thread = threading.Thread(target=self._run, name="prefixcache-kv-events",
                                        daemon=True)
        self._thread.start()
        self.publish([AllPagesCleared()])  # a new incarnation knows nothing

    def _bind(self, kind: int, endpoint: str, verbose: bool = False) -> zmq.Socket:
        sock = self._ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        if verbose:  # every subscription reaches us, not only the first of a topic
            sock.setsockopt(zmq.XPUB_VERBOSE, 1)
        try:
            sock.bind(endpoint)
        except zmq.ZMQError as exc:
            sock.close()
            raise zmq.ZMQError(exc.errno, f"cannot bind KV events endpoint {endpoint}: "
                                          f"{exc.strerror}") from None
        return sock

    def publish(self, events: list[CacheEvent]) -> None:
        """Queue one batch (nothing if ``events`` is empty). Never blocks."""
        if not events:
            return
        seq, self._seq = self._seq, self._seq + 1
        try:
            self._queue.put_nowait((seq, encode_batch(events, self.medium)))
        except queue.Full:
            self.dropped += 1

    def close(self, timeout: float = 1.0) -> None:
        """Send what is queued (up to ``timeout`` seconds), then close the sockets."""
        if not self._thread.is_alive():
            return
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            pass
        self._thread.join(timeout)

    def _run(self) -> None:
        try:
            while True:
                if self._replay is not None and self._replay.poll(0):
                    self._serve_replay()
                if self._pub.poll(0):
                    self._announce()
                try:
                    item = self._queue.get(timeout=0.02)
                except queue.Empty:
                    continue
                if item is None:
                    break
                seq, payload = item
                self._send(item)
                self._buffer.append(item)
                self.published += 1
        except Exception:  # the engine keeps serving without events
            log.exception("KV event publisher stopped")
        finally:
            self._pub.close()
            if self._replay is not None:
                self._replay.close()

    def _send(self, item: tuple[int, bytes]) -> None:
        seq, payload = item
        self._pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload))
        self._last = item

    def _announce(self) -> None:
        """A subscription arrived (first byte 1; 0 is a leaving subscriber): send the
        last batch again, so the new subscriber learns this incarnation and where its
        sequence stands now, not at this replica's next cache change."""
        joined = any(frame[:1] == b"\x01" for frame in self._drain_subscriptions())
        if joined and self._last is not None:
            self._send(self._last)
            self.announced += 1

    def _drain_subscriptions(self) -> list[bytes]:
        frames = []
        while self._pub.poll(0):
            frames.append(self._pub.recv())
        return frames

    def _serve_replay(self) -> None:
        assert self._replay is not None
        frames = self._replay.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            log.warning("ignoring a malformed KV event replay request")
            return
        client, _, start = frames
        start_seq = int.from_bytes(start, "big")
        for seq, payload in list(self._buffer):
            if seq >= start_seq:
                self._replay.send_multipart((client, b"", seq.to_bytes(8, "big"), payload))
        self._replay.send_multipart((client, b"", END_SEQ, b""))
