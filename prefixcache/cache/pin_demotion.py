"""Pins below the pool: demoted pin pages and the pinned page hashes the KV tiers keep.

With KV tiers (write-back), a pinned page evicted from the pool is *demoted* rather than
lapsing its pins (:mod:`.pins`): each pin keeps the position, with no pool page, and
waits for the page's hash to be published again (a tier load, or a hit after a
recompute). The tiers are told, through ``hook(hashes, pinned)``, every page hash that
becomes pinned (its first live pin) or stops being pinned (its last pin gone: unpinned,
expired, lapsed), so they keep pinned entries last, within their own caps. This module
keeps that bookkeeping; it holds no pool page and knows no tier.
"""
from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable

PinKey = tuple[Hashable, bytes]  # (tenant, prefix_hash)
TierHook = Callable[[list[bytes], bool], None]


class PinDemotion:
    """Demotion state of one pin registry.

    Attributes:
        enabled: set by the manager when its KV connector writes back (a host or disk
            tier, ``cache/connector.py``).
        hook: ``hook(hashes, pinned)``, the connector's ``on_pinned`` (``None``: no
            tiers).
        waiting: demoted page hash -> the pins awaiting it.
    """

    def __init__(self) -> None:
        self.enabled = False
        self.hook: TierHook | None = None
        self.waiting: dict[bytes, set[PinKey]] = {}
        self._refs: dict[bytes, int] = {}  # live pins holding each page hash

    def is_pinned(self, page_hash: bytes) -> bool:
        """Whether a live pin holds this page hash (in the pool or demoted)."""
        return page_hash in self._refs

    def count(self, hashes: Iterable[bytes], delta: int) -> None:
        """A pin with these hashes was made (``+1``) or removed (``-1``): tell ``hook``
        the hashes that turn pinned, or no longer pinned."""
        refs, changed = self._refs, []
        for h in hashes:
            n = refs.get(h, 0) + delta
            if n:
                refs[h] = n
            else:
                del refs[h]
            if n == (1 if delta > 0 else 0):
                changed.append(h)
        if changed and self.hook is not None:
            self.hook(changed, delta > 0)

    def await_hash(self, page_hash: bytes, key: PinKey) -> None:
        """The pin ``key`` lost its pool page of this hash (demoted)."""
        self.waiting.setdefault(page_hash, set()).add(key)

    def forget(self, page_hash: bytes, key: PinKey) -> None:
        """The pin ``key`` no longer awaits this hash (it was removed)."""
        keys = self.waiting.get(page_hash)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self.waiting[page_hash]

    def take(self, page_hash: bytes) -> set[PinKey]:
        """The pins awaiting this hash, now published again (they stop waiting)."""
        return self.waiting.pop(page_hash, set())
