"""TTL pins on published prefixes: pinned pages are evicted last, within a capped share.

A pin keeps a tenant's prefix (its leading full pages, from the chain root) in the pool
for a TTL (seconds). Its pages are marked pinned in the pool, so when they are
cached-free they wait in the pinned eviction queue, which is used only after every
unpinned cached-free page is gone (:mod:`.cached_queues`). Pins never starve admission:

- **Cap.** Distinct pinned pages never exceed ``floor(max_pinned_fraction * pool)``.
  Over the cap, the pinning tenant's own oldest pins lapse until the new pin fits; if it
  cannot fit even then (other tenants hold the rest), the pin is refused
  (:class:`PinCapError`) and nothing lapses. One tenant never unpins another's pages.
- **Still evictable.** Under pressure beyond the unpinned pages, pinned cached-free pages
  are evicted too (least recently used first). Without KV tiers, a pin whose page leaves
  the pool lapses. With them (``demotion.enabled``), an evicted page is *demoted*
  (:mod:`.pin_demotion`): the pin stays, its position holds no pool page, and the tiers
  keep the page pinned within their own caps; when the page is loaded back (or hit after
  a recompute), :meth:`PinRegistry.on_reload` pins it in the pool again with the same
  expiry (or lapses the pin if the pool's cap is full).
- **TTL.** A hit on a pin's last page refreshes it (``expires_at = now + ttl``); pinning
  the same prefix again extends it. Expiry is lazy: expired pins are collected when pins
  are listed or created, and before a pinned page would be evicted; an expired pin's
  pages become ordinary cached pages (they are not dropped).

A pin is keyed by ``(tenant, prefix_hash)``, the hash of its last page; the hash is
rooted in the tenant's namespace (DESIGN.md, "One key everywhere"), and a tenant can
only see and remove its own pins. Memory is bounded by the pins alive (each holds at most
the pool's pages), itself bounded by the cap.
"""
from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass

from prefixcache.cache.page_keys import PageKeys
from prefixcache.cache.page_pool import PagePool
from prefixcache.cache.page_table import PageTable
from prefixcache.cache.pin_demotion import PinDemotion, PinKey
from prefixcache.cache.prefix_index import PrefixIndex

__all__ = ["MAX_PIN_TTL_S", "MIN_PIN_TTL_S", "Pin", "PinCapError", "PinKey", "PinRegistry",
           "check_pin_ttl", "published_prefix"]

# Bounds of a pin's TTL in the public APIs (HTTP ``cache_ttl``, ``LLM.pin_prefix``,
# ``pin_ttl_s``); :class:`PinRegistry` itself takes any positive TTL (tests, clocks).
MIN_PIN_TTL_S = 1.0
MAX_PIN_TTL_S = 7 * 24 * 3600.0  # a week


def check_pin_ttl(value: object) -> float:
    """``value`` as seconds if it is a real number (not a bool) from
    :data:`MIN_PIN_TTL_S` to :data:`MAX_PIN_TTL_S`; raises ValueError otherwise (the
    caller names its parameter)."""
    if (isinstance(value, (int, float)) and not isinstance(value, bool)
            and MIN_PIN_TTL_S <= value <= MAX_PIN_TTL_S):
        return float(value)
    raise ValueError(f"must be a number of seconds from {MIN_PIN_TTL_S:.0f} to "
                     f"{MAX_PIN_TTL_S:.0f}, got {value!r}")


class PinCapError(RuntimeError):
    """A pin does not fit under ``max_pinned_fraction`` (other tenants hold the rest)."""


@dataclass
class Pin:
    """One pinned prefix.

    Attributes:
        tenant: its owner.
        prefix_hash: the page hash of its last page (names the whole prefix).
        pages: its pool pages, in position order (from the chain root); ``None`` where
            the page was demoted to a KV tier.
        hashes: the page hashes, in position order (empty when the pin was made from
            pages alone: such a pin cannot be demoted and lapses on eviction).
        num_tokens: tokens covered (``len(pages) * block_size``).
        ttl_s: the TTL a hit refreshes it to (seconds).
        expires_at: when it lapses, on the registry's clock (seconds).
        seq: creation order (older pins lapse first over the cap).
        session: the agent session whose transcript this pin keeps (:mod:`.sessions`),
            ``None`` for a prefix pin. Session pins are not listed with prefix pins.
    """

    tenant: Hashable
    prefix_hash: bytes
    pages: tuple[int | None, ...]
    num_tokens: int
    ttl_s: float
    expires_at: float
    seq: int
    hashes: tuple[bytes, ...] = ()
    session: str | None = None

    def demoted(self) -> list[bytes]:
        """Hashes of the pages not in the pool (demoted to a KV tier)."""
        return [h for h, p in zip(self.hashes, self.pages) if p is None]

    @property
    def key(self) -> PinKey:
        return (self.tenant, self.prefix_hash)

    def as_dict(self, tier: str = "pool") -> dict:
        """``prefix_hash`` (hex), ``tokens``, ``tier`` (``"pool"``, or the lowest KV tier
        holding a demoted page, given by the engine), ``expires_at`` (the registry's
        clock, Unix seconds by default), ``ttl_s``."""
        return {"prefix_hash": self.prefix_hash.hex(), "tokens": self.num_tokens,
                "tier": tier, "expires_at": self.expires_at, "ttl_s": self.ttl_s}


