"""Error spent over the looks of a sequential verdict: each look's nominal level, fixed before the data.

A verdict that looks after every block and stops at the first look whose test rejects must not
test each look at the level it wants overall: with 40 looks at 1% each, a step with no effect is
called harmful far more often than 1%. An error-spending schedule (Lan & DeMets, *Discrete
sequential boundaries for clinical trials*, Biometrika 1983) gives the looks shares of the total,
alpha(t) = alpha * t^shape of it spent by information fraction t (shape 1: even, Pocock-like;
3: most of it saved for the last looks, O'Brien-Fleming-like), and finds each look's boundary so
that the chance of a first crossing there is exactly its share, given that the statistic did
not cross before: the statistics of successive looks share their data (a z at information I_j
and one at I_k > I_j correlate sqrt(I_j / I_k)), so the boundaries are computed on the joint
distribution, by the recursive numerical integration of Jennison & Turnbull (*Group Sequential
Methods with Applications to Clinical Trials*, 2000, ch. 19). Two clocks, both fixed before the
data: the share spent by look j of J is read on the look's place in the schedule, j / J (so a
shape means the same over any schedule), or on its information fraction where asked
(``shares_by_information``), and the joint distribution on the looks' information,
I_j / I_J (a verdict's looks are not evenly spaced in data: after blocks 6, 7, 8 ... 48, 60, its
statistic at block 7 correlates 0.93 with block 6's, at block 60 0.89 with block 48's).
Spending by a clock other than information is allowed as long as that clock is fixed in advance
(Lan & DeMets 1989, *Group sequential procedures: calendar versus information time*, Statistics in
Medicine 8); the covariance must be the information's. Over all looks a false call is then made
with probability alpha, whatever the schedule, and a verdict that stops early for another reason
spends less (the boundaries are non-binding: either side of a verdict may stop it). Looks read as
evenly spaced when they are not err on the side their spacing takes: the judge's (every block to
8, then each a quarter more) are close in data early and far apart late, so read evenly its keep
side, spent early, is conservative (3.9% for 4%) and its regression rules, spent late, were not.
And each total is asked for itself: levels found for a larger total and scaled down by a share err
over the share, since at rarer levels the looks' crossings overlap less. Until 2026-12-07 the
judge's regression rules did both, and erred up to 1.3% for a stated 1% (a Monte Carlo of a score
whose information grows as the blocks; docs/judge.md, "The error accounting").

The boundaries are for a normal statistic; a verdict with a t statistic on few degrees of
freedom tests each look at its boundary's nominal level, 1 - Phi(c_j), read against its t
distribution (the usual approximation).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

GRID = 301  # points of the grid a look's density is carried on


def nominal_level(total: float, look: int, looks: int, shape: float = 1.0,
                  information: tuple[float, ...] | None = None, shares_by_information: bool = False) -> float:
    """The one-sided level at which the ``look``-th of ``looks`` looks (from 1) is tested so that
    the looks together err with probability ``total``; 0 for a look not in the schedule.
    ``information``: each look's information (any increasing scale: the blocks measured by then),
    evenly spaced if not given; the shares are spent by the look's place, j / J, or with
    ``shares_by_information`` by its information fraction."""
    if not 1 <= look <= looks or total <= 0:
        return 0.0
    if information is not None and (len(information) != looks or information[0] <= 0
                                    or any(b <= a for a, b in zip(information, information[1:]))):
        raise ValueError(f"information must be {looks} increasing positive figures, one per look: {information}")
    return _levels(round(total, 12), looks, round(shape, 6), tuple(information or range(1, looks + 1)),
                   shares_by_information)[look - 1]


@lru_cache(maxsize=256)
def _levels(total: float, looks: int, shape: float, information: tuple[float, ...],
            shares_by_information: bool = False) -> tuple[float, ...]:
    fractions = np.asarray(information, dtype=float) / information[-1]  # the joint distribution: on the data
    clock = fractions if shares_by_information else np.arange(1, looks + 1) / looks
    spent = total * clock ** shape
    shares = np.diff(np.concatenate([[0.0], spent]))
    levels, density, grid = [], None, None  # density: of the score S = Z * sqrt(t) among paths not yet stopped
    previous = 0.0
    for fraction, share in zip(fractions, shares):
        if density is None:
            c = _z_upper(share)
            top = c * math.sqrt(fraction)
            grid = np.linspace(-8 * math.sqrt(fraction), top, GRID)
            density = _normal_pdf(grid / math.sqrt(fraction)) / math.sqrt(fraction)
        else:
            step = math.sqrt(fraction - previous)
            weights = _trapezoid(grid)

            def crossing(c: float) -> float:
                return float(np.sum(weights * density * _normal_sf((c * math.sqrt(fraction) - grid) / step)))

            c = _solve(crossing, share)
            top = c * math.sqrt(fraction)
            new_grid = np.linspace(min(grid[0], -8 * math.sqrt(fraction)), top, GRID)
            kernel = _normal_pdf((new_grid[:, None] - grid[None, :]) / step) / step
            density, grid = kernel @ (weights * density), new_grid
        levels.append(float(_normal_sf(c)))
        previous = fraction
    return tuple(levels)


def _solve(crossing, share: float) -> float:
    """The boundary c whose crossing probability (decreasing in c) is ``share``."""
    if share <= 0:
        return math.inf
    low, high = -2.0, 12.0
    for _ in range(80):
        middle = (low + high) / 2
        if crossing(middle) > share:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def _z_upper(p: float) -> float:
    return _solve(lambda c: float(_normal_sf(c)), p)


def _trapezoid(grid: np.ndarray) -> np.ndarray:
    weights = np.full(len(grid), grid[1] - grid[0])
    weights[[0, -1]] /= 2
    return weights


def _normal_pdf(x):
    return np.exp(-0.5 * np.square(x)) / math.sqrt(2 * math.pi)


def _normal_sf(x):
    return 0.5 * np.vectorize(math.erfc)(np.asarray(x, dtype=float) / math.sqrt(2))
