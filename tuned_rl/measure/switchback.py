"""The sequential switchback verdict: is the tail the profile names worse with the step, judged while without and with alternate?

Why switchback, and why a trend
-------------------------------
A live workload drifts: started beside CPU-bound jobs, a request/response
workload's event rate fell by almost half and its p999 rose over its first half
minute. Measure 15 s without a step and then 15 s with it, and that drift is
indistinguishable from the step's effect, for any test: a harmless step was
reverted in 5 of 10 runs. So the arms alternate in blocks, A (without) and B
(with): 2 windows of A, then blocks of B, A, B, ... each a short settling time
that is measured and dropped (0.25 s) and 2 windows of 0.5 s. The effect is read
from a regression of each block's statistic on "B" *plus a smooth trend in time*
(none at the first look, linear up to seven blocks, quadratic from eight): a
drift moves A and B blocks alike, the step moves only B. Blocks, not windows, are
the unit: this VM's host stalls come and go over seconds (the window statistic's
lag-1 autocorrelation was 0.73), so windows of one block share their noise.

A wait belongs to the arm in which it began
-------------------------------------------
Every probe dates each wait from its start, and the recorder counts it in the
window where it began, however late it is reported (measurement.Recorder): an RT
throttling wait of 377 ms that began without the step is the without-arm's, not
the with-arm's it ended in. Waits that begin while a change is made and takes hold
(the settling time) are left out.

The metric decides
------------------
The profile names a quantile, p999 by default: the slowest 0.1% of waits. The
field reports' problem is rare stalls, one wait in a thousand ten to a hundred
times longer, which move the p999 and leave the p99 where it was. So the verdict
rests on the statistic the metric names: each block's *slowest 0.1%* (the share
1 - q), as the mean log of those waits (their geometric mean, 8 waits in a block
of the default canary). It is scale-equivariant, so the tolerance maps onto it
exactly (a p999 20% worse is log 1.2 on it), and it sees rare stalls both by
their number and by their length: a SCHED_FIFO helper spinning 5 ms every 0.5 s
on the canary's CPU moved it 3.8 standard deviations of a block of this machine's
canary (3 ms every 1 s, 1.7), where the slowest 5% moved 0.3 and 0.1
(bench/data/pinned_quiet.npz, injected as bench/judge_sim.py does).

The slowest 5% of each block is the second statistic. Resting on 50 times as many
waits, it sees a broad regression sooner (a 2x scaling of every wait), and it is the
broad half of "no regression". Alone it hid rare stalls: a step that made a helper
SCHED_FIFO was kept in 5 of 5 runs "with no sign of a 2x regression" while the
p999 went from 242 µs to 4.6 ms.

The rules
---------
After every block the evidence is looked at (``gather``), and the rules below are
asked in order; the first that decides ends the measurement:

1. starved: the step halves the target's events, drift allowed for (p <= early_p):
   a regression outright.
2. too few: fewer than min_samples waits in an arm: another block, and at the last
   one "inconclusive".
3. large improvement: the slowest 0.1%'s upper bound below x0.5 (RT throttling
   lifted: 377 ms to 0.1 ms), with the slowest 5% no worse at the first look, and
   the pooled metric no worse later, whatever the slowest 5% does (lifting RT
   throttling lets the actors run more, and the slowest 5% read x1.5-2.1 worse
   in the lab): decided at any look.
4. first look: nothing else is clear after one block of each arm.
5. tail regression: the slowest 0.1% worse *beyond the tolerance* (the test is of
   effect > log(1 + tolerance), not of effect > 0), p <= early_p before the last
   block, p <= 1 - confidence at it, and the arms' figures of it apart by more than
   the tolerance too.
6. broad regression: the slowest 5% worse (p <= the same), its effect, the slowest
   0.1%'s effect and the pooled metric all beyond the tolerance: the metric's own
   tail must agree with what the broad tail shows.
7. tail bounded: the slowest 0.1%'s upper bound within the tolerance, whatever the
   slowest 5% does (FIFO removal under an RT budget trades shorter rare waits for
   more middling ones: p999 378 to 18 ms, p99 0.04 to 8 ms): the metric decides.
8. futility: Wald's likelihood ratio of "no effect" against 2x on the slowest 5%
   *and* against 3x on the slowest 0.1% both at e^-3 or below, and neither tail
   worse beyond the tolerance at p <= 0.05. The second ratio is what keeps a
   rare-stall step from being called harmless on the broad tail alone. 3x, not 2x:
   against 2x, simulated harmless steps ran to the last block in 5.3% of trials
   instead of 0.3%. But a ratio of 1x against 3x favours "no effect" for any
   estimate under their midpoint, x1.73, once the standard error is small: rare
   stalls on a host whose own stalls reach 2 ms (the slowest 0.1% x1.6-1.7, worse
   beyond the tolerance at p of about 0.003-0.05) were kept as futile. A step with that sign
   measures on, to a regression or, at the last block, "inconclusive"; harmless
   steps hardly ever show it (bench/judge_sim.py: no more of them inconclusive).
9. undecided: another block; at the last (24th) "inconclusive", saying "the
   target's latency drifted" when the fitted trend is larger than what the
   effect's bound leaves.

Every rule that calls a regression, and the futility stop, waits for four residual
degrees of freedom (a standard error from fewer is not worth trusting: with two, one
synthetic A/A step of 300 at 4,000 events a second read p < 0.0001). A regression
before the last block needs p <= 0.001 (there may be 23 looks before it), at it
p <= 0.01 (the profile's confidence); most harmless steps end by futility long
before, so the looser last look costs little: A/A false regressions stay at or
under 0.8% in bench/judge_sim.py, on synthetic bursts and drift and on replayed
recordings alike.

Shown = judged
--------------
The Look names the rule and the statistic that decided, its drift-adjusted ratio and
its bound, each arm's figure of the slowest 0.1% (the geometric mean over the arm's
blocks, before drift is allowed for), and ``why_not_reverted`` gives the line for a
step kept though its pooled p999 rose beyond the tolerance: a pooled p999 rests on a
handful of waits, which the host's own stalls move, while the verdict rests on every
block's slowest 0.1% with drift allowed for.

bench/judge_sim.py simulates this design under bursts, drift and rare stalls, and
replays windows the BPF probe recorded here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from tuned_rl.measure.judge import INCONCLUSIVE, NO_REGRESSION, REGRESSION, window_tail
from tuned_rl.measure.stats import QUANTILES, quantile, t_ppf, t_sf

BROAD_SHARE = 0.05  # the broad tail: each block's slowest 5%
# The metric's tail rests on at least this many waits of a block: a block of a slow target's 1,000
# waits has one slowest 0.1%, its maximum, too much at the mercy of one stall of the host's
# (simulated at 1,000 events a second: 6.4% of harmless steps inconclusive with one, 1.8% with four).
TAIL_AT_LEAST = 4


@dataclass(frozen=True)
class SwitchbackSettings:
    """The [verify] settings the sequential verdict uses."""

    metric: str = "p999"
    tolerance: float = 0.20  # a tail up to 20% worse is not a regression
    confidence: float = 0.99  # of the bounds reported, and of the regression test at the last block
    max_blocks: int = 24  # switching blocks after the baseline
    min_samples: int = 2000  # events per arm, below which nothing is decided
    futility_llr: float = -3.0
    futility_df: int = 4  # residual freedom before a standard error is trusted: by the futility stop, and a regression
    alternative: float = math.log(2)  # the broad regression the futility test weighs "no effect" against
    tail_alternative: float = math.log(3)  # and the regression of the metric's own tail
    sign_p: float = 0.05  # "worse beyond the tolerance" at this p is a sign of a regression: no futility stop
    large_improvement: float = math.log(2)

    @property
    def final_p(self) -> float:
        """The p a regression needs at the last block: the profile's confidence (0.01 at 0.99)."""
        return 1 - self.confidence

    @property
    def early_p(self) -> float:
        """Before the last block, ten times less: there may be 23 looks before it, not one."""
        return self.final_p / 10


