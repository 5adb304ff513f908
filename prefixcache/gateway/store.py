"""Where layer 1 keeps responses: an in-process LRU, or Redis shared by replicas.

Both map a 16-byte key to bytes with a TTL in seconds; an entry that does not verify
is deleted by its reader (:meth:`delete`). Redis entries live under
``prefixcache:gw:<hex key>`` with ``EX`` set, so Redis expires them itself. A Redis that
is down degrades to misses (counted in ``errors``), never to failed requests.
"""
from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable

log = logging.getLogger(__name__)


class MemoryStore:
    """An LRU of at most ``max_entries`` entries (the least recently used goes first)."""

    def __init__(self, max_entries: int = 10_000, clock: Callable[[], float] = time.monotonic):
        if max_entries < 1:
            raise ValueError("max_entries must be >= 1")
        self.max_entries = max_entries
        self.clock = clock
        self._data: OrderedDict[bytes, tuple[float, bytes]] = OrderedDict()
        self.errors = 0

    async def get(self, key: bytes) -> bytes | None:
        item = self._data.get(key)
        if item is None:
            return None
        if item[0] <= self.clock():
            del self._data[key]
            return None
        self._data.move_to_end(key)
        return item[1]

    async def set(self, key: bytes, value: bytes, ttl_s: float) -> None:
        self._data[key] = (self.clock() + ttl_s, value)
        self._data.move_to_end(key)
        while len(self._data) > self.max_entries:
            self._data.popitem(last=False)

    async def delete(self, key: bytes) -> None:
        self._data.pop(key, None)

    def __len__(self) -> int:
        return len(self._data)

    async def close(self) -> None:
        self._data.clear()


class RedisStore:
    """A Redis server at ``url`` (``redis://host:port/db``), through redis-py's asyncio
    client; each call has ``timeout_s``."""

    PREFIX = b"prefixcache:gw:"

    def __init__(self, url: str, timeout_s: float = 0.5):
        import redis.asyncio as aioredis

        self.url = url
        self._r = aioredis.Redis.from_url(url, socket_timeout=timeout_s,
                                          socket_connect_timeout=timeout_s)
        self.errors = 0

    def _key(self, key: bytes) -> bytes:
        return self.PREFIX + key.hex().encode()

    async def get(self, key: bytes) -> bytes | None:
        try:
            value = await self._r.get(self._key(key))
        except Exception as exc:  # redis down: a miss, never a failed request
            self.errors += 1
            log.warning("redis get failed: %s", type(exc).__name__)
            return None
        return value.encode() if isinstance(value, str) else value

    async def set(self, key: bytes, value: bytes, ttl_s: float) -> None:
        try:
            await self._r.set(self._key(key), value, px=max(1, int(ttl_s * 1000)))
        except Exception as exc:
            self.errors += 1
            log.warning("redis set failed: %s", type(exc).__name__)

    async def delete(self, key: bytes) -> None:
        try:
            await self._r.delete(self._key(key))
        except Exception as exc:
            self.errors += 1
            log.warning("redis delete failed: %s", type(exc).__name__)

    async def close(self) -> None:
        await self._r.aclose()


def open_store(spec: str, max_entries: int = 10_000) -> MemoryStore | RedisStore:
    """``memory`` or ``redis://...`` (``--cache-store``). Raises ValueError."""
    if spec == "memory":
        return MemoryStore(max_entries)
    if spec.startswith(("redis://", "rediss://", "unix://")):
        return RedisStore(spec)
    raise ValueError(f"--cache-store must be 'memory' or a redis:// URL, got {spec!r}")
