"""A Monte Carlo of sequential looks: how often a score first crosses each look's one-sided level."""

from __future__ import annotations

from statistics import NormalDist

import numpy as np


def first_crossing(levels: list[float], information: tuple[float, ...], paths: int, seed: int) -> float:
    """The share of ``paths`` on which a z-score whose information grows as ``information`` (one figure
    per look, increasing) crosses the level of some look."""
    z = np.array([NormalDist().inv_cdf(1 - level) for level in levels])
    fractions = np.array(information, dtype=float) / information[-1]
    steps = np.random.default_rng(seed).normal(0, 1, (paths, len(fractions))) * np.sqrt(np.diff(fractions, prepend=0))
    return float((np.cumsum(steps, axis=1) / np.sqrt(fractions) >= z).any(axis=1).mean())
