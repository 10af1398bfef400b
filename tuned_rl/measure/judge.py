"""The judge: did a step make the workload's tail latency worse? A pure function of two sets of windows.

Why windows, and why a permutation test on window labels
--------------------------------------------------------
A p999 rests on few tail values: with 10,000 iid samples its 99% interval spans
about -28% to +4,900%. Worse, noise on a shared machine comes in bursts: one
noisy second fills the whole tail, so any test that treats samples as
independent (bootstrap of samples, a quantile test on pooled events) calls a
burst an effect and reverts no-op changes several percent of the time.

So the measurement is cut into windows of equal length, and the *window* is the
unit of evidence. Under "no effect" the windows are exchangeable: any split of
all windows into a before arm and an after arm of the same sizes was as likely
as the observed one. The p-value is the share of such splits whose statistic is
at least the observed one (all splits when there are few, otherwise a seeded
random sample of them). A burst that lands in one window moves the statistic of
half of all splits just as much, so it does not look significant; a real change
moves every after-window, which few splits reproduce.

Each window is reduced to one number: the mean log of its largest 1% of events
(ten times the metric's tail share: for p999, the events above the window's p99).
A window's p999 rests on a single event; the mean log of its top 1% moves with the
same tail (a Hill-type estimate of its scale) and with rare long stalls alike,
from ten times as many events. The windows are ranked and the after arm's rank
sum is the statistic (a Mann-Whitney test whose null distribution comes from the
splits), so one 3x burst window counts as one rank, not as the whole tail.

A step that starves the target (too few events after, where there were enough
before, and under half as many per window) is a regression outright: its tail
cannot be measured because the target hardly ran.

A regression needs both: significance (p <= 1 - confidence) *and* a pooled
metric (p999) worse than the tolerance allows (after > before * (1 + tolerance)),
so that a tiny but real slowdown of a few percent does not revert a step. Too few
samples, or too few windows to ever reach the confidence, is "inconclusive",
never a pass. bench/judge_sim.py measures the false-regression and detection
rates; tests/test_judge.py keeps the A/A rate bounded.

Cost: one partition per window, then 2,000 rank sums: a few milliseconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations

import numpy as np

from tuned_rl.measure.stats import QUANTILES, format_us, quantile

REGRESSION, NO_REGRESSION, INCONCLUSIVE = "regression", "no regression", "inconclusive"


@dataclass(frozen=True)
class JudgeSettings:
    """The [verify] settings the judge uses."""

    metric: str = "p999"
    tolerance: float = 0.20  # an after-metric up to 20% worse is not a regression
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
    # The switchback design: the drift-adjusted effect (log ratio) of the statistic that decided,
    # its bound at the profile's confidence (upper for "no regression", lower for "regression"),
    # the rule that decided, each arm's figure of the metric's tail, and how much measurement it took.
    effect: float | None = None
    upper: float | None = None
    windows: int | None = None
    seconds: float | None = None
    lower: float | None = None
    rule: str | None = None
    statistic: str | None = None  # "the slowest 0.1%" (of each block's waits) or "the slowest 5%"
    tail_before_us: float | None = None  # the deciding statistic per arm: the blocks' (or runs') geometric mean
    tail_after_us: float | None = None
    why_not_reverted: str | None = None  # for a step kept though its pooled metric rose beyond the tolerance
    settling_dropped: int = 0  # waits that began while a change took hold: in no arm
    straddled: int = 0  # waits that began before a change of arm and ended after it: counted where they began
    metric: str = "p999"
    confidence: float | None = None  # of the verdict's claim, over all looks (a keep's: the harm bound's)
    look_level: float | None = None  # the one-sided level of the bound at the look that decided
    harm: float | None = None  # a keep: the ratio of the metric's tail ruled out at ``confidence``
    randomization_p: float | None = None  # the AB/BA pairs' sign-flip test, at the last look
    noisy_blocks: int = 0  # blocks whose metric tail stood out of the fit
    blocks: int | None = None
    noise_prior_df: int = 0  # degrees of freedom the harm bound borrowed from earlier steps
    unit: str = "block"  # the statistic was read over each block, or each run of blocks of one arm
    run_blocks: int = 1  # blocks of one arm in a row

    @property
    def ratio(self) -> float:
        return self.after_us / self.before_us if self.before_us > 0 else math.inf

    def to_dict(self) -> dict:
        """The JSON report's ``verdict``: what decided, with its figures (ratios, not logs)."""
        data = {"outcome": self.outcome, "p_value": _sig(self.p_value), "ratio": _sig(self.ratio),
                "metric": self.metric, "without_us": _sig(self.before_us), "with_us": _sig(self.after_us)}
        if self.effect is None:
            return data
        ratio = lambda log: None if log is None else _sig(math.exp(log))  # noqa: E731
        data.update(rule=self.rule, statistic=self.statistic, statistic_without_us=_sig(self.tail_before_us),
                    statistic_with_us=_sig(self.tail_after_us), effect=ratio(self.effect),
                    effect_upper=ratio(self.upper), effect_lower=ratio(self.lower), confidence=self.confidence,
                    windows=self.windows, seconds=None if self.seconds is None else round(self.seconds, 1),
                    settling_dropped=self.settling_dropped, straddled=self.straddled,
                    why_not_reverted=self.why_not_reverted, look_level=_sig(self.look_level), harm=self.harm,
                    randomization_p=_sig(self.randomization_p), noisy_blocks=self.noisy_blocks, blocks=self.blocks,
                    noise_prior_df=self.noise_prior_df, unit=self.unit, run_blocks=self.run_blocks)
        return data


