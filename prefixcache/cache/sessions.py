"""Agent sessions: a session's transcript pages are kept ahead of plain LRU between calls.

DESIGN.md, "Agent sessions". An agent's call k+1 extends call k's transcript after a tool
pause; under pressure plain LRU evicts exactly those pages during the pause. A session id
(scoped by tenant: another tenant's same id is another session) groups the calls, and
between them the last call's transcript (its prompt and output pages, the full pages
published) is held by a *session pin*: a :class:`~.pins.Pin` marked with the session,
so it reuses the pins' machinery as is:

- **Ahead of LRU, still reclaimable.** Its cached-free pages wait in the pinned eviction
  queue, used only after every unpinned cached-free page is gone; a new request never
  fails for lack of pages because of a session. Evicting one is a *forced eviction*,
  counted in ``session_pages_evicted`` (``KVCacheManager._evict``).
- **TTL.** The pin lives ``ttl_s`` seconds (the tool-pause budget) after the call ends,
  then lapses: the pages age as ordinary cached pages (not dropped).
- **Caps.** Session pins count under ``max_pinned_fraction`` with prefix pins; over the
  cap the tenant's own oldest pins lapse (a flood of one tenant's sessions recycles its
  own), and a transcript that cannot fit (other tenants hold the cap) is not kept
  (``session_keeps_refused``), the call itself unaffected. Tenant quotas choose victims
  as for any page (:mod:`.quotas`).
- **Tiers.** With KV tiers (write-back), an evicted session page is demoted, not lost
  (:mod:`.pin_demotion`), and the next call loads it back.

Lifecycle of one session (the engine calls these):

=========== ====================================================================
``enter``   a call is queued (``running`` + 1)
``renew``   the call's prefill completed: the previous transcript's pin is released;
            the pages the call read are held by its page table, the rest go back to
            LRU (they are no longer the transcript)
``keep``    the call finished: its transcript is pinned for ``ttl_s``
``leave``   the call ended without a transcript (abort, error)
``close``   explicit close: the pin is released and its cached-free pages dropped
=========== ====================================================================

Memory is bounded by the sessions with a live pin or a running call.
"""
from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from prefixcache.cache.manager import KVCacheManager
from prefixcache.cache.page_pool import PageState
from prefixcache.cache.page_table import PageTable
from prefixcache.cache.pins import Pin, PinCapError, published_prefix

MAX_SESSION_ID_CHARS = 256
_KEY_PREFIX = b"\x00session\x00"  # no page hash starts so (they are 16+ random bytes)

SessionKey = tuple[Hashable, str]  # (tenant, session id)


def check_session_id(value: object, param: str = "session_id") -> str | None:
    """``value`` if it is ``None`` or a string of 1 to :data:`MAX_SESSION_ID_CHARS`
    characters; raises ValueError otherwise (the caller names ``param``)."""
    if value is None or (isinstance(value, str) and 0 < len(value) <= MAX_SESSION_ID_CHARS):
        return value
    raise ValueError(f"{param} must be a string of 1 to {MAX_SESSION_ID_CHARS} characters "
                     f"or null, got {str(value)[:64]!r}")


@dataclass
class Session:
    """One live session: its running calls and the pin holding its last transcript."""

    tenant: Hashable
    session_id: str
    running: int = 0
    pin: Pin | None = None
    calls: int = 0


