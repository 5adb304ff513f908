"""Hit rate against block size and against capacity, each point one replay.

The capacity sweep is drawn from the log's own working set (the distinct pages the
unlimited replay publishes): geometric steps from one page up to the whole working set,
then unlimited, so the curve rises from no hits to the log's best hit rate.
"""
from __future__ import annotations

from dataclasses import dataclass

from prefixcache.analyze.replay import ReplayCache, ReplayConfig

BLOCK_SIZES = (16, 32, 64, 128, 256)
CAPACITY_POINTS = 10


@dataclass
class SweepPoint:
    block_size: int
    capacity_tokens: int | None  # None: unlimited
    hit_rate: float
    cached_tokens: int
    evictions: int
    failed: int

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def _point(replays: ReplayCache, cfg: ReplayConfig) -> SweepPoint:
    res = replays.get(cfg)
    return SweepPoint(cfg.block_size, cfg.capacity_tokens, res.hit_rate, res.cached_tokens,
                      res.stats["evictions"], res.failed)


def fitting_block_sizes(capacity_tokens: int | None, block_sizes=BLOCK_SIZES
                        ) -> tuple[list[int], list[int]]:
    """``(fit, skipped)``: the block sizes of which ``capacity_tokens`` holds at least one
    page, and those it does not (``None``: unlimited, every size fits)."""
    fit = [bs for bs in block_sizes if capacity_tokens is None or capacity_tokens >= bs]
    return fit, [bs for bs in block_sizes if bs not in fit]


def block_size_sweep(replays: ReplayCache, base: ReplayConfig,
                     block_sizes=BLOCK_SIZES) -> list[SweepPoint]:
    """Hit rate for each block size at ``base``'s capacity (and other settings); block
    sizes larger than the capacity are left out (see :func:`fitting_block_sizes`)."""
    fit, _ = fitting_block_sizes(base.capacity_tokens, block_sizes)
    return [_point(replays, ReplayConfig(**{**base.__dict__, "block_size": bs,
                                             "keep_hashes": False, "track_page_use": False}))
            for bs in fit]


def capacity_points(working_set_pages: int, block_size: int, extra: int | None = None,
                    points: int = CAPACITY_POINTS) -> list[int | None]:
    """Capacities to try, in tokens, ascending, ending with ``None`` (unlimited).

    Args:
        working_set_pages: distinct pages the log touches (the unlimited replay's
            published pages); the sweep runs from one page to all of them in up to
            ``points`` geometric steps, each a whole number of pages.
        block_size: tokens per page.
        extra: a capacity to include (the one asked for), in tokens.

    Raises:
        ValueError: ``block_size`` or ``points`` below 1.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be at least 1, got {block_size}")
    if points < 1:
        raise ValueError(f"points must be at least 1, got {points}")
    hi = max(1, working_set_pages)
    pages = {1, hi}
    for k in range(1, points - 1):
        pages.add(round(hi ** (k / (points - 1))))
    caps: set[int] = {p * block_size for p in pages}
    if extra:
        caps.add(extra)
    return [*sorted(caps), None]


def capacity_sweep(replays: ReplayCache, base: ReplayConfig,
                   capacities: list[int | None]) -> list[SweepPoint]:
    return [_point(replays, ReplayConfig(**{**base.__dict__, "capacity_tokens": c,
                                             "keep_hashes": False, "track_page_use": False}))
            for c in capacities]
