"""Latency summaries: exact quantiles of per-event run-queue latencies."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import lru_cache

import numpy as np

QUANTILES = {"p50": 0.50, "p99": 0.99, "p999": 0.999}


def quantile(values: np.ndarray, q: float) -> float:
    """Nearest-rank quantile: the smallest value with at least ``q`` of the samples at or below it."""
    if len(values) == 0:
        return float("nan")
    rank = max(int(np.ceil(q * len(values))) - 1, 0)
    return float(np.partition(values, rank)[rank])


@dataclass
class Summary:
    """n events and their quantiles, in microseconds."""

    n: int
    p50_us: float
    p99_us: float
    p999_us: float
    max_us: float

    def to_dict(self) -> dict:
        return asdict(self)

    def metric_us(self, metric: str) -> float:
        return getattr(self, f"{metric}_us")


def summarize(values_ns: np.ndarray) -> Summary:
    values = np.asarray(values_ns, dtype=np.int64)
    if len(values) == 0:
        return Summary(0, float("nan"), float("nan"), float("nan"), float("nan"))
    us = lambda ns: round(ns / 1000.0, 1)  # noqa: E731
    return Summary(len(values), us(quantile(values, 0.5)), us(quantile(values, 0.99)),
                   us(quantile(values, 0.999)), us(float(values.max())))


def quantile_ns(counts: np.ndarray, middles: np.ndarray, q: float) -> int:
    """Nearest-rank quantile of a histogram (counts per bucket), as the bucket's middle; 0 if empty.

    The same rank ``quantile`` takes of the waits themselves, so a window's
    p999 here and the p999 a step was verified at are the same statistic.
    """
    total = int(counts.sum())
    if total <= 0:
        return 0
    rank = max(int(np.ceil(q * total)) - 1, 0)
    bucket = int(np.searchsorted(np.cumsum(counts), rank, side="right"))
    return int(middles[min(bucket, len(middles) - 1)])


def format_us(us: float) -> str:
    """2.4 ms, 83 µs, 1.2 s: the unit people read latencies in; under a microsecond, "< 1 µs" (the
    first bucket of a histogram probe, and most waits of a canary beside hogs: never "0 µs")."""
    if us != us:  # NaN
        return "-"
    if us < 1:
        return "< 1 µs"
    if us >= 1_000_000:
        return f"{us / 1e6:.2f} s"
    if us >= 1000:
        return f"{us / 1000:.{2 if us < 10_000 else 1}f} ms"
    return f"{us:.0f} µs" if us >= 10 else f"{us:.1f} µs"


def t_sf(t: float, df: int) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom (numpy has no t distribution)."""
    if math.isnan(t):
        return float("nan")
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    tail = 0.5 * _incomplete_beta(df / 2, 0.5, df / (df + t * t))
    return tail if t >= 0 else 1 - tail


@lru_cache(maxsize=1024)
def t_ppf(q: float, df: int) -> float:
    """The t with P(T <= t) = q (bisection on t_sf; q in (0, 1)); few (q, df) pairs occur: cached."""
    low, high = -1e3, 1e3
    for _ in range(100):
        middle = (low + high) / 2
        if 1 - t_sf(middle, df) < q:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b) (continued fraction, Lentz's method)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    if x > (a + 1) / (a + b + 2):
        return 1 - _incomplete_beta(b, a, 1 - x)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)) / a
    tiny = 1e-300
    c, d = 1.0, 1 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 300):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1 + numerator * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1) < 1e-14:
            break
    return front * result


def f_sf(f: float, df1: int, df2: int) -> float:
    """P(F > f) for Fisher's F with (df1, df2) degrees of freedom."""
    if f <= 0:
        return 1.0
    if math.isinf(f):
        return 0.0
    return _incomplete_beta(df2 / 2, df1 / 2, df2 / (df2 + df1 * f))
