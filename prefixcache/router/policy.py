"""Choosing a replica: pages to prefill there plus the work already queued there.

For a request of ``prompt_tokens`` whose leading ``hit_tokens[r]`` are predicted cached
on replica ``r`` (:mod:`.index`), with ``load[r]`` = prompt tokens the router sent there
that are not prefilled yet (after their predicted hits) plus ``decode_weight`` tokens per
running request (Dynamo's cost)::

    cost[r] = (prompt_tokens - hit_tokens[r]) + load[r]

Balance (after SGLang's thresholds): the system is *imbalanced* when
``max(load) - min(load) > balance_abs_tokens`` and ``max(load) > balance_rel *
min(load)``. Then a replica whose load is past both thresholds (relative to the least
loaded) is *overloaded* and takes no new request while another is not. Unlike a switch
to shortest-queue, every other replica still competes on cost, so affinity holds under
imbalance. A replica that answered 429/503 sheds traffic for ``shed_s`` seconds.

Sessions: a request of an agent session (``prefer``: the replica that served the
session's last call, which holds its transcript) goes back there whenever that replica is
available (not overloaded by the thresholds above, healthy, not shedding), whatever the
cost; reason ``"session"``.

Ties (same cost) go to the least loaded, then round-robin, so misses at low concurrency
spread instead of all landing on the first replica. ``mode="round_robin"`` ignores cost
(every available replica in turn): the baseline the benchmarks compare against.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_BALANCE_ABS_TOKENS = 2048
DEFAULT_BALANCE_REL = 1.5
DEFAULT_DECODE_WEIGHT = 16
MODES = ("cache_aware", "round_robin")


@dataclass
class ReplicaLoad:
    """What the router knows of one replica's work (router-side counts, not polled).

    Attributes:
        queued_tokens: tokens sent there whose prefill has not completed (their
            predicted hits excluded).
        running: requests sent there and not finished.
        healthy: passes health checks.
        shed_until: the replica answered 429/503; no new request before this time.
    """

    queued_tokens: int = 0
    running: int = 0
    healthy: bool = True
    shed_until: float = 0.0


@dataclass
class Decision:
    """The chosen replica, why, and the predicted hit there (tokens)."""

    replica: int
    reason: str  # "cache" (a hit decided it), "balance" (no useful hit), "overload",
    #              "session" (the replica that served the session)
    hit_tokens: int
    cost: int


@dataclass
class Policy:
    """Cost-based choice with balance thresholds (see the module docstring).

    Raises:
        ValueError: a threshold out of range (the message names it).
    """

    balance_abs_tokens: int = DEFAULT_BALANCE_ABS_TOKENS
    balance_rel: float = DEFAULT_BALANCE_REL
    decode_weight: int = DEFAULT_DECODE_WEIGHT
    mode: str = "cache_aware"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.balance_abs_tokens < 0:
            raise ValueError(f"balance_abs_tokens must be >= 0, got {self.balance_abs_tokens}")
        if not self.balance_rel >= 1.0:
            raise ValueError(f"balance_rel must be >= 1, got {self.balance_rel}")
        if self.decode_weight < 0:
            raise ValueError(f"decode_weight must be >= 0, got {self.decode_weight}")
        self._turn = 0

    def load(self, r: ReplicaLoad) -> int:
        return r.queued_tokens + self.decode_weight * r.running

    def available(self, loads: Sequence[ReplicaLoad], now: float) -> list[int]:
        """Replicas that may take a new request: healthy, not shedding, and not
        overloaded while another one is not."""
        ok = [i for i, r in enumerate(loads) if r.healthy and r.shed_until <= now]
        if len(ok) < 2:
            return ok
        lo = min(self.load(loads[i]) for i in ok)
        rest = [i for i in ok if not self._overloaded(self.load(loads[i]), lo)]
        return rest or ok

    def _overloaded(self, load: int, lo: int) -> bool:
        return load - lo > self.balance_abs_tokens and load > self.balance_rel * lo

    def choose(self, prompt_tokens: int, hit_tokens: dict[int, int],
               loads: Sequence[ReplicaLoad], now: float,
               prefer: int | None = None) -> Decision | None:
        """The replica for a request, ``None`` when none is available.

        Args:
            prompt_tokens: the request's prompt length.
            hit_tokens: predicted cached tokens per replica (missing: 0).
            loads: every replica's :class:`ReplicaLoad`, by replica number.
            now: the current time, seconds (compared with ``shed_until``).
            prefer: the replica that served the request's session, if any.
        """
        cands = self.available(loads, now)
        if not cands:
            return None
        if prefer in cands and self.mode != "round_robin":
            hit = hit_tokens.get(prefer, 0)
            return Decision(prefer, "session", hit,
                            prompt_tokens - hit + self.load(loads[prefer]))
        n = len(loads)
        self._turn = (self._turn + 1) % n
        turn = self._turn
        if self.mode == "round_robin":
            best = min(cands, key=lambda i: (i - turn) % n)
            return Decision(best, "balance", hit_tokens.get(best, 0), 0)

        def key(i: int) -> tuple[int, int, int]:
            load = self.load(loads[i])
            return (prompt_tokens - hit_tokens.get(i, 0) + load, load, (i - turn) % n)

        best = min(cands, key=key)
        hit = hit_tokens.get(best, 0)
        if len(cands) < sum(r.healthy and r.shed_until <= now for r in loads):
            reason = "overload"
        elif hit > 0 and hit > min(hit_tokens.get(i, 0) for i in cands):
            reason = "cache"
        else:
            reason = "balance"
        return Decision(best, reason, hit, key(best)[0])
