"""The sequential switchback verdict on synthetic blocks: drift, starvation, rare stalls, early stops."""


from __future__ import annotations
import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

from tuned_rl.measure.judge import INCONCLUSIVE, NO_REGRESSION, REGRESSION
from tuned_rl.measure.switchback import Fit, SwitchbackSettings, Window, futility, gather, look, why_not_reverted

sys.path.insert(0, str(Path(__file__).parent.parent / "bench"))
from judge_sim import Effect, SyntheticSource, heavy_tail, run_case  # noqa: E402  the bench's noise models


def blocks_of(arm_scale, blocks: int, events: int = 4000, drift=lambda t: 1.0, count=lambda t, b: 1.0, seed=0,
              effect: Effect | None = None):
    """Windows of 2 baseline windows and ``blocks`` blocks of 2, alternating with/without the step
    (which scales the waits by ``arm_scale``, or does ``effect`` to them)."""
    rng = np.random.default_rng(seed)
    windows, clock = [], 0.0
    for block in range(blocks + 1):
        with_step = block % 2 == 1
        for _ in range(2):
            n = int(events * count(clock, with_step))
            values = heavy_tail(rng, n, drift(clock) * (arm_scale if with_step else 1.0))
            if with_step and effect is not None:
                values = effect.apply(rng, values, clock, 0.5)
            windows.append(Window(values, with_step, clock + 0.25, block))
            clock += 0.5
        clock += 0.25  # settling
    return windows


def decide(windows_for, max_blocks: int = 24):
    """Look after each block, as the verifier does; (outcome, blocks used)."""
    settings = SwitchbackSettings(max_blocks=max_blocks)
    for blocks in range(1, max_blocks + 1):
        verdict = look(windows_for(blocks), blocks, settings)
        if verdict.outcome is not None:
            return verdict, blocks
    raise AssertionError("the last block must decide")


def test_a_harmless_step_stops_early_and_a_2x_regression_is_seen():
    verdict, used = decide(lambda b: blocks_of(1.0, b))
    assert verdict.outcome == NO_REGRESSION and used <= 8
    verdict, used = decide(lambda b: blocks_of(2.0, b, seed=1))
    assert verdict.outcome == REGRESSION and "worse beyond the 20% tolerance" in verdict.reason


def test_a_large_improvement_is_decided_at_the_first_look():
    verdict, used = decide(lambda b: blocks_of(0.01, b))
    assert verdict.outcome == NO_REGRESSION and used == 1 and "large improvement" in verdict.reason


def test_a_steep_drift_is_not_a_regression():
    # The tail doubles over 10 s on its own, as a workload started beside CPU-bound jobs does.
    verdict, _ = decide(lambda b: blocks_of(1.0, b, drift=lambda t: 2 ** (t / 10)))
    assert verdict.outcome in (NO_REGRESSION, INCONCLUSIVE)


def test_event_counts_falling_on_their_own_are_not_starvation_but_a_step_halving_them_is():
    falling = lambda t, with_step: max(0.3, 1 - t / 15)  # noqa: E731  45% fewer over the measurement
    verdict, _ = decide(lambda b: blocks_of(1.0, b, count=falling))
    assert verdict.outcome != REGRESSION
    starved = lambda t, with_step: 0.2 if with_step else 1.0  # noqa: E731
    verdict, _ = decide(lambda b: blocks_of(1.0, b, count=starved))
    assert verdict.outcome == REGRESSION and "starved" in verdict.reason


def test_rare_long_waits_the_step_adds_are_a_regression_the_broad_tail_misses():
    def stalls(b):
        windows = blocks_of(1.0, b)
        for w in windows:
            if w.with_step:
                w.values[:8] = 300_000_000  # 8 of 4,000 events wait 300 ms: an RT budget cut
        return windows
    verdict, _ = decide(stalls)
    assert verdict.outcome == REGRESSION and verdict.rule == "tail regression"
    assert verdict.statistic == "the slowest 0.1%" and verdict.reason.startswith("the slowest 0.1% x")