@dataclass(frozen=True)
class Window:
    """One kept window: its events (ns), whether the step was in place, and its midpoint (s)."""

    values: np.ndarray
    with_step: bool
    time: float
    block: int = 0  # which block it was measured in (the baseline is 0, or a previous step's)


@dataclass(frozen=True)
class Fit:
    """The drift-adjusted effect of the step on one block statistic (a log ratio with / without)."""

    effect: float
    se: float
    df: int
    drift: float  # how far the fitted trend moved over the measurement (log)

    @property
    def t(self) -> float:
        return self.effect / self.se if self.se > 0 else math.copysign(math.inf, self.effect)

    @property
    def p_value(self) -> float:
        """One-sided: of "the step makes it worse"."""
        return t_sf(self.t, self.df)

    def p_beyond(self, tolerance: float) -> float:
        """One-sided: of "the step makes it worse by more than ``tolerance``" (a log ratio)."""
        return t_sf((self.effect - tolerance) / self.se, self.df) if self.se > 0 else float(self.effect <= tolerance)

    def bound(self, confidence: float, upper: bool = True) -> float:
        spread = t_ppf(confidence, self.df) * self.se
        return self.effect + spread if upper else self.effect - spread

    def llr(self, alternative: float) -> float:
        """Wald's log likelihood ratio of "no effect" against ``alternative`` (negative: for "no effect")."""
        return alternative * (self.effect - alternative / 2) / self.se ** 2


