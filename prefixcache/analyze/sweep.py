"""Hit rate against block size and against capacity, each point one replay."""
from __future__ import annotations

from dataclasses import dataclass

from prefixcache.analyze.replay import ReplayCache, ReplayConfig

BLOCK_SIZES = (16, 32, 64, 128, 256)
CAPACITY_POINTS = 6


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


def block_size_sweep(replays: ReplayCache, base: ReplayConfig,
                     block_sizes=BLOCK_SIZES) -> list[SweepPoint]:
    """Hit rate for each block size at ``base``'s capacity (and other settings)."""
    return [_point(replays, ReplayConfig(**{**base.__dict__, "block_size": bs,
                                             "keep_hashes": False, "track_page_use": False}))
            for bs in block_sizes]


def capacity_points(footprint_tokens: int, largest_request_tokens: int, block_size: int,
                    extra: int | None = None, points: int = CAPACITY_POINTS) -> list[int]:
    """Capacities to try: ``points`` sizes spaced geometrically from the largest
    request (a smaller pool cannot run it) to the unlimited cache's footprint, rounded
    up to whole pages, plus ``extra`` (the capacity asked for)."""
    lo = -(-largest_request_tokens // block_size) * block_size
    hi = max(lo, -(-footprint_tokens // block_size) * block_size)
    pts = {lo, hi}
    for k in range(1, points - 1):
        c = lo * (hi / lo) ** (k / (points - 1))
        pts.add(-(-int(c) // block_size) * block_size)
    if extra:
        pts.add(extra)
    return sorted(pts)


def capacity_sweep(replays: ReplayCache, base: ReplayConfig,
                   capacities: list[int]) -> list[SweepPoint]:
    return [_point(replays, ReplayConfig(**{**base.__dict__, "capacity_tokens": c,
                                             "keep_hashes": False, "track_page_use": False}))
            for c in capacities]
