"""Threshold calibration for the semantic cache: precision, recall, F1 and false-hit rate.

A pair (a, b) is *served* at threshold t when cosine(a, b) >= t and, with the second check,
the verifier accepts it. With ``label`` 1 for "same answer" pairs:
precision = TP / served, recall = TP / positives, false-hit rate = FP / negatives (the share
of different-meaning queries that would receive a wrong cached answer). 95% intervals:
Wilson score intervals for the three proportions, a percentile bootstrap for F1.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval for ``k`` successes in ``n`` trials -> (low, high) in [0, 1].

    ``n == 0`` gives (0.0, 1.0). Raises ``ValueError`` unless ``0 <= k <= n``.
    """
    if not 0 <= k <= n:
        raise ValueError(f"k must be in [0, n], got k={k} n={n}")
    if n == 0:
        return 0.0, 1.0
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class Point:
    """Metrics at one threshold; ``*_ci`` are 95% (low, high) intervals."""

    threshold: float
    tp: int
    fp: int
    fn: int
    tn: int
    precision: float
    precision_ci: tuple[float, float]
    recall: float
    recall_ci: tuple[float, float]
    f1: float
    f1_ci: tuple[float, float]
    false_hit_rate: float
    false_hit_ci: tuple[float, float]

    def as_dict(self) -> dict:
        return asdict(self)


def _f1(tp: np.ndarray, fp: np.ndarray, fn: np.ndarray) -> np.ndarray:
    denom = 2 * tp + fp + fn
    return np.where(denom > 0, 2 * tp / np.maximum(denom, 1), 0.0)


def sweep(scores: np.ndarray, labels: np.ndarray, accepted: np.ndarray | None,
          thresholds: list[float], bootstrap: int = 1000, seed: int = 0) -> list[Point]:
    """Metrics at each threshold.

    ``scores``: float ``[N]`` cosines; ``labels``: ``[N]`` in {0, 1}; ``accepted``: bool
    ``[N]`` verdicts of the second check (None: threshold only); ``bootstrap``: resamples for
    the F1 interval. Raises ``ValueError`` when the shapes differ or labels are not 0/1.
    """
    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels)
    if scores.shape != labels.shape or scores.ndim != 1:
        raise ValueError("scores and labels must be 1-D arrays of the same length")
    if not np.isin(labels, (0, 1)).all():
        raise ValueError("labels must be 0 or 1")
    ok = np.ones_like(labels, dtype=bool) if accepted is None else np.asarray(accepted, bool)
    if ok.shape != labels.shape:
        raise ValueError("accepted must have the shape of labels")
    pos = labels == 1
    rng = np.random.default_rng(seed)
    resample = rng.integers(0, len(labels), size=(bootstrap, len(labels)))
    out = []
    for t in thresholds:
        served = (scores >= t) & ok
        tp, fp = int((served & pos).sum()), int((served & ~pos).sum())
        fn, tn = int(pos.sum()) - tp, int((~pos).sum()) - fp
        s, p = served[resample], pos[resample]
        f1s = _f1((s & p).sum(1), (s & ~p).sum(1), (~s & p).sum(1))
        f1_lo, f1_hi = np.percentile(f1s, [2.5, 97.5])
        out.append(Point(
            round(float(t), 4), tp, fp, fn, tn,
            tp / (tp + fp) if tp + fp else 1.0, wilson(tp, tp + fp),
            tp / (tp + fn) if tp + fn else 0.0, wilson(tp, tp + fn),
            float(_f1(np.array(tp), np.array(fp), np.array(fn))),
            (float(f1_lo), float(f1_hi)),
            fp / (fp + tn) if fp + tn else 0.0, wilson(fp, fp + tn)))
    return out
