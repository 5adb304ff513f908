"""Single-flight: concurrent identical misses make one upstream call.

The first request of a key leads: it calls the upstream and, however it ends, reports
the outcome with :meth:`SingleFlight.finish`. The others follow: they wait for the
leader's outcome; when the leader failed (``None``), one of them becomes the next
leader and retries. In one process only (replicas sharing Redis may each make a call).
"""
from __future__ import annotations

import asyncio
from typing import Any


class SingleFlight:
    def __init__(self) -> None:
        self._inflight: dict[bytes, asyncio.Future] = {}

    def claim(self, key: bytes) -> asyncio.Future | None:
        """``None``: the caller leads and must call :meth:`finish`; else the leader's
        future (its result: the outcome, ``None`` when the leader failed)."""
        fut = self._inflight.get(key)
        if fut is not None:
            return fut
        self._inflight[key] = asyncio.get_running_loop().create_future()
        return None

    def finish(self, key: bytes, outcome: Any) -> None:
        """The leader's outcome (``None``: failed, a follower retries)."""
        fut = self._inflight.pop(key, None)
        if fut is not None and not fut.done():
            fut.set_result(outcome)

    def __len__(self) -> int:
        return len(self._inflight)