def judge(before: list[np.ndarray], after: list[np.ndarray], settings: JudgeSettings = JudgeSettings()) -> Verdict:
    """Compare windows of per-event latencies (ns) measured before and after a change."""
    q = QUANTILES[settings.metric]
    n_before, n_after = sum(map(len, before)), sum(map(len, after))
    b_us, a_us = _pooled(before, q) / 1000, _pooled(after, q) / 1000
    figures = f"{settings.metric} {format_us(b_us)} -> {format_us(a_us)}"
    if n_after < settings.min_samples <= n_before and n_after * len(before) < n_before * len(after) / 2:
        # Same time, under half the events: the step kept the target from running at all.
        return Verdict(REGRESSION, b_us, a_us, None, f"{figures}: the target was starved: {n_after} events "
                       f"after against {n_before} before, in as many windows")
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
    """One-sided p-value of "after's windows have worse tails", over splits of the window labels.

    Each window is reduced to one number, the mean log of its largest events
    (``tail_share``); the windows are ranked, and the statistic is the after
    arm's rank sum (a Mann-Whitney test, its null distribution from the splits).
    """
    statistics = np.array([window_tail(w, tail_share(q)) for w in before + after])
    ranks = average_ranks(statistics)
    observed = ranks[len(before):].sum()
    split_sums = np.array([ranks[list(split)].sum() for split in _splits(len(ranks), len(after),
                                                                            permutations, seed)])
    # The observed split counts as one of the splits, so p is never 0.
    return float((1 + np.sum(split_sums >= observed)) / (1 + len(split_sums)))


def average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks from 1, tied values sharing the mean of their ranks (a probe summing waits in the
    kernel hands over bucket values, so two windows can tie; a tie must not favour either arm)."""
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    last = np.cumsum(counts)
    return ((last - counts + 1 + last) / 2)[inverse]


def tail_share(q: float) -> float:
    """The share of largest events a window's tail is read from: ten times the metric's tail."""
    return min(1.0, 10 * (1 - q))


def window_tail(window: np.ndarray, share: float, at_least: int = 1, floor_ns: int = 1) -> float:
    """Mean log of the window's largest ``share`` of events, and at least ``at_least`` of them, each
    read as at least ``floor_ns`` (-inf for an empty window)."""
    if len(window) == 0:
        return -np.inf
    k = min(max(int(math.ceil(share * len(window))), at_least), len(window))
    return float(np.log(np.maximum(np.partition(window, len(window) - k)[len(window) - k:], floor_ns)).mean())


def _splits(total: int, chosen: int, permutations: int, seed: int):
    """All ways to pick the after arm when they are few, else a seeded random sample."""
    if math.comb(total, chosen) <= permutations:
        return [c for c in combinations(range(total), chosen) if c != tuple(range(total - chosen, total))]
    rng = np.random.default_rng(seed)
    return np.argsort(rng.random((permutations, total)), axis=1)[:, :chosen]


def _sig(value: float | None) -> float | None:
    """Four significant figures (0.0003 is not 0.0); None for what is not a number."""
    if value is None or math.isinf(value) or math.isnan(value):
        return None
    return float(f"{value:.4g}")


def _pooled(windows: list[np.ndarray], q: float) -> float:
    return quantile(np.concatenate(windows), q) if windows else float("nan")