@dataclass(frozen=True)
class Evidence:
    """What one look knows: both statistics' fits, the pooled figures, and where in the design it is."""

    settings: SwitchbackSettings
    blocks: int
    trend: str  # none | linear | quadratic
    tail: Fit | None  # the metric's own tail: each block's slowest 0.1% for p999
    broad: Fit | None  # each block's slowest 5%
    starved: Fit | None  # each block's event count
    pooled: float  # the metric, pooled, with / without
    tail_us: tuple[float, float]  # per arm (without, with), the blocks' statistic: a geometric mean (µs)
    n_with: int
    n_without: int

    @property
    def tail_ratio(self) -> float:
        """The metric's tail with / without, before drift is allowed for."""
        without, with_step = self.tail_us
        return with_step / without if without > 0 else math.inf

    @property
    def final(self) -> bool:
        return self.blocks >= self.settings.max_blocks

    @property
    def tolerance(self) -> float:
        return math.log(1 + self.settings.tolerance)

    @property
    def alpha(self) -> float:
        return self.settings.final_p if self.final else self.settings.early_p

    @property
    def tail_name(self) -> str:
        return f"the slowest {_share_text(tail_share_of(self.settings.metric))}"


@dataclass(frozen=True)
class Look:
    """What the evidence says after one block; ``outcome`` None means: measure another block.

    ``statistic`` names what decided, ``effect`` its drift-adjusted ratio (log) and ``bound`` its
    bound at the settings' confidence, above for "no regression", below for "regression". ``tail``
    and ``broad`` are both statistics' fits, for the report; ``rule`` names the rule that decided.
    """

    outcome: str | None
    rule: str
    reason: str
    statistic: str = ""
    effect: float = 0.0
    bound: float = math.inf
    p_value: float | None = None
    trend: str = "none"
    drift: float = 0.0
    tail: Fit | None = None
    broad: Fit | None = None
    pooled: float = math.nan
    tail_us: tuple[float, float] = (math.nan, math.nan)

    @property
    def ratio(self) -> float:
        return math.exp(self.effect)


def tail_share_of(metric: str) -> float:
    """The share of each block's slowest events the metric names: the top 0.1% for p999 (and at
    least TAIL_AT_LEAST of them)."""
    return 1 - QUANTILES[metric]


def look(windows: list[Window], blocks: int, settings: SwitchbackSettings = SwitchbackSettings()) -> Look:
    """The decision after ``blocks`` switching blocks (the last allowed is ``settings.max_blocks``)."""
    evidence = gather(windows, blocks, settings)
    for rule in RULES:
        decided = rule(evidence)
        if decided is not None:
            return decided
    raise AssertionError("the last rule always decides")  # pragma: no cover


