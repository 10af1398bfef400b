"""The judge: did a step make the workload's tail latency worse? A pure function of two sets of windows.

Why windows, and why a permutation test on window labels
--------------------------------------------------------
A p999 rests on few tail values: with 10,000 iid samples its 99% interval spans
about -28% to +4,900%. Worse, noise on a shared machine comes in bursts: one
noisy second fills the whole tail, so any test that treats samples as
independent (bootstrap of samples, a quantile test on pooled events) calls a
burst an effect and reverts no-op changes several percent of the time.

So the measurement is cut into windows of equal length, and the *window* is the
unit of evidence. The statistic is the ratio of the pooled metric (p999 by
default) after / before. Under "no effect" the windows are exchangeable: any
split of all windows into a before arm and an after arm of the same sizes was
as likely as the observed one. The p-value is the share of such splits whose
ratio is at least the observed one (all splits when there are few, otherwise a
seeded random sample of them). A burst that lands in one window moves the ratio
of half of all splits just as much, so it does not look significant; a real
change moves every after-window, which few splits reproduce.

A regression needs both: significance (p <= 1 - confidence) and an effect larger
than the tolerance (after > before * (1 + tolerance)), so that a tiny but real
slowdown of a few percent does not revert a step. Too few samples or too few
windows to ever reach the confidence is "inconclusive", never a pass.
bench/judge_sim.py measures the false-regression and detection rates.

Cost: pooled quantiles of a split only need each window's top values, so a
split costs a partition of (windows x tail size) numbers: 2,000 splits of 20
windows of 1,000 events take about 50 ms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations

import numpy as np

from tuned_rl.stats import QUANTILES, format_us, quantile

REGRESSION, NO_REGRESSION, INCONCLUSIVE = "regression", "no regression", "inconclusive"


@dataclass(frozen=True)
class JudgeSettings:
    """The [verify] settings the judge uses."""

    metric: str = "p999"
    tolerance: float = 0.10  # an after-metric up to 10% worse is not a regression
    confidence: float = 0.99
    min_samples: int = 2000  # per arm
    permutations: int = 2000
    seed: int = 0


@dataclass(frozen=True)
class Verdict:
    outcome: str  # regression | no regression | inconclusive
    before_us: float  # pooled metric of each arm
    after_us: float
    p_value: float | None
    reason: str

    @property
    def ratio(self) -> float:
        return self.after_us / self.before_us if self.before_us > 0 else math.inf


def judge(before: list[np.ndarray], after: list[np.ndarray], settings: JudgeSettings = JudgeSettings()) -> Verdict:
    """Compare windows of per-event latencies (ns) measured before and after a change."""
    q = QUANTILES[settings.metric]
    n_before, n_after = sum(map(len, before)), sum(map(len, after))
    b_us, a_us = _pooled(before, q) / 1000, _pooled(after, q) / 1000
    figures = f"{settings.metric} {format_us(b_us)} -> {format_us(a_us)}"
    if min(n_before, n_after) < settings.min_samples:
        return Verdict(INCONCLUSIVE, b_us, a_us, None, f"{figures}: too few samples ({n_before} before, "
                       f"{n_after} after; need {settings.min_samples} each)")
    alpha = 1 - settings.confidence
    if 1 / math.comb(len(before) + len(after), len(after)) > alpha:
        return Verdict(INCONCLUSIVE, b_us, a_us, None, f"{figures}: {len(before)}+{len(after)} windows cannot "
                       f"reach {settings.confidence:.0%} confidence; measure more windows")
    if a_us <= b_us * (1 + settings.tolerance):
        return Verdict(NO_REGRESSION, b_us, a_us, None,
                       f"{figures}: within the {settings.tolerance:.0%} tolerance")
    p_value = permutation_p_value(before, after, q, settings.permutations, settings.seed)
    if p_value <= alpha:
        return Verdict(REGRESSION, b_us, a_us, p_value, f"{figures}: worse beyond the {settings.tolerance:.0%} "
                       f"tolerance (p={p_value:.4f})")
    return Verdict(NO_REGRESSION, b_us, a_us, p_value, f"{figures}: not significant across windows "
                   f"(p={p_value:.3f})")


def permutation_p_value(before: list[np.ndarray], after: list[np.ndarray], q: float,
                        permutations: int, seed: int) -> float:
    """One-sided p-value of "after is worse", over splits of the window labels."""
    windows = before + after
    sizes = np.array([len(w) for w in windows])
    tops = _window_tops(windows, q, sizes.sum())
    observed = _split_ratio(tops, sizes, np.arange(len(before), len(windows)), q)
    splits = _splits(len(windows), len(after), permutations, seed)
    ratios = np.array([_split_ratio(tops, sizes, np.array(split), q) for split in splits])
    # The observed split counts as one of the splits, so p is never 0.
    return float((1 + np.sum(ratios >= observed * (1 - 1e-12))) / (1 + len(ratios)))


def _splits(total: int, chosen: int, permutations: int, seed: int):
    """All ways to pick the after arm when they are few, else a seeded random sample."""
    if math.comb(total, chosen) <= permutations:
        return [c for c in combinations(range(total), chosen) if c != tuple(range(total - chosen, total))]
    rng = np.random.default_rng(seed)
    return [np.sort(rng.choice(total, chosen, replace=False)) for _ in range(permutations)]


def _window_tops(windows: list[np.ndarray], q: float, total: int) -> np.ndarray:
    """Each window's largest values, as many as any pooled quantile of a split can reach."""
    keep = min(int(math.ceil((1 - q) * total)) + 2, max(len(w) for w in windows))
    tops = np.full((len(windows), keep), -np.inf)
    for i, window in enumerate(windows):
        k = min(keep, len(window))
        if k:
            tops[i, :k] = np.partition(window, len(window) - k)[len(window) - k:]
    return tops


def _split_ratio(tops: np.ndarray, sizes: np.ndarray, after_index: np.ndarray, q: float) -> float:
    mask = np.zeros(len(sizes), dtype=bool)
    mask[after_index] = True
    after = _tail_quantile(tops[mask], sizes[mask].sum(), q)
    return after / max(_tail_quantile(tops[~mask], sizes[~mask].sum(), q), 1.0)


def _tail_quantile(tops: np.ndarray, n: int, q: float) -> float:
    """The nearest-rank ``q`` quantile of ``n`` pooled values, from the windows' top values."""
    from_top = n - max(int(math.ceil(q * n)) - 1, 0)  # 1 = the largest
    flat = tops.ravel()
    if from_top > len(flat):
        raise ValueError("window tops too short for this quantile")
    return float(np.partition(flat, len(flat) - from_top)[len(flat) - from_top])


def _pooled(windows: list[np.ndarray], q: float) -> float:
    return quantile(np.concatenate(windows), q) if windows else float("nan")