def published_prefix(index: PrefixIndex, keys: PageKeys, pt: PageTable,
                     num_pages: int) -> tuple[list[int], list[bytes]]:
    """A table's leading published pages among its first ``num_pages`` (up to the first
    that is not: a collision, a dead chain) and their page hashes."""
    pages = []
    for ref in pt.chain_refs[:num_pages]:
        page = None if ref is None else index.page_of_entry(ref)  # type: ignore[arg-type]
        if page is None:
            break
        pages.append(page)
    return pages, keys.hashes(pt, len(pages))[:len(pages)] if pages else []


class PinRegistry:
    """The pins of one pool.

    Args:
        pool: the page pool whose pinned flags this registry sets.
        max_pinned_fraction: cap on distinct pinned pages, as a share of the pool
            (``0 <= f <= 1``; 0 disables pinning).
        clock: time source in seconds (default ``time.time``, Unix seconds).

    Raises:
        ValueError: ``max_pinned_fraction`` outside ``[0, 1]``.
    """

    def __init__(self, pool: PagePool, max_pinned_fraction: float = 0.5,
                 clock: Callable[[], float] = time.time):
        if not 0.0 <= max_pinned_fraction <= 1.0:
            raise ValueError(f"max_pinned_fraction must be in [0, 1], got "
                             f"{max_pinned_fraction}")
        self.pool = pool
        self.clock = clock
        self.max_pinned_fraction = max_pinned_fraction
        self.cap_pages = int(max_pinned_fraction * pool.num_pages)
        self.pins: dict[PinKey, Pin] = {}
        self.pin_count = [0] * pool.num_pages     # pins holding each page
        self._of_page: dict[int, set[PinKey]] = {}
        # One entry per pin, at or before its expiry (a refresh leaves it; a pop re-queues
        # a pin refreshed since), so the heap never outgrows the pins.
        self._expiry: list[tuple[float, int, PinKey]] = []
        self._seq = itertools.count()
        self.num_pinned_pages = 0
        self.demotion = PinDemotion()  # the engine's KV tiers enable it
        self.lapsed: set[int] | None = None  # pool pages whose pin expired (when kept)
        self.counters = {"pins_created": 0, "pins_refused": 0, "pins_expired": 0,
                         "pins_evicted": 0, "pins_lapsed_for_cap": 0, "pins_unpinned": 0,
                         "pin_refreshes": 0, "pin_pages_demoted": 0,
                         "pin_pages_reloaded": 0, "session_pages_evicted": 0,
                         "session_pins_truncated": 0}

    def __len__(self) -> int:
        return len(self.pins)

    # -- creating and removing ---------------------------------------------------------
    def pin(self, tenant: Hashable, prefix_hash: bytes, pages: Iterable[int],
            num_tokens: int, ttl_s: float, hashes: Iterable[bytes] = (),
            session: str | None = None) -> Pin:
        """Pin published pages (a prefix from the chain root) for ``ttl_s`` seconds;
        ``hashes`` (their page hashes, same order) let the pin survive demotion.
        Pinning a pinned prefix again extends its expiry (never shortens it).
        ``session``: the pin keeps that session's transcript (``prefix_hash`` is then the
        session's key, see :mod:`.sessions`).

        Raises:
            ValueError: ``ttl_s <= 0`` or no pages.
            PinCapError: the pin does not fit under the cap (see the module docstring).
        """
        if not ttl_s > 0:
            raise ValueError(f"ttl_s must be > 0 seconds, got {ttl_s}")
        pages, hashes = tuple(pages), tuple(hashes)
        if not pages:
            raise ValueError("pages: nothing to pin (the prefix has no full page)")
        if hashes and len(hashes) != len(pages):
            raise ValueError(f"hashes: {len(hashes)} for {len(pages)} pages")
        now = self.clock()
        self.expire(now)
        old = self.pins.get((tenant, prefix_hash))
        if old is not None:
            old.ttl_s = max(old.ttl_s, ttl_s)
            self._set_expiry(old, max(old.expires_at, now + ttl_s))
            return old
        self._make_room(tenant, pages)
        pin = Pin(tenant, prefix_hash, pages, num_tokens, ttl_s, now + ttl_s, next(self._seq),
                  hashes, session)
        self.pins[pin.key] = pin
        for page in pages:
            self._hold(page, pin.key)
        self.demotion.count(hashes, +1)
        heapq.heappush(self._expiry, (pin.expires_at, pin.seq, pin.key))
        self.counters["pins_created"] += 1
        return pin

    def pin_table(self, index: PrefixIndex, keys: PageKeys, pt: PageTable, num_pages: int,
                  ttl_s: float) -> Pin:
        """Pin a table's first ``num_pages`` finalized pages: see ``KVCacheManager.pin``."""
        pages, hashes = published_prefix(index, keys, pt, num_pages)
        if not pages:
            raise ValueError("pages: the prefix has no published full page to pin")
        n = len(pages)
        return self.pin(pt.tenant, hashes[n - 1], pages, n * keys.block_size, ttl_s, hashes)

    def _hold(self, page: int, key: PinKey) -> None:
        self._of_page.setdefault(page, set()).add(key)
        self.pin_count[page] += 1
        if self.pin_count[page] == 1:
            self.num_pinned_pages += 1
            self.pool.set_pinned(page, True)

    def _let_go(self, page: int, key: PinKey) -> None:
        keys = self._of_page[page]
        keys.discard(key)
        if not keys:
            del self._of_page[page]
        self.pin_count[page] -= 1
        if self.pin_count[page] == 0:
            self.num_pinned_pages -= 1
            self.pool.set_pinned(page, False)

    def _make_room(self, tenant: Hashable, pages: tuple[int, ...]) -> None:
        """Lapse the tenant's oldest pins until ``pages`` fit under the cap; refuse
        (changing nothing) if they cannot fit even with all of them gone."""
        want = set(pages)
        if self.num_pinned_pages + len(want - self._of_page.keys()) <= self.cap_pages:
            return
        own = sorted((p for p in self.pins.values() if p.tenant == tenant),
                     key=lambda p: p.seq)
        others = {page for key, pin in self.pins.items() if key[0] != tenant
                  for page in pin.pages if page is not None}
        if self.cap_pages == 0:
            self.counters["pins_refused"] += 1
            raise PinCapError(f"pinning is disabled: the pin cap is 0 pages "
                              f"(max_pinned_fraction={self.max_pinned_fraction})")
        if len(others) + len(want - others) > self.cap_pages:
            self.counters["pins_refused"] += 1
            raise PinCapError(f"pinning {len(want)} pages would exceed the pin cap of "
                              f"{self.cap_pages} pages (max_pinned_fraction="
                              f"{self.max_pinned_fraction}); unpin something first")
        for p in own:
            self._remove(p)
            self.counters["pins_lapsed_for_cap"] += 1
            if self.num_pinned_pages + len(want - self._of_page.keys()) <= self.cap_pages:
                return

    def unpin(self, tenant: Hashable, prefix_hash: bytes) -> bool:
        """Remove a tenant's pin; ``False`` if it has no such pin (another tenant's pin
        is never touched)."""
        pin = self.pins.get((tenant, prefix_hash))
        if pin is None:
            return False
        self._remove(pin)
        self.counters["pins_unpinned"] += 1
        return True

    def _remove(self, pin: Pin) -> None:
        del self.pins[pin.key]
        for page, h in zip(pin.pages, pin.hashes or (b"",) * len(pin.pages)):
            if page is not None:
                self._let_go(page, pin.key)
            else:
                self.demotion.forget(h, pin.key)
        self.demotion.count(pin.hashes, -1)
        if len(self._expiry) > 2 * len(self.pins) + 16:  # drop the removed pins' entries
            self._expiry = [(p.expires_at, p.seq, p.key) for p in self.pins.values()]
            heapq.heapify(self._expiry)

    # -- time ----------------------------------------------------------------------------
    @staticmethod
    def _set_expiry(pin: Pin, expires_at: float) -> None:
        pin.expires_at = max(pin.expires_at, expires_at)  # never earlier than queued

    def expire(self, now: float | None = None) -> int:
        """Lapse every pin whose ``expires_at <= now``; returns how many."""
        now = self.clock() if now is None else now
        n = 0
        while self._expiry and self._expiry[0][0] <= now:
            _, seq, key = heapq.heappop(self._expiry)
            pin = self.pins.get(key)
            if pin is None or pin.seq != seq:
                continue  # unpinned (and perhaps pinned again: that pin has its entry)
            if pin.expires_at > now:  # refreshed since it was queued
                heapq.heappush(self._expiry, (pin.expires_at, seq, key))
                continue
            if self.lapsed is not None:  # a miss diagnosis tells "expired" from "evicted"
                self.lapsed.update(p for p in pin.pages if p is not None)
            self._remove(pin)
            n += 1
        self.counters["pins_expired"] += n
        return n

    def on_hit(self, pages: Iterable[int]) -> None:
        """A request read these pages as a hit: refresh every live pin ending on one."""
        of_page = self._of_page
        if not of_page:
            return
        now = None
        for page in pages:
            for key in tuple(of_page.get(page, ())):
                pin = self.pins.get(key)
                if pin is None or pin.pages[-1] != page:
                    continue
                now = self.clock() if now is None else now
                if pin.expires_at <= now:
                    self.expire(now)
                else:
                    self._set_expiry(pin, now + pin.ttl_s)
                    self.counters["pin_refreshes"] += 1

    def held_by_session(self, page: int) -> bool:
        """Whether a session's pin (:mod:`.sessions`) holds this pool page."""
        pins = self.pins
        return any(pins[k].session is not None for k in self._of_page.get(page, ()))

    def on_drop(self, page: int, evicted: bool = False) -> None:
        """A pinned page leaves the pool (eviction, reset): its pins lapse, unless it is
        ``evicted`` with demotion enabled: then each pin holding it (with hashes) keeps the
        position as demoted and waits for the hash to come back (:meth:`on_reload`)."""
        for pin in sorted((self.pins[k] for k in self._of_page.get(page, ())),
                          key=lambda p: p.seq):
            i = pin.pages.index(page)
            if (pin.session is not None and not (evicted and self.demotion.enabled)
                    and i > 0 and None not in pin.pages):
                self._truncate(pin, i)  # a transcript keeps the prefix before the page
                continue
            if not (evicted and self.demotion.enabled and pin.hashes):
                self._remove(pin)
                self.counters["pins_evicted"] += 1
                continue
            pin.pages = pin.pages[:i] + (None,) + pin.pages[i + 1:]
            self._let_go(page, pin.key)
            self.demotion.await_hash(pin.hashes[i], pin.key)
            self.counters["pin_pages_demoted"] += 1

    def _truncate(self, pin: Pin, n: int) -> None:
        """A session pin keeps its first ``n`` pages: a transcript losing a page keeps
        the prefix before it (a hit can still read that far)."""
        for page in pin.pages[n:]:
            self._let_go(page, pin.key)  # type: ignore[arg-type]
        self.demotion.count(pin.hashes[n:], -1)
        page_tokens = pin.num_tokens // len(pin.pages)
        pin.pages, pin.hashes, pin.num_tokens = pin.pages[:n], pin.hashes[:n], n * page_tokens
        self.counters["session_pins_truncated"] += 1

    def on_reload(self, pages: Iterable[int], hashes: Iterable[bytes]) -> None:
        """Published pages (loaded from a KV tier, or hit) whose hashes demoted pins wait
        for: pin them in the pool again, same expiry. A page that no longer fits under
        the pool's cap lapses its pins."""
        for page, h in zip(pages, hashes):
            for key in sorted(self.demotion.take(h), key=lambda k: self.pins[k].seq):
                pin = self.pins[key]
                if not self.pin_count[page] and self.num_pinned_pages >= self.cap_pages:
                    self._remove(pin)
                    self.counters["pins_lapsed_for_cap"] += 1
                    continue
                i = pin.hashes.index(h)
                pin.pages = pin.pages[:i] + (page,) + pin.pages[i + 1:]
                self._hold(page, key)
                self.counters["pin_pages_reloaded"] += 1

    def drop(self, pin: Pin) -> None:
        """A demoted page of the pin is gone from every tier too: the pin lapses."""
        if self.pins.get(pin.key) is pin:
            self._remove(pin)
            self.counters["pins_evicted"] += 1

    # -- reading -------------------------------------------------------------------------
    def list(self, tenant: Hashable) -> list[Pin]:
        """A tenant's live prefix pins (expired ones are collected first), oldest first;
        session pins are not listed (:mod:`.sessions` reports them)."""
        self.expire()
        return sorted((p for p in self.pins.values()
                       if p.tenant == tenant and p.session is None),
                      key=lambda p: p.seq)

    def get(self, tenant: Hashable, prefix_hash: bytes) -> Pin | None:
        return self.pins.get((tenant, prefix_hash))

    def stats(self) -> dict[str, int]:
        """Counters (monotonic) and gauges: ``pins``, ``pages_pinned`` (in the pool),
        ``pin_pages_in_tiers`` (demoted), ``pin_cap_pages``."""
        return self.counters | {"pins": len(self.pins), "pages_pinned": self.num_pinned_pages,
                                "pin_pages_in_tiers": len(self.demotion.waiting),
                                "pin_cap_pages": self.cap_pages}