def gather(windows: list[Window], blocks: int, settings: SwitchbackSettings) -> Evidence:
    """Fit both statistics (and the event count) on arm plus trend, and pool the arms."""
    degree = 0 if blocks <= 1 else 1 if blocks <= 7 else 2
    units = windows if blocks <= 1 else _blocks(windows)  # the first look has one block of each arm
    counts = np.array([len(u.values) for u in units], dtype=float)
    arms = np.array([u.with_step for u in units], dtype=float)
    times = np.array([u.time for u in units])
    degree_here = _degree(degree, len(units))
    share = tail_share_of(settings.metric)
    empty = (counts == 0).any()
    fit = lambda y: None if empty else _fit(y, arms, times, degree_here)  # noqa: E731
    with_step = [w.values for w in windows if w.with_step]
    without = [w.values for w in windows if not w.with_step]
    tail = np.array([window_tail(u.values, share, TAIL_AT_LEAST) for u in units])
    return Evidence(
        settings, blocks, ("none", "linear", "quadratic")[degree],
        tail=fit(tail),
        broad=fit(np.array([window_tail(u.values, max(BROAD_SHARE, share)) for u in units])),
        starved=_fit(np.log(counts + 1), arms, times, degree_here) if blocks > 1 else None,
        pooled=_ratio(with_step, without, lambda v: quantile(v, QUANTILES[settings.metric])),
        tail_us=tuple(_geometric_mean_us(tail[arms == arm]) for arm in (0, 1)),
        n_with=int(counts[arms == 1].sum()), n_without=int(counts[arms == 0].sum()))


# -- the rules, in the order they are asked ------------------------------------


def starved(e: Evidence) -> Look | None:
    """A step that halves the target's events, drift allowed for, starved it: a regression outright."""
    fit = e.starved
    if fit is None or math.exp(fit.effect) >= 0.5 or t_sf(-fit.t, fit.df) > e.settings.early_p:
        return None
    return Look(REGRESSION, "starved", f"the target was starved: {math.exp(fit.effect):.0%} of its events with the "
                f"step, drift allowed for ({e.n_with} with, {e.n_without} without)", "event count",
                fit.effect, math.inf, None, e.trend, fit.drift, e.tail, e.broad, e.pooled, e.tail_us)


def too_few(e: Evidence) -> Look | None:
    if min(e.n_with, e.n_without) >= e.settings.min_samples and e.tail is not None and e.broad is not None:
        return None
    if min(e.n_with, e.n_without) < e.settings.min_samples:
        reason = (f"too few samples ({e.n_without} without, {e.n_with} with the step; need "
                  f"{e.settings.min_samples} each)")
    else:
        reason = "too few blocks yet"
    return Look(INCONCLUSIVE if e.final else None, "too few", reason, trend=e.trend, pooled=e.pooled,
                tail_us=e.tail_us)


def large_improvement(e: Evidence) -> Look | None:
    """The metric's tail far better (RT throttling removed: 377 ms to 0.1 ms) decides at any look.

    At the first look, one block of each arm, noise that lasts a block is in every window of it,
    so the broad tail must be no worse too; later the pooled metric must be no worse, and the
    metric decides whatever the broad tail does (where a step removes rare long waits, the broad
    tail wanders from block to block, or is worse: RT throttling lifted lets the actors run more).
    """
    upper = e.tail.bound(e.settings.confidence)
    if upper >= -e.settings.large_improvement:
        return None
    if e.broad.effect > 0 if e.blocks <= 1 else e.pooled > 1:
        return None
    return _decided(e, NO_REGRESSION, "large improvement", e.tail, upper,
                    "a large improvement" + (", clear after one block" if e.blocks <= 1 else "") + _broad_worse(e))


def first_look(e: Evidence) -> Look | None:
    """At the first look nothing but a large improvement is clear: no trend can be told from an effect yet."""
    if e.blocks > 1:
        return None
    return _undecided(e)


def tail_regression(e: Evidence) -> Look | None:
    """The metric's own tail worse beyond the tolerance, significantly: rare stalls the step adds."""
    fit = e.tail
    if fit.df < e.settings.futility_df:
        return None
    p_value = fit.p_beyond(e.tolerance)
    if p_value > e.alpha or e.tail_ratio <= 1 + e.settings.tolerance:
        return None
    return _decided(e, REGRESSION, "tail regression", fit, fit.bound(e.settings.confidence, upper=False),
                    f"worse beyond the {e.settings.tolerance:.0%} tolerance (p={p_value:.4f})", p_value)


def broad_regression(e: Evidence) -> Look | None:
    """The broad tail significantly worse, and the metric's own tail and the pooled metric worse too."""
    fit = e.broad
    if fit.df < e.settings.futility_df:
        return None
    p_value = fit.p_value
    if p_value > e.alpha or fit.effect <= e.tolerance or e.tail.effect <= e.tolerance \
            or e.pooled <= 1 + e.settings.tolerance:
        return None
    return _decided(e, REGRESSION, "broad regression", fit, fit.bound(e.settings.confidence, upper=False),
                    f"worse beyond the {e.settings.tolerance:.0%} tolerance (p={p_value:.4f}), and "
                    f"{e.tail_name} {_times(e.tail.effect)}")


