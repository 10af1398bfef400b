"""Latency summaries: exact quantiles of per-event run-queue latencies."""

from __future__ import annotations

from dataclasses import asdict, dataclass

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


def format_us(us: float) -> str:
    """2.4 ms, 83 µs, 1.2 s: the unit people read latencies in."""
    if us != us:  # NaN
        return "-"
    if us >= 1_000_000:
        return f"{us / 1e6:.2f} s"
    if us >= 1000:
        return f"{us / 1000:.{2 if us < 10_000 else 1}f} ms"
    return f"{us:.0f} µs" if us >= 10 else f"{us:.1f} µs"
