"""Which request goes next: sessions run in order, up to C requests in flight.

A request is *ready* when (1) fewer than ``concurrency`` requests are in flight, (2) it
is the next unsent turn of its session and the session's previous turn has finished,
and (3) its ``arrival_s`` (if any, times ``time_scale``) has passed. Among ready
requests the earliest in workload order goes first. The same rules drive the HTTP
client (serving mode) and the in-process engine loop (offline mode).
"""
from __future__ import annotations

from collections import deque

from prefixcache.bench.workloads import BenchRequest


class SessionScheduler:
    def __init__(self, reqs: list[BenchRequest], concurrency: int, *, time_scale: float = 1.0):
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.concurrency = concurrency
        self.time_scale = time_scale
        self.order = {r.id: i for i, r in enumerate(reqs)}
        queues: dict[str, list[BenchRequest]] = {}
        for r in reqs:
            queues.setdefault(r.session, []).append(r)
        self.queues = {s: deque(sorted(q, key=lambda r: (r.turn, self.order[r.id])))
                       for s, q in queues.items()}
        self.busy: set[str] = set()
        self.in_flight: dict[str, BenchRequest] = {}
        self.remaining = len(reqs)

    def _arrival(self, r: BenchRequest) -> float:
        return 0.0 if r.arrival_s is None or self.time_scale <= 0 else r.arrival_s * self.time_scale

    def _heads(self) -> list[BenchRequest]:
        heads = [q[0] for s, q in self.queues.items() if q and s not in self.busy]
        return sorted(heads, key=lambda r: self.order[r.id])

    def next_ready(self, now: float) -> BenchRequest | None:
        """Pop the next request to send at time ``now`` (seconds since the run start)."""
        if len(self.in_flight) >= self.concurrency:
            return None
        for r in self._heads():
            if self._arrival(r) <= now:
                self.queues[r.session].popleft()
                self.busy.add(r.session)
                self.in_flight[r.id] = r
                return r
        return None

    def next_arrival(self) -> float | None:
        """Earliest arrival time among requests waiting only for their arrival time."""
        times = [self._arrival(r) for r in self._heads()]
        return min(times) if times else None

    def finish(self, req: BenchRequest) -> None:
        del self.in_flight[req.id]
        self.busy.discard(req.session)
        self.remaining -= 1

    @property
    def done(self) -> bool:
        return self.remaining == 0
