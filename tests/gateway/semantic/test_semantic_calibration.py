"""Calibration maths: Wilson intervals and the threshold sweep on hand-counted data."""
from __future__ import annotations

import numpy as np
import pytest

from prefixcache.gateway.semantic.calibration import sweep, wilson


def test_wilson_known_values():
    assert wilson(0, 0) == (0.0, 1.0)
    lo, hi = wilson(0, 10)
    assert lo == 0.0 and hi == pytest.approx(0.27753, abs=1e-5)
    lo, hi = wilson(5, 10)
    assert (lo, hi) == (pytest.approx(0.23659, abs=1e-5), pytest.approx(0.76341, abs=1e-5))
    lo, hi = wilson(10, 10)
    assert lo == pytest.approx(0.72247, abs=1e-5) and hi == pytest.approx(1.0)
    with pytest.raises(ValueError, match="k must be"):
        wilson(3, 2)


def test_sweep_counts():
    scores = np.array([0.99, 0.95, 0.90, 0.85, 0.97, 0.80])
    labels = np.array([1, 1, 1, 0, 0, 0])
    accepted = np.array([True, True, True, True, False, True])
    cos, chk = (sweep(scores, labels, acc, [0.9, 0.96], bootstrap=200)
                for acc in (None, accepted))
    assert [(p.tp, p.fp, p.fn, p.tn) for p in cos] == [(3, 1, 0, 2), (1, 1, 2, 2)]
    assert [(p.tp, p.fp, p.fn, p.tn) for p in chk] == [(3, 0, 0, 3), (1, 0, 2, 3)]
    p = cos[0]
    assert (p.precision, p.recall, p.false_hit_rate) == (0.75, 1.0, 1 / 3)
    assert p.f1 == pytest.approx(6 / 7)
    assert p.precision_ci == wilson(3, 4) and p.false_hit_ci == wilson(1, 3)
    assert p.f1_ci[0] <= p.f1 <= p.f1_ci[1]
    assert chk[1].precision == 1.0 and chk[1].recall == pytest.approx(1 / 3)


def test_sweep_bad_input():
    with pytest.raises(ValueError, match="labels"):
        sweep(np.array([0.5]), np.array([2]), None, [0.5])
    with pytest.raises(ValueError, match="same length"):
        sweep(np.array([0.5, 0.6]), np.array([1]), None, [0.5])
    with pytest.raises(ValueError, match="accepted"):
        sweep(np.array([0.5]), np.array([1]), np.array([True, False]), [0.5])
