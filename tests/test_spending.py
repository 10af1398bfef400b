"""Error-spending boundaries: the looks together err at the stated total, on the joint distribution."""

from __future__ import annotations

from statistics import NormalDist

import numpy as np
import pytest

from tuned_rl.measure.spending import nominal_level


@pytest.mark.parametrize("looks, shape, total", [(5, 1.0, 0.025), (17, 3.0, 0.006), (12, 0.3, 0.04)])
def test_a_first_crossing_anywhere_happens_at_the_total_rate_under_the_null(looks, shape, total):
    z = np.array([NormalDist().inv_cdf(1 - nominal_level(total, j, looks, shape)) for j in range(1, looks + 1)])
    rng = np.random.default_rng(0)
    paths = 200_000
    scores = np.cumsum(rng.normal(0, np.sqrt(1 / looks), (paths, looks)), axis=1)
    statistics = scores / np.sqrt(np.arange(1, looks + 1) / looks)  # a z at each look, sharing the data
    crossed = (statistics >= z).any(axis=1).mean()
    assert crossed == pytest.approx(total, rel=0.06)  # Monte Carlo: 200,000 paths


def test_the_looks_are_less_strict_than_bonferroni_and_the_schedule_shapes_them():
    looks, total = 20, 0.005
    even = [nominal_level(total, j, looks, 1.0) for j in range(1, looks + 1)]
    late = [nominal_level(total, j, looks, 3.0) for j in range(1, looks + 1)]
    assert min(even[1:]) > total / looks  # the looks share data: each may test looser than total / J
    assert late[0] < even[0] and late[-1] > even[-1]  # shape 3 saves the total for the last looks
    assert nominal_level(total, 0, looks) == 0 and nominal_level(total, looks + 1, looks) == 0