def tail_bounded(e: Evidence) -> Look | None:
    """The slowest 0.1% bounded within the tolerance: the metric decides, whatever the broad tail does.
    (FIFO removal under an RT budget trades shorter rare waits for more middling ones: p999 378 to
    18 ms, p99 0.04 to 8 ms.)"""
    upper = e.tail.bound(e.settings.confidence)
    if upper >= e.tolerance:
        return None
    return _decided(e, NO_REGRESSION, "tail bounded", e.tail, upper,
                    f"at most {_times(upper)} at {e.settings.confidence:.0%}, within the {e.settings.tolerance:.0%} "
                    f"tolerance{_broad_worse(e)}")


def futility(e: Evidence) -> Look | None:
    """No sign of a regression in either tail: Wald's likelihood ratio of "no effect" against a 2x
    broad regression, and against a 3x worse metric tail, both at e^-3 or below, once enough blocks
    make the standard errors worth trusting. The metric's tail must agree: the broad tail alone
    hides rare stalls. And neither tail may show a sign of being worse beyond the tolerance (p <=
    sign_p): the ratio weighs 1x against 3x, so on its own it takes anything below their midpoint,
    x1.73, for "no effect" (rare stalls on a host whose own stalls reach 2 ms read x1.6-1.7 on the
    slowest 0.1%, worse beyond the tolerance at p of about 0.003-0.05, and were kept)."""
    s = e.settings
    if min(e.broad.df, e.tail.df) < s.futility_df \
            or min(e.broad.p_beyond(e.tolerance), e.tail.p_beyond(e.tolerance)) <= s.sign_p:
        return None
    broad, tail = e.broad.llr(s.alternative), e.tail.llr(s.tail_alternative)
    if max(broad, tail) > s.futility_llr:
        return None
    return _decided(e, NO_REGRESSION, "futility", e.tail, e.tail.bound(s.confidence),
                    f"no sign of a regression: likelihood ratio {math.exp(tail):.3f} against "
                    f"{math.exp(s.tail_alternative):.0f}x on it, {math.exp(broad):.3f} against "
                    f"{math.exp(s.alternative):.0f}x on the slowest 5%")


def undecided(e: Evidence) -> Look | None:
    """Before the last block: another block. At it: inconclusive, saying what could not be ruled out."""
    if not e.final:
        return _undecided(e)
    fit, upper = e.tail, e.tail.bound(e.settings.confidence)
    if abs(fit.drift) > upper - fit.effect:
        why = (f"the target's latency drifted ({_percent(fit.drift)} over the measurement), and "
               f"{_times(upper)} cannot be ruled out")
    else:
        why = f"up to {_times(upper)} cannot be ruled out, nor a regression shown (p={fit.p_value:.3f})"
    return _decided(e, INCONCLUSIVE, "inconclusive", fit, upper, why)


RULES: list[Callable[[Evidence], Look | None]] = [
    starved, too_few, large_improvement, first_look, tail_regression, broad_regression, tail_bounded, futility,
    undecided]


def why_not_reverted(decision: Look, settings: SwitchbackSettings) -> str | None:
    """One line for a step not reverted though its pooled metric rose beyond the tolerance; else None."""
    if decision.outcome == REGRESSION or not decision.pooled > 1 + settings.tolerance or decision.tail is None:
        return None
    tail = decision.tail
    upper = tail.bound(settings.confidence)
    why = {"futility": "no sign of a regression",
           "tail bounded": "within the tolerance",
           "large improvement": "a large improvement"}.get(
        decision.rule, f"not beyond the {settings.tolerance:.0%} tolerance at {settings.confidence:.0%} confidence")
    return (f"not reverted though the pooled {settings.metric} rose {_times(math.log(decision.pooled))}: the "
            f"slowest {_share_text(tail_share_of(settings.metric))} of each block, drift allowed for, is "
            f"{_times(tail.effect)} (at most {_times(upper)} at {settings.confidence:.0%}): {why}; a pooled "
            f"{settings.metric} rests on a few waits, which the host's own stalls move")