@pytest.mark.parametrize("stall_ms, rule", [(300, "large improvement"), (9, "tail bounded")])
def test_a_step_that_trades_rare_stalls_for_middling_waits_is_judged_on_the_metric(stall_ms, rule):
    # FIFO removal under an RT budget: without the step, a few stalls of 300 ms (p999 huge);
    # with it, 5% of events wait 8 ms behind FIFO actors (p99 worse) and the stalls are gone.
    # Stalls of 9 ms: the metric's tail hardly better, and bounded within the tolerance.
    def trade(b):
        windows = blocks_of(1.0, b, seed=3)
        for w in windows:
            if w.with_step:
                w.values[: len(w.values) // 20] = 8_000_000
            else:
                w.values[:8] = stall_ms * 1_000_000
        return windows
    verdict, _ = decide(trade)
    assert verdict.outcome == NO_REGRESSION and verdict.rule == rule, verdict.reason
    assert "the slowest 5% is x" in verdict.reason and "the p999 decides" in verdict.reason
    assert verdict.statistic == "the slowest 0.1%"


def test_too_few_events_is_inconclusive_at_the_last_block_not_a_pass():
    verdict, used = decide(lambda b: blocks_of(1.0, b, events=20), max_blocks=4)
    assert verdict.outcome == INCONCLUSIVE and used == 4 and "too few samples" in verdict.reason


@pytest.mark.parametrize("drift", ["none", "exp"])
def test_false_regressions_stay_rare_under_bursts_and_drift(drift):
    rng = np.random.default_rng(7)
    regression, _, _ = run_case("switchback", lambda trial: SyntheticSource(rng, 4000, drift, 1.0, 0.5), 100)
    assert regression <= 0.02  # bench/judge_sim.py --trials 1000 measures it: under 1%


def test_rare_long_waits_the_step_removes_decide_within_two_blocks_though_the_broad_tail_wanders():
    # An RT budget raised: every window without the step holds four 377 ms waits, and the broad
    # tail wanders by a lognormal factor from block to block. Before the extreme tail decided at
    # every look, some seeds took 6-10 blocks, waiting for the broad tail to bound the effect.
    def throttled(seed):
        def windows_for(blocks):
            rng = np.random.default_rng(seed)
            windows, clock = [], 0.0
            for block in range(blocks + 1):
                with_step = block % 2 == 1
                wobble = float(np.exp(rng.normal(0, 0.5)))
                for _ in range(2):
                    values = heavy_tail(rng, 2000 if with_step else 1300, wobble)
                    if not with_step:
                        values[:4] = 377_000_000
                    windows.append(Window(values, with_step, clock + 0.25, block))
                    clock += 0.5
                clock += 0.25
            return windows
        return windows_for
    used = []
    for seed in range(30):
        verdict, blocks = decide(throttled(seed))
        assert verdict.outcome == NO_REGRESSION, (seed, verdict.reason)
        used.append(blocks)
    assert max(used) <= 2, used


def test_rare_stalls_that_leave_the_p99_alone_are_a_regression_of_the_slowest_tenth_of_a_percent():
    # The field reports' problem: a SCHED_FIFO helper on the target's CPU spins 5 ms every 0.5 s, and
    # the default canary's four threads each wait it out: 0.1% of waits, p999 up, p99 not.
    spins, rng = Effect(spins=(5, 0.5)), np.random.default_rng(0)
    without = [heavy_tail(rng, 4000) for _ in range(100)]
    with_step = np.concatenate([spins.apply(rng, w, 0.5 * i, 0.5) for i, w in enumerate(without)])
    without = np.concatenate(without)
    assert np.percentile(with_step, 99) < 1.1 * np.percentile(without, 99)  # the p99 hardly moves (+6%)
    assert np.percentile(with_step, 99.9) > 3 * np.percentile(without, 99.9)  # the p999 does
    for seed in range(5):
        verdict, _ = decide(lambda b, s=seed: blocks_of(1.0, b, events=4000, seed=s, effect=spins))
        assert verdict.outcome == REGRESSION and verdict.rule == "tail regression", (seed, verdict.reason)
        assert verdict.bound > np.log(1.2)  # its lower bound is beyond the tolerance


def test_the_futility_stop_needs_the_metrics_own_tail_too():
    # 3 ms every second: the slowest 5% hardly moves and on its own says "no sign of a 2x regression"
    # within six blocks; the slowest 0.1% says otherwise, so the step is never called harmless.
    spins = Effect(spins=(3, 1.0))
    regressions, broad_alone = 0, 0
    for seed in range(20):
        windows_for = lambda b, s=seed: blocks_of(1.0, b, events=4000, seed=s, effect=spins)  # noqa: E731
        verdict, _ = decide(windows_for)
        regressions += verdict.outcome == REGRESSION
        early = look(windows_for(6), 6, SwitchbackSettings())
        broad_alone += early.broad.llr(np.log(2)) <= -3
    assert broad_alone == 20  # the slowest 5% alone would have stopped every one at the sixth block
    assert regressions >= 18  # 19 of these 20; bench/judge_sim.py: 86% of 1000 at 8,000 events a second


def test_rare_stalls_a_noisy_host_dilutes_are_never_called_harmless():
    # On a host whose own stalls lengthen 0.5% of waits by 0.5-2.5 ms (a fresh CI machine: a quiet
    # p999 of 0.8-2.8 ms), 5 ms spins every 0.5 s move the slowest 0.1% only x1.6-1.9. Wald's ratio
    # of 1x against 3x takes anything below x1.73 for "no effect": it kept 8% of such steps in
    # simulation (bench/judge_sim.py), and the live harmful-cpuset and provisioned-step scenarios
    # at x1.57 and x1.71 under bench/host_noise.py. A tail worse beyond the tolerance at p <= 0.05
    # is a sign of a regression: no futility stop then.
    evidence = gather(blocks_of(1.0, 8), 8, SwitchbackSettings())
    sure_of_1_7x = dataclasses.replace(evidence, tail=Fit(np.log(1.7), 0.06, 6, 0.0), broad=Fit(0.0, 0.05, 6, 0.0))
    assert sure_of_1_7x.tail.llr(np.log(3)) < -3  # the ratio alone says "no effect"
    assert futility(sure_of_1_7x) is None
    assert futility(dataclasses.replace(sure_of_1_7x, tail=Fit(np.log(1.1), 0.06, 6, 0.0))).rule == "futility"
    spins, trials = Effect(spins=(5, 0.5)), 60
    rng = np.random.default_rng(7)
    regressions, _, _ = run_case(
        "switchback", lambda trial: SyntheticSource(rng, 8000, "none", spins, 0.5, noisy_host=True), trials)
    assert regressions >= 0.95, regressions
    # and a harmless step on the same host still stops early, with no false regression
    regressions, undecided, seconds = run_case(
        "switchback", lambda trial: SyntheticSource(rng, 8000, "none", Effect(), 0.5, noisy_host=True), trials)
    assert regressions <= 1 / trials and undecided <= 2 / trials and seconds < 15, (regressions, undecided, seconds)


def test_a_tail_a_little_worse_but_within_the_tolerance_is_not_a_regression_however_sure():
    # Every wait 15% longer, with the block-to-block noise of a quiet host: certainly worse, and
    # within the 20% the profile tolerates. The test is of "worse beyond the tolerance", not "worse".
    verdict, _ = decide(lambda b: blocks_of(1.15, b, events=40000))
    assert verdict.outcome != REGRESSION, verdict.reason


def test_a_regression_waits_for_four_degrees_of_freedom():
    def stalls(b):
        windows = blocks_of(1.0, b)
        for w in windows:
            if w.with_step:
                w.values[:8] = 300_000_000  # an RT budget cut: unmistakable from the first block
        return windows
    verdict, used = decide(stalls)
    assert verdict.outcome == REGRESSION and used == 6 and verdict.tail.df == 4


def test_a_kept_step_whose_pooled_p999_rose_says_why_in_one_line():
    # A host's stall in one with-block raises the pooled p999; block by block, drift allowed for,
    # the slowest 0.1% is no worse, and the step is kept, saying why in one line.
    def burst(b):
        windows = blocks_of(1.0, b, seed=6)
        for w in windows:
            if w.with_step and w.block == 1:
                w.values[:3] = 20_000_000
        return windows
    settings = SwitchbackSettings()
    verdict, _ = decide(burst)
    assert verdict.outcome == NO_REGRESSION and verdict.rule == "futility" and verdict.pooled > 1.2
    line = why_not_reverted(verdict, settings)
    assert line.startswith(f"not reverted though the pooled p999 rose x{verdict.pooled:.2f}: the slowest 0.1% "
                           f"of each block, drift allowed for, is x{np.exp(verdict.tail.effect):.2f} (at most x")
    assert "at 99%): no sign of a regression" in line
    regression = look(blocks_of(3.0, 8), 8, settings)
    assert regression.outcome == REGRESSION and why_not_reverted(regression, settings) is None
    assert why_not_reverted(dataclasses.replace(verdict, pooled=1.1), settings) is None  # within the tolerance
