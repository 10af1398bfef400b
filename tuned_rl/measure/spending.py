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
Methods with Applications to Clinical Trials*, 2000, ch. 19), with the information fraction of
look j taken as j / J. Over all looks a false call is made with probability alpha, whatever the
schedule, and a verdict that stops early for another reason spends less (the boundaries are
non-binding: either side of a verdict may stop it).

The boundaries are for a normal statistic; a verdict with a t statistic on few degrees of
freedom tests each look at its boundary's nominal level, 1 - Phi(c_j), read against its t
distribution (the usual approximation).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

GRID = 301  # points of the grid a look's density is carried on


def nominal_level(total: float, look: int, looks: int, shape: float = 1.0) -> float:
    """The one-sided level at which the ``look``-th of ``looks`` looks (from 1) is tested so that
    the looks together err with probability ``total``; 0 for a look not in the schedule."""
    if not 1 <= look <= looks or total <= 0:
        return 0.0
    return _levels(round(total, 12), looks, round(shape, 6))[look - 1]


@lru_cache(maxsize=256)
def _levels(total: float, looks: int, shape: float) -> tuple[float, ...]:
    fractions = np.arange(1, looks + 1) / looks
    spent = total * fractions ** shape
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