# -- pieces --------------------------------------------------------------------


def _decided(e: Evidence, outcome: str, rule: str, fit: Fit, bound: float, why: str,
             p_value: float | None = None) -> Look:
    """A decision on ``fit``'s statistic; ``p_value``: the test's that decided (else that of "worse")."""
    name = "the slowest 5%" if fit is e.broad else e.tail_name
    reason = f"{name} {_times(fit.effect)} with the step, drift allowed for ({e.trend} trend): {why}"
    return Look(outcome, rule, reason, name, fit.effect, bound, fit.p_value if p_value is None else p_value, e.trend,
                fit.drift, e.tail, e.broad, e.pooled, e.tail_us)


def _broad_worse(e: Evidence) -> str:
    """Said of a step kept on the metric's tail while the slowest 5% is worse beyond the tolerance."""
    if e.broad.effect <= e.tolerance:
        return ""
    return f"; the slowest 5% is {_times(e.broad.effect)}, and the {e.settings.metric} decides"


def _undecided(e: Evidence) -> Look:
    return Look(None, "measure more", f"{e.tail_name} {_times(e.tail.effect)} so far", e.tail_name, e.tail.effect,
                e.tail.bound(e.settings.confidence), e.tail.p_value, e.trend, e.tail.drift, e.tail, e.broad,
                e.pooled, e.tail_us)


def _blocks(windows: list[Window]) -> list[Window]:
    """Each block's windows pooled into one (events together, the mean time): the unit of evidence."""
    order = list(dict.fromkeys(w.block for w in windows))
    pooled = []
    for block in order:
        members = [w for w in windows if w.block == block]
        pooled.append(Window(np.concatenate([w.values for w in members]), members[0].with_step,
                             float(np.mean([w.time for w in members])), block))
    return pooled


def _degree(degree: int, points: int) -> int:
    """No more trend terms than the points leave room for (intercept, effect, and one to spare)."""
    return min(degree, max(points - 3, 0))


def _fit(y: np.ndarray, arms: np.ndarray, times: np.ndarray, degree: int) -> Fit | None:
    """Least squares of y on [1, with-step, t, t^2 (up to degree)]; None without residual freedom."""
    span = max(times.max() - times.min(), 1e-9)
    scaled = (times - times.min()) / span * 2 - 1  # -1..1: a well-conditioned polynomial
    columns = [np.ones_like(y), arms] + [scaled ** d for d in range(1, degree + 1)]
    x = np.column_stack(columns)
    df = len(y) - x.shape[1]
    if df < 1 or np.linalg.matrix_rank(x) < x.shape[1] or not np.isfinite(y).all():
        return None
    coefficients, _, _, _ = np.linalg.lstsq(x, y, rcond=None)
    residuals = y - x @ coefficients
    covariance = float(residuals @ residuals) / df * np.linalg.inv(x.T @ x)
    trend = sum(coefficients[1 + d] * (np.array([-1.0, 1.0]) ** d) for d in range(1, degree + 1))
    drift = float(trend[1] - trend[0]) if degree else 0.0
    return Fit(float(coefficients[1]), math.sqrt(max(covariance[1, 1], 1e-18)), df, drift)


def _ratio(with_step: list[np.ndarray], without: list[np.ndarray], figure: Callable[[np.ndarray], float]) -> float:
    """``figure`` of the pooled with-arm over that of the pooled without-arm."""
    if not with_step or not without:
        return math.nan
    before, after = figure(np.concatenate(without)), figure(np.concatenate(with_step))
    return after / before if before > 0 else math.inf


def _geometric_mean_us(logs: np.ndarray) -> float:
    finite = logs[np.isfinite(logs)]
    return float(np.exp(finite.mean()) / 1000) if len(finite) else math.nan


def _share_text(share: float) -> str:
    return f"{share:.1%}".replace(".0%", "%")


def _times(log_ratio: float) -> str:
    ratio = math.exp(log_ratio)
    return f"x{ratio:.2g}" if ratio < 0.1 else f"x{ratio:.2f}" if ratio < 10 else f"x{ratio:.3g}"


def _percent(log_ratio: float) -> str:
    return f"{math.exp(log_ratio) - 1:+.0%}"
