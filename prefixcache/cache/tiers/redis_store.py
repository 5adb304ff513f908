"""The shared KV tier (L4) on Redis (or Valkey): one store for every replica.

DESIGN, "Tiers, replicas and the gateway": one key everywhere, publish-after-write, the hot
path never waits on a slow tier, coordination across machines. Bytes in, bytes out (the
engine exports and imports page contents, ``engine/kv_tiers.py``).

- **Key**: ``pckv1:`` + the model fingerprint digest + ``:`` + the page hash (the pool's
  tenant-rooted chain hash), all raw bytes.
- **Value**: one page group of one page, in the tiers' format (:mod:`.format`: header,
  checksum, payload) under one key: a reader sees a whole valid value or a miss, never a
  value without its metadata.
- **Writes** (:meth:`RedisTier.put`) run on the store worker, after local publication: one
  pipeline of ``SET key value NX PX ttl`` per group; a page already there is left alone; a
  page Redis refuses (out of memory, read-only) or that never reaches it is counted by reason.
- **Lookups** (:meth:`RedisTier.lookup_run`): pipelined ``EXISTS`` along the chain in
  chunks, stopping at the first chunk with a miss; :meth:`RedisTier.get` is one pipelined
  ``GET`` and returns the pages that verify up to the first one that does not. Neither
  extends a TTL (only ``SET`` sets one).
- **Corrupt values** (any failed check of :func:`.format.decode` or
  :func:`.format.check_pages`) are a miss: every such value read is deleted and counted,
  so the recomputed pages replace them.
- **Cold stampede**: :meth:`RedisTier.try_lock` (``SET lock:... NX PX``) and
  :meth:`RedisTier.locked` let a replica that finds a cold prefix locked by another wait a
  bounded time for its pages (``engine/kv_tiers.py`` decides how long).
- **Redis down or slow**: every call has a socket time budget (``timeout_s``). A failure
  marks the tier *degraded* for ``retry_s``: during that time it answers misses without
  calling Redis and drops stores (counted), so requests never fail because of it.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import redis

from prefixcache.cache.tiers.base import TierStats
from prefixcache.cache.tiers.format import (
    CorruptEntry,
    PageGroup,
    PageLayout,
    check_pages,
    decode,
    encode,
)

KEY_VERSION = b"pckv1"
LOOKUP_CHUNK = 16          # pages per pipelined EXISTS round trip
DEFAULT_TTL_S = 3600.0
DEFAULT_TIMEOUT_S = 0.1
DEFAULT_RETRY_S = 5.0
KNOWN_PAGES = 1 << 16      # hashes remembered as stored (contains() answers locally)
FAILED: Any = object()     # what _call returns when Redis did not answer
DROP_REASONS = ("refused", "unavailable")  # why put left a page out (see put)


class RedisTier:
    """A :class:`~.base.Tier` on a Redis server.

    Args:
        url: ``redis://HOST:PORT/DB`` (``rediss://`` for TLS; Valkey URLs alike).
        fingerprint: the model fingerprint digest (bytes) every key and value carries.
        ttl_s: lifetime of a stored page, seconds (> 0).
        timeout_s: socket budget of every Redis call, seconds (> 0).
        retry_s: how long a failure keeps the tier degraded, seconds (>= 0).
        clock: monotonic time source (tests).
        client: a ready ``redis.Redis`` (tests); default connects to ``url``.
        layout: the running model's page layout; a value in another one fails its check
            (``None``: not checked).

    Raises:
        ValueError: a bad URL or bound (the message names it).
    """

    name = "redis"

    def __init__(self, url: str, fingerprint: bytes, *, ttl_s: float = DEFAULT_TTL_S,
                 timeout_s: float = DEFAULT_TIMEOUT_S, retry_s: float = DEFAULT_RETRY_S,
                 clock: Callable[[], float] = time.monotonic, client: Any = None,
                 layout: PageLayout | None = None):
        if not url.startswith(("redis://", "rediss://", "unix://", "valkey://")):
            raise ValueError(f"kv_store_url must be redis://HOST:PORT/DB, got {url!r}")
        if not ttl_s > 0:
            raise ValueError(f"kv_store_ttl_s must be > 0, got {ttl_s}")
        if not timeout_s > 0:
            raise ValueError(f"kv_store_timeout_s must be > 0, got {timeout_s}")
        if not retry_s >= 0:
            raise ValueError(f"retry_s must be >= 0, got {retry_s}")
        self.url, self.fingerprint, self.layout = url, fingerprint, layout
        self.ttl_ms = int(ttl_s * 1000)
        self.retry_s, self.clock = retry_s, clock
        self.client = client or redis.Redis.from_url(
            url.replace("valkey://", "redis://", 1), socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s, retry_on_timeout=False)
        self._prefix = KEY_VERSION + b":" + fingerprint + b":"
        self._stats = TierStats()
        self._lock = threading.Lock()
        self._known: OrderedDict[bytes, None] = OrderedDict()
        self.degraded_until = 0.0
        self.errors = 0           # failed or timed-out Redis calls
        self.store_seconds = 0.0  # wall time of store pipelines
        self.load_seconds = 0.0   # wall time of lookups and reads
        self.lock_acquired = 0
        self.lock_contended = 0
        self.dropped = dict.fromkeys(DROP_REASONS, 0)  # pages not stored, by reason

    # -- keys and health ---------------------------------------------------------------
    def key(self, page_hash: bytes) -> bytes:
        return self._prefix + page_hash

    def lock_key(self, page_hash: bytes) -> bytes:
        return b"lock:" + self.key(page_hash)

    @property
    def degraded(self) -> bool:
        """Whether a recent call failed (the tier answers misses until ``retry_s`` ends)."""
        return self.clock() < self.degraded_until

    def _call(self, fn: Callable[[], Any], what: str) -> Any:
        """Run one Redis round trip; on any error return :data:`FAILED` (also at once while
        degraded). An error Redis answered (out of memory, read-only) is counted; one where
        it did not answer (connection, time budget) also marks the tier degraded."""
        if self.degraded:
            return FAILED
        t0 = time.perf_counter()
        try:
            return fn()
        except (redis.RedisError, OSError) as e:
            with self._lock:
                self.errors += 1
                self._stats.failures += 1
            if not isinstance(e, redis.ResponseError):
                self.degraded_until = self.clock() + self.retry_s
            return FAILED
        finally:
            dt = time.perf_counter() - t0
            with self._lock:
                if what == "store":
                    self.store_seconds += dt
                else:
                    self.load_seconds += dt

    def _remember(self, hashes: Sequence[bytes]) -> None:
        with self._lock:
            for h in hashes:
                self._known[h] = None
                self._known.move_to_end(h)
            while len(self._known) > KNOWN_PAGES:
                self._known.popitem(last=False)

    # -- Tier --------------------------------------------------------------------------
    def lookup_run(self, hashes: Sequence[bytes]) -> int:
        """Leading pages of ``hashes`` present in Redis (0 while degraded)."""
        n = 0
        for start in range(0, len(hashes), LOOKUP_CHUNK):
            found = self._call(self._pipelined("exists", hashes[start:start + LOOKUP_CHUNK]),
                               "load")
            if found is FAILED:
                return n
            for ok in found:
                if not ok:
                    return n
                n += 1
        return n

    def get(self, hashes: Sequence[bytes],
            token_ids: Sequence[Sequence[int]] | None = None) -> PageGroup | None:
        """The leading pages of ``hashes`` that are present and verify (see
        :meth:`.base.Tier.get`). Every value read that fails its checks is deleted (one
        pipelined ``DEL``) and counted, not only the first, so the recomputed pages can
        take their keys (``SET NX`` does not overwrite a value)."""
        if not hashes:
            return None
        values = self._call(self._pipelined("get", hashes), "load")
        if values is FAILED:
            return None
        groups: list[PageGroup] = []
        bad: list[bytes] = []
        for i, (h, raw) in enumerate(zip(hashes, values)):
            if raw is None:
                continue
            try:
                g = decode(raw, self.fingerprint)
                want = {h: token_ids[i]} if token_ids is not None else None
                check_pages(g, (h,), self.layout, want)
            except CorruptEntry:
                bad.append(h)
                continue
            if len(groups) == i:  # every page before it loaded: it extends the run
                groups.append(g)
        if bad:
            self._drop(bad)
        with self._lock:
            self._stats.corrupt += len(bad)
            self._stats.misses += len(groups) < len(hashes)
        if not groups:
            return None
        loaded = hashes[:len(groups)]
        self._remember(loaded)  # loaded pages publish again: no need to store them back
        with self._lock:
            self._stats.loads += 1
            self._stats.hits += len(groups)
            self._stats.load_bytes += sum(len(v) for v in values[:len(groups)])
        first = groups[0]
        return PageGroup(first.fingerprint, tuple(loaded),
                         tuple(g.token_ids[0] for g in groups), first.dtype, first.page_shape,
                         b"".join(g.payload for g in groups))

    def _pipelined(self, command: str, hashes: Sequence[bytes]) -> Callable[[], list]:
        """One round trip running ``command`` (``exists``, ``get``) on each page's key."""
        def run() -> list:
            pipe = self.client.pipeline(transaction=False)
            for h in hashes:
                getattr(pipe, command)(self.key(h))
            return pipe.execute()
        return run

    def _drop(self, hashes: Sequence[bytes]) -> None:
        """Delete the keys of ``hashes`` (values that failed their checks) and forget
        that they were stored, so the pages are stored again when recomputed."""
        with self._lock:
            for h in hashes:
                self._known.pop(h, None)
        self._call(self._pipelined("delete", hashes), "load")

    def put(self, group: PageGroup) -> bool:
        """``SET NX PX`` every page of ``group`` (one pipeline); ``True`` when every page
        is now in Redis. A page not stored is counted in :attr:`dropped` by reason:
        ``"refused"`` (Redis answered the ``SET`` with an error: out of memory under
        ``noeviction``, a read-only replica), ``"unavailable"`` (Redis did not answer, or
        the tier is degraded)."""
        values = [encode(group.select([h])) for h in group.hashes]
        ttl_ms = self.ttl_ms

        def store() -> list:
            pipe = self.client.pipeline(transaction=False)
            for h, v in zip(group.hashes, values):
                pipe.set(self.key(h), v, nx=True, px=ttl_ms)
            return pipe.execute(raise_on_error=False)

        done = self._call(store, "store")
        if done is FAILED:
            with self._lock:
                self._stats.rejected += 1
                self.dropped["unavailable"] += group.num_pages
            return False
        refused = [isinstance(r, Exception) for r in done]
        self._remember([h for h, no in zip(group.hashes, refused) if not no])
        with self._lock:
            stored = sum(1 for r in done if r is True)
            self._stats.stores += not all(refused)
            self._stats.pages += stored
            self._stats.skipped += sum(1 for r in done if r is None)
            self._stats.store_bytes += sum(len(v) for v, r in zip(values, done) if r is True)
            if any(refused):
                self._stats.failures += 1
                self.dropped["refused"] += sum(refused)
        return not any(refused)

    def contains(self, page_hash: bytes) -> bool:
        """Whether this process stored (or loaded) the page recently; no network call."""
        with self._lock:
            return page_hash in self._known

    # -- cross-replica coordination ----------------------------------------------------
    def try_lock(self, page_hash: bytes, ttl_ms: int) -> bool | None:
        """Take the compute lock of a cold page (``SET lock:... NX PX``): ``True`` when
        this replica leads, ``False`` when another one holds it, ``None`` when Redis did
        not answer (compute it)."""
        got = self._call(lambda: self.client.set(self.lock_key(page_hash), b"1", nx=True,
                                                 px=max(1, ttl_ms)), "load")
        if got is FAILED:
            return None
        with self._lock:
            if got:
                self.lock_acquired += 1
            else:
                self.lock_contended += 1
        return bool(got)

    def locked(self, page_hash: bytes) -> bool:
        """Whether another replica still holds the page's compute lock (``False`` when
        Redis does not answer)."""
        held = self._call(lambda: self.client.exists(self.lock_key(page_hash)), "load")
        return held is not FAILED and bool(held)

    # -- introspection -----------------------------------------------------------------
    def stats(self) -> TierStats:
        with self._lock:
            return TierStats(**self._stats.as_dict())

    def extra_stats(self) -> dict[str, float]:
        """Remote-only counters: errors, degraded, latencies (seconds), lock outcomes."""
        with self._lock:
            return {"errors": self.errors, "degraded": float(self.degraded),
                    "store_seconds": self.store_seconds, "load_seconds": self.load_seconds,
                    "lock_acquired": self.lock_acquired, "lock_contended": self.lock_contended,
                    **{f"store_dropped_{r}": n for r, n in self.dropped.items()}}

    def close(self) -> None:
        try:
            self.client.close()
        except Exception:  # closing a dead connection
            pass
