"""Error-spending boundaries: the looks together err at the stated total, on the joint distribution."""

from __future__ import annotations

from statistics import NormalDist

import numpy as np
import pytest

from monte_carlo import first_crossing
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


JUDGES_LOOKS = (6, 7, 8, 10, 12, 16, 20, 24, 31, 38, 48, 60)  # the keep's looks: blocks measured by each


def _crossed(levels: list[float], information: tuple[int, ...]) -> float:
    return first_crossing(levels, information, paths=200_000, seed=1)


@pytest.mark.parametrize("shape, total, by_information", [(3.0, 0.0048, False), (0.3, 0.04, False), (0.3, 0.04, True)])
def test_looks_spaced_unevenly_in_data_err_at_the_total_only_when_the_boundaries_know_it(shape, total, by_information):
    looks = len(JUDGES_LOOKS)
    knowing = [nominal_level(total, j, looks, shape, JUDGES_LOOKS, by_information) for j in range(1, looks + 1)]
    assert _crossed(knowing, JUDGES_LOOKS) == pytest.approx(total, rel=0.06)
    if shape == 3.0:  # read as evenly spaced, the late looks (far apart in data) are tested too loosely
        evenly = [nominal_level(total, j, looks, shape) for j in range(1, looks + 1)]
        assert _crossed(evenly, JUDGES_LOOKS) > 1.15 * total


def test_the_share_of_each_look_follows_its_place_whatever_the_data_and_close_looks_test_looser():
    looks, total = len(JUDGES_LOOKS), 0.04
    knowing = [nominal_level(total, j, looks, 0.3, JUDGES_LOOKS) for j in range(1, looks + 1)]
    evenly = [nominal_level(total, j, looks, 0.3) for j in range(1, looks + 1)]
    assert knowing[0] == pytest.approx(evenly[0])  # the first look spends its share alone
    assert knowing[1] > 1.5 * evenly[1]  # block 7 shares 93% of block 6's data: a crossing there is rarer
    with pytest.raises(ValueError):
        nominal_level(total, 1, looks, 0.3, JUDGES_LOOKS[::-1])
    with pytest.raises(ValueError):
        nominal_level(total, 1, looks, 0.3, JUDGES_LOOKS[:-1])


def test_shares_spent_by_information_give_the_first_looks_what_their_data_is_worth():
    # the keep's clock: by block 6 of 60 a tenth of the data, so 0.1^0.3 of beta; by place, 1/12^0.3
    looks, total = len(JUDGES_LOOKS), 0.04
    by_data = [nominal_level(total, j, looks, 0.3, JUDGES_LOOKS, True) for j in range(1, looks + 1)]
    by_place = [nominal_level(total, j, looks, 0.3, JUDGES_LOOKS) for j in range(1, looks + 1)]
    assert by_data[0] == pytest.approx(total * 0.1 ** 0.3, rel=0.01)
    assert by_data[2] < by_place[2] and by_data[-1] > by_place[-1]  # blocks 7-8 add little data; 48-60 much
