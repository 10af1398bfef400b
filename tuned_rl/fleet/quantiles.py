"""A quantile of a cumulative histogram, computed as PromQL's ``histogram_quantile`` does: linear
interpolation inside the bucket the rank falls in, from 0 below the first bound, and the highest
finite bound where the rank falls in the +Inf bucket (promql/quantile.go, bucketQuantile)."""

from __future__ import annotations

import math
from typing import Sequence


def histogram_quantile(q: float, bounds: Sequence[float], cumulative: Sequence[float]) -> float:
    """The ``q`` quantile of buckets with upper ``bounds`` (ascending, the last +Inf) and their
    cumulative counts; NaN for an empty histogram."""
    if not 0 <= q <= 1:
        raise ValueError(f"a quantile is between 0 and 1, not {q}")
    if len(bounds) != len(cumulative) or len(bounds) < 2 or not math.isinf(bounds[-1]):
        raise ValueError("buckets need two bounds or more, the last one +Inf, and a count for each")
    total = cumulative[-1]
    if total <= 0:
        return math.nan
    rank = q * total
    index = next(i for i, count in enumerate(cumulative) if count >= rank)
    if index == len(bounds) - 1:
        return bounds[-2]  # the rank is past every finite bound: the highest one
    below = cumulative[index - 1] if index > 0 else 0.0
    start = bounds[index - 1] if index > 0 else 0.0
    inside = cumulative[index] - below
    if inside <= 0:
        return bounds[index]
    return start + (bounds[index] - start) * (rank - below) / inside
