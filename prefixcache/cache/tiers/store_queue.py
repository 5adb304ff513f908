"""Asynchronous stores into the tiers: one worker thread, a bounded queue.

DESIGN: "The hot path never waits on a slow tier. Stores are asynchronous with bounded queues
(drop and count when full)". The engine thread copies page contents out of the pool into a
:class:`~prefixcache.cache.tiers.format.PageGroup` and calls :meth:`StoreQueue.submit`; the
worker puts the group into each tier in order (host RAM, then disk).
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Sequence

from prefixcache.cache.tiers.base import Tier
from prefixcache.cache.tiers.format import PageGroup


class StoreQueue:
    """Bounded store queue with one worker thread.

    Args:
        tiers: tiers each group is put into, in order.
        max_pending: queue bound (>= 1); a submit beyond it is dropped and counted.

    Raises:
        ValueError: ``max_pending < 1``."""

    def __init__(self, tiers: Sequence[Tier], max_pending: int = 64):
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        self.tiers = list(tiers)
        self.dropped = 0        # groups dropped because the queue was full
        self.dropped_pages = 0  # ... and their pages
        self.submitted = 0
        self.errors = 0         # puts that raised (a tier bug)
        self.error_pages = 0    # ... and their pages
        self._q: queue.Queue[PageGroup | None] = queue.Queue(maxsize=max_pending)
        self._worker = threading.Thread(target=self._run, name="kv-tier-store", daemon=True)
        self._worker.start()

    def submit(self, group: PageGroup) -> bool:
        """Queue ``group``; ``False`` (and counted in :attr:`dropped`) when full. Never
        blocks."""
        try:
            self._q.put_nowait(group)
        except queue.Full:
            self.dropped += 1
            self.dropped_pages += group.num_pages
            return False
        self.submitted += 1
        return True

    def _run(self) -> None:
        while True:
            g = self._q.get()
            try:
                if g is None:
                    return
                for t in self.tiers:
                    try:
                        t.put(g)
                    except Exception:  # a tier bug must not kill the worker
                        self.errors += 1
                        self.error_pages += g.num_pages
            finally:
                self._q.task_done()

    def flush(self) -> None:
        """Block until every queued store has completed (tests, shutdown)."""
        self._q.join()

    @property
    def pending(self) -> int:
        return self._q.qsize()

    def close(self) -> None:
        """Finish the queued stores and stop the worker."""
        if self._worker.is_alive():
            self._q.put(None)
            self._worker.join()
