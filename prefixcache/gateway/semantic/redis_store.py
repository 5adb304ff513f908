"""Persistence of semantic-cache entries in Redis, so the index survives a restart.

One Redis hash per entry, key ``{prefix}:{scope hex}:{blake2b(text) hex}``, fields:
``vec`` (float32 little-endian, ``dim`` values), ``text`` (UTF-8), ``value`` (bytes),
``created`` (seconds, decimal) and ``sum`` (BLAKE2b-128 over the other four, length-framed).
Raw bytes, never pickled (DESIGN: tier and store data is raw bytes). Redis expires each key
at ``created + TTL``. On start ``load`` scans the prefix and rebuilds the entries; any entry whose
fields, length or checksum do not verify is skipped, counted and deleted.

Writes go through a bounded queue drained by one thread (DESIGN: the hot path never waits on
a slow tier): when the queue is full the write is dropped and counted; a Redis error is
counted, never raised to the caller.
"""
from __future__ import annotations

import hashlib
import math
import queue
import struct
import threading
from collections.abc import Iterator

import numpy as np
import redis

from prefixcache.gateway.semantic.index import Entry

FIELDS = (b"vec", b"text", b"value", b"created", b"sum")


def _checksum(vec: bytes, text: bytes, value: bytes, created: bytes) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for part in (vec, text, value, created):
        h.update(struct.pack("<Q", len(part)))
        h.update(part)
    return h.digest()


def encode_entry(entry: Entry) -> dict[bytes, bytes]:
    """``Entry`` -> the Redis hash fields described in the module docstring."""
    vec = np.ascontiguousarray(entry.vector, dtype="<f4").tobytes()
    text = entry.text.encode()
    created = repr(float(entry.created)).encode()
    return {b"vec": vec, b"text": text, b"value": entry.value, b"created": created,
            b"sum": _checksum(vec, text, entry.value, created)}


def decode_entry(fields: dict[bytes, bytes], dim: int) -> Entry | None:
    """Redis hash fields -> ``Entry``, or None when anything fails to verify."""
    try:
        vec, text, value, created, digest = (fields[f] for f in FIELDS)
        if len(vec) != 4 * dim or digest != _checksum(vec, text, value, created):
            return None
        vector = np.frombuffer(vec, dtype="<f4").astype(np.float32)
        stamp = float(created.decode())
        norm = float(np.linalg.norm(vector))
        if not math.isfinite(stamp) or not abs(norm - 1.0) < 1e-3:
            return None
        return Entry(text.decode(), vector, bytes(value), stamp)
    except (KeyError, ValueError, UnicodeDecodeError):
        return None


class RedisEntryStore:
    """Entries of every scope in one Redis under ``prefix``.

    ``url``: ``redis://host:port/db``; ``timeout_s``: socket budget per call; ``queue_size``:
    pending writes before drops. Counters: ``stored``, ``dropped``, ``errors``, ``corrupt``.
    """

    def __init__(self, url: str, dim: int, prefix: str = "prefixcache:semantic",
                 ttl_s: float | None = 3600.0, timeout_s: float = 0.25,
                 queue_size: int = 1024) -> None:
        if queue_size < 1:
            raise ValueError(f"queue_size must be >= 1, got {queue_size}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.client = redis.Redis.from_url(url, socket_timeout=timeout_s,
                                           socket_connect_timeout=timeout_s)
        self.dim, self.prefix, self.ttl_s = dim, prefix, ttl_s
        self.stored = self.dropped = self.errors = self.corrupt = 0
        self._queue: queue.Queue[tuple[bytes, Entry] | None] = queue.Queue(queue_size)
        self._worker = threading.Thread(target=self._drain, name="semantic-redis", daemon=True)
        self._worker.start()

    def key(self, scope: bytes, text: str) -> bytes:
        digest = hashlib.blake2b(text.encode(), digest_size=16).hexdigest()
        return f"{self.prefix}:{scope.hex()}:{digest}".encode()

    def put(self, scope: bytes, entry: Entry) -> None:
        """Queue ``entry`` for writing; drops (and counts) when the queue is full."""
        try:
            self._queue.put_nowait((scope, entry))
        except queue.Full:
            self.dropped += 1

    def flush(self) -> None:
        """Block until every queued write has been attempted."""
        self._queue.join()

    def close(self) -> None:
        """Finish queued writes, stop the writer thread and close the connection pool."""
        self._queue.put(None)
        self._worker.join()
        self.client.close()

    def load(self) -> Iterator[tuple[bytes, Entry]]:
        """Every verified (scope, entry) in Redis; bad entries are deleted and counted.

        A Redis error ends the scan early (counted): the cache starts with what was read.
        """
        pattern = f"{self.prefix}:*".encode()
        try:
            for key in self.client.scan_iter(match=pattern, count=500):
                item = self._read(key)
                if item is not None:
                    yield item
        except redis.RedisError:
            self.errors += 1

    def _read(self, key: bytes) -> tuple[bytes, Entry] | None:
        parts = key.decode(errors="replace")[len(self.prefix) + 1:].split(":")
        entry = None
        scope = b""
        if len(parts) == 2:
            try:
                scope = bytes.fromhex(parts[0])
                fields = self.client.hgetall(key)
                entry = decode_entry(fields, self.dim)  # type: ignore[arg-type]
            except ValueError:
                entry = None
        if entry is None or key != self.key(scope, entry.text):
            self.corrupt += 1
            self.client.delete(key)
            return None
        return scope, entry

    def _drain(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._write(*item)
            finally:
                self._queue.task_done()

    def _write(self, scope: bytes, entry: Entry) -> None:
        key = self.key(scope, entry.text)
        try:
            pipe = self.client.pipeline(transaction=True)
            pipe.delete(key)
            pipe.hset(key, mapping=encode_entry(entry))  # type: ignore[arg-type]
            if self.ttl_s is not None:
                pipe.pexpireat(key, int((entry.created + self.ttl_s) * 1000))
            pipe.execute()
            self.stored += 1
        except redis.RedisError:
            self.errors += 1