class SessionRegistry:
    """The sessions of one pool.

    Args:
        mgr: the cache manager (its pin registry holds the transcripts).
        ttl_s: how long a transcript is kept after its call (seconds); 0 keeps nothing
            (sessions are then only counted: the plain LRU baseline).

    Raises:
        ValueError: ``ttl_s < 0``.
    """

    def __init__(self, mgr: KVCacheManager, ttl_s: float):
        if not ttl_s >= 0:
            raise ValueError(f"session_ttl_s must be >= 0 seconds, got {ttl_s}")
        self.mgr, self.ttl_s = mgr, float(ttl_s)
        self.sessions: dict[SessionKey, Session] = {}
        self.counters = {"session_calls": 0, "session_hits": 0, "session_hit_tokens": 0,
                         "session_keeps": 0, "session_keeps_refused": 0,
                         "sessions_closed": 0}

    @staticmethod
    def pin_key(session_id: str) -> bytes:
        """The ``prefix_hash`` a session's pin is registered under (with its tenant)."""
        return _KEY_PREFIX + session_id.encode("utf-8", "surrogatepass")

    def _live_pin(self, s: Session) -> Pin | None:
        """The session's pin if it still holds the transcript (not lapsed: expired,
        evicted without a tier, or over the cap)."""
        if s.pin is None:
            return None
        pins = self.mgr.pins
        if s.pin.expires_at <= pins.clock():
            pins.expire()  # collect it now: its pages age as ordinary cached pages
        if pins.pins.get(s.pin.key) is not s.pin:
            s.pin = None
        return s.pin

    def _tidy(self, key: SessionKey, s: Session) -> None:
        if s.running == 0 and self._live_pin(s) is None:
            self.sessions.pop(key, None)

    # -- the lifecycle -------------------------------------------------------------------
    def enter(self, tenant: Hashable, session_id: str) -> None:
        """A call of the session was queued."""
        s = self.sessions.get((tenant, session_id))
        if s is None:
            s = self.sessions[tenant, session_id] = Session(tenant, session_id)
        s.running += 1
        s.calls += 1
        self.counters["session_calls"] += 1

    def renew(self, tenant: Hashable, session_id: str, cached_tokens: int) -> None:
        """The call's prefill completed having read ``cached_tokens`` from the cache:
        a hit on a live transcript counts in ``session_hits`` / ``session_hit_tokens``;
        the previous transcript is released to LRU (the call's table holds what it read)."""
        s = self.sessions.get((tenant, session_id))
        if s is None:
            return
        pin = self._live_pin(s)
        if pin is None:
            return
        if cached_tokens:
            self.counters["session_hits"] += 1
            self.counters["session_hit_tokens"] += cached_tokens
        self.mgr.pins.unpin(tenant, pin.prefix_hash)
        s.pin = None

    def keep(self, tenant: Hashable, session_id: str, pt: PageTable) -> Pin | None:
        """The call finished (its table not yet freed): pin its transcript, the leading
        published full pages of its prompt and output, for ``ttl_s``. Returns the pin,
        ``None`` when nothing is kept (TTL 0, no full page, the cap refused)."""
        key = (tenant, session_id)
        s = self.sessions.get(key)
        if s is None:
            return None
        s.running -= 1
        try:
            if self.ttl_s <= 0:
                return None
            mgr = self.mgr
            pages, hashes = published_prefix(mgr.index, mgr.keys, pt,
                                              pt.num_computed_tokens // mgr.block_size)
            if not pages:
                return None
            old = self._live_pin(s)  # a concurrent call's transcript: the latest wins
            if old is not None:
                mgr.pins.unpin(tenant, old.prefix_hash)
                s.pin = None
            try:
                s.pin = mgr.pins.pin(tenant, self.pin_key(session_id), pages,
                                     len(pages) * mgr.block_size, self.ttl_s, hashes,
                                     session=session_id)
            except PinCapError:
                self.counters["session_keeps_refused"] += 1
                return None
            self.counters["session_keeps"] += 1
            return s.pin
        finally:
            self._tidy(key, s)

    def leave(self, tenant: Hashable, session_id: str) -> None:
        """The call ended without a transcript to keep (abort, error, preempted out)."""
        key = (tenant, session_id)
        s = self.sessions.get(key)
        if s is not None:
            s.running -= 1
            self._tidy(key, s)

    def close(self, tenant: Hashable, session_id: str) -> bool:
        """Close a tenant's session: release its transcript's pin and drop its pages
        that are cached-free and held by no other pin (running requests and other pins
        keep theirs). ``False`` if the tenant has no such session (another tenant's is
        never touched); a running call finishes, but its transcript is not kept."""
        key = (tenant, session_id)
        s = self.sessions.pop(key, None)
        if s is None:
            return False
        pin = self._live_pin(s)
        self.counters["sessions_closed"] += 1
        if pin is None:
            return True
        mgr = self.mgr
        mgr.pins.unpin(tenant, pin.prefix_hash)
        state, pinned = mgr.pool.state, mgr.pool.pinned
        for page in reversed(pin.pages):  # the tail first, as a free does
            if page is not None and state[page] == PageState.CACHED_FREE and not pinned[page]:
                mgr.drop_cached(page, "session")
        return True

    # -- reading ---------------------------------------------------------------------------
    def is_live(self, tenant: Hashable, session_id: str) -> bool:
        """Whether the session has a running call or a kept transcript."""
        s = self.sessions.get((tenant, session_id))
        return s is not None and (s.running > 0 or self._live_pin(s) is not None)

    def info(self, tenant: Hashable, session_id: str) -> dict | None:
        """``running`` calls, ``calls`` so far, ``tokens`` kept and ``expires_at`` (the
        pins' clock; ``None`` without a kept transcript); ``None`` for no such session
        of this tenant."""
        s = self.sessions.get((tenant, session_id))
        if s is None:
            return None
        pin = self._live_pin(s)
        return {"session_id": session_id, "running": s.running, "calls": s.calls,
                "tokens": 0 if pin is None else pin.num_tokens,
                "expires_at": None if pin is None else pin.expires_at}

    def sweep(self) -> None:
        """Forget sessions with no running call and no live transcript."""
        for key, s in list(self.sessions.items()):
            self._tidy(key, s)

    def stats(self) -> dict[str, int]:
        """Counters (monotonic) and gauges: ``sessions_live`` and
        ``session_pages_held`` (pool pages held by session pins)."""
        self.mgr.pins.expire()
        self.sweep()
        pins = self.mgr.pins
        held = {p for s in self.sessions.values() if s.pin is not None
                for p in s.pin.pages if p is not None}
        return self.counters | {"sessions_live": len(self.sessions),
                                "session_pages_held": len(held),
                                "session_pages_evicted": pins.counters["session_pages_evicted"]}
