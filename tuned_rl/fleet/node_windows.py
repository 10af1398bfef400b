"""Each node's waits per sub-window, from its cumulative bucket counters sampled at the sub-windows'
boundaries: the increments between two boundaries, or why a sub-window has none (the node did not
report at a boundary; its counters fell, a watch restart that reset them)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from tuned_rl.fleet.prometheus import Series
from tuned_rl.fleet.quantiles import histogram_quantile


@dataclass
class NodeWindows:
    """One node's histogram increments: ``counts[i]`` (cumulative, by bound) for sub-window i, or None."""

    node: str
    bounds: list[float]
    counts: list[np.ndarray | None]
    resets: list[float] = field(default_factory=list)  # the ends of sub-windows whose counters fell
    missing: list[float] = field(default_factory=list)  # the ends of sub-windows it did not report at

    def waits(self, index: int) -> int:
        counts = self.counts[index]
        return int(counts[-1]) if counts is not None else 0

    def quantile(self, index: int, q: float) -> float:
        """The ``q`` quantile of sub-window ``index``, in seconds (NaN without waits)."""
        counts = self.counts[index]
        return histogram_quantile(q, self.bounds, counts) if counts is not None else math.nan

    def pooled_quantile(self, q: float) -> float:
        """The ``q`` quantile of every sub-window with waits together (what histogram_quantile over
        the node's increase across the window gives, resets left out)."""
        kept = [c for c in self.counts if c is not None]
        return histogram_quantile(q, self.bounds, np.sum(kept, axis=0)) if kept else math.nan


def node_windows(series: list[Series], node_label: str, boundaries: list[float]) -> dict[str, NodeWindows]:
    """The bucket series of ``series`` (each with ``le`` and ``node_label`` labels; others are summed),
    per node, cut at ``boundaries`` (the times Prometheus evaluated the query at)."""
    values: dict[str, dict[float, dict[float, float]]] = {}  # node -> bound -> time -> count
    for one in series:
        node, le = one.labels.get(node_label), one.labels.get("le")
        if node is None or le is None:
            continue
        bound = math.inf if le in ("+Inf", "Inf", "inf") else float(le)
        at = values.setdefault(node, {}).setdefault(bound, {})
        for time, value in one.samples:
            at[round(time, 3)] = at.get(round(time, 3), 0.0) + value
    found = {}
    times = [round(t, 3) for t in boundaries]
    for node, by_bound in values.items():
        bounds = sorted(by_bound)
        if len(bounds) < 2 or not math.isinf(bounds[-1]):
            continue  # not a histogram's buckets
        windows = NodeWindows(node, bounds, [])
        for begin, end in zip(times, times[1:]):
            if any(begin not in by_bound[b] or end not in by_bound[b] for b in bounds):
                windows.counts.append(None)
                windows.missing.append(end)
                continue
            first = np.array([by_bound[b][begin] for b in bounds])
            last = np.array([by_bound[b][end] for b in bounds])
            if (last < first).any():
                windows.counts.append(None)
                windows.resets.append(end)
                continue
            windows.counts.append(np.maximum.accumulate(last - first))
        found[node] = windows
    return found
