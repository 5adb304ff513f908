"""Start-up progress: one log line per load phase with its measured time.

``with phase("weights") as note: ...`` logs ``start-up: weights in 2.41 s (detail)`` on
the ``prefixcache.startup`` logger when the block ends (``note["detail"]`` set inside the
block adds the parenthesis). :data:`STARTED` is when this module was first imported (the
command line imports it first), so :func:`since_start` gives a total for the last line.
A phase that raises logs nothing: its error is reported instead.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger("prefixcache.startup")

STARTED = time.perf_counter()


def since_start() -> float:
    """Seconds since the process started loading prefixcache."""
    return time.perf_counter() - STARTED


@contextmanager
def phase(name: str) -> Iterator[dict[str, str]]:
    """Time the block and log ``start-up: NAME in S s (detail)`` at its end."""
    t0 = time.perf_counter()
    note: dict[str, str] = {}
    yield note
    detail = note.get("detail")
    log.info("start-up: %s in %.2f s%s", name, time.perf_counter() - t0,
             f" ({detail})" if detail else "")


def imports_done(what: str = "Python, torch") -> None:
    """Log ``start-up: imports (WHAT) in S s``: the time from :data:`STARTED` to now (call
    it once the heavy modules are imported, before the first :func:`phase`)."""
    log.info("start-up: imports (%s) in %.2f s", what, since_start())
