"""Waiting on state in tests: poll a condition until it holds, under a generous deadline.

A test never sleeps a fixed time and then asserts: on a loaded machine (CI shares two
cores with other jobs) any fixed time can be too short. It waits for the state it needs
with :func:`wait_until`, whose deadline is reached only when that state never comes, and
then fails naming what it waited for. Import it as ``from tests.helpers.wait import
wait_until``.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

DEADLINE_S = 60.0  # long enough that only a state that never comes reaches it
POLL_S = 0.02


def wait_until(condition: Callable[[], T], what: str | Callable[[], str], *,
               deadline_s: float = DEADLINE_S, poll_s: float = POLL_S,
               ignore: tuple[type[BaseException], ...] = ()) -> T:
    """Call ``condition()`` until it returns a truthy value, and return that value.

    Args:
        condition: a cheap probe of the state (it may act too, e.g. send a probe message).
        what: the awaited state, for the failure message ("3 requests running"), or a
            function that describes it when the deadline passes (with what was seen).
        deadline_s: give up after this many seconds.
        poll_s: pause between two calls, seconds.
        ignore: exceptions of ``condition`` that mean "not yet" (a server still starting).

    Raises:
        AssertionError: the state did not come within ``deadline_s``; the message names
            ``what`` and the last value (or exception) seen.
    """
    end = time.monotonic() + deadline_s
    while True:
        try:
            value = condition()
        except ignore as exc:
            last: object = exc
        else:
            if value:
                return value
            last = value
        if time.monotonic() > end:
            said = what() if callable(what) else what
            raise AssertionError(f"waited {deadline_s:g} s for {said}; last seen: {last!r}")
        time.sleep(poll_s)


def holds_for(condition: Callable[[], object], what: str, seconds: float, *,
              poll_s: float = 0.2) -> None:
    """Check that ``condition()`` stays truthy for ``seconds``: an absence ("no 500 is
    counted"), which only a window can show. A loaded machine checks it less often but
    never makes a correct program fail it.

    Raises:
        AssertionError: ``condition()`` was falsy; the message names ``what``.
    """
    end = time.monotonic() + seconds
    while True:
        assert condition(), f"{what} did not hold"
        if time.monotonic() > end:
            return
        time.sleep(poll_s)
