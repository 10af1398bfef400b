"""The sequential switchback verdict on synthetic blocks: drift, starvation, rare stalls, both error sides, early stops."""


from __future__ import annotations
import dataclasses
import math
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from monte_carlo import first_crossing
from tuned_rl.measure.judge import INCONCLUSIVE, NO_REGRESSION, REGRESSION
from tuned_rl.measure.switchback import (NO_PRIOR, Fit, NoisePrior, SwitchbackSettings, Window, arm_order, gather,
                                         harmless, keep_held_back, look, randomization_p, run_blocks_for,
                                         why_not_reverted)

sys.path.insert(0, str(Path(__file__).parent.parent / "bench"))
from judge_sim import Effect, SyntheticSource, heavy_tail, run_case, warm_up_prior  # noqa: E402  the bench's noise models

SETTINGS = SwitchbackSettings()


def blocks_of(arm_scale, blocks: int, events: int = 4000, drift=lambda t: 1.0, count=lambda t, b: 1.0, seed=0,
              effect: Effect | None = None, before=lambda w: w, run_blocks: int = 1, settle: float = 0.25):
    """A baseline block and ``blocks`` blocks of one 0.5 s window each, in pairs of runs of
    ``run_blocks`` blocks (AB/BA by a seeded coin), ``settle`` s of settling where the arm changes; the
    step scales the waits by ``arm_scale`` (or does ``effect`` to them); ``before`` may change each
    window afterwards."""
    rng = np.random.default_rng(seed)
    arms = [False] + arm_order(np.random.default_rng(seed + 1000), blocks, run_blocks)
    windows, clock = [], 0.0
    for block, with_step in enumerate(arms):
        if block and with_step != arms[block - 1]:
            clock += settle
        n = int(events * count(clock, with_step))
        values = heavy_tail(rng, n, drift(clock) * (arm_scale if with_step else 1.0))
        if with_step and effect is not None:
            values = effect.apply(rng, values, clock, 0.5)
        windows.append(before(Window(values, with_step, clock + 0.25, block)))
        clock += 0.5
    return windows


def decide(windows_for, settings: SwitchbackSettings = SETTINGS, prior: NoisePrior = NO_PRIOR):
    """Look after each block, as the verifier does; (verdict, blocks used)."""
    for blocks in range(1, settings.max_blocks + 1):
        verdict = look(windows_for(blocks), blocks, settings, prior)
        if verdict.outcome is not None:
            return verdict, blocks
    raise AssertionError("the last block must decide")


def test_a_harmless_step_is_kept_with_the_harm_it_ruled_out_and_a_2x_regression_is_reverted():
    verdict, used = decide(lambda b: blocks_of(1.0, b))
    assert verdict.outcome == NO_REGRESSION and used <= 12, (used, verdict.reason)
    assert verdict.harm == 4.0 and verdict.bound < math.log(4) and "worse than x4 ruled out" in verdict.reason
    verdict, used = decide(lambda b: blocks_of(2.0, b, seed=1))
    assert verdict.outcome == REGRESSION and "worse beyond the 20% tolerance" in verdict.reason
    assert verdict.bound > math.log(1.2) and verdict.level > SETTINGS.confidence  # a look spends a share of the 1%


def test_a_large_improvement_is_decided_within_a_few_blocks():
    verdict, used = decide(lambda b: blocks_of(0.01, b))
    assert verdict.outcome == NO_REGRESSION and used <= 6 and verdict.rule == "large improvement"
    # Decided on too few blocks for a trend (under 6): the reason says so, not "(none trend)".
    assert verdict.trend == "none" and "no drift fitted" in verdict.reason and "trend" not in verdict.reason, \
        verdict.reason


def test_a_steep_drift_is_not_a_regression():
    # The tail doubles over 10 s on its own, as a workload started beside CPU-bound jobs does.
    for seed in range(5):
        verdict, _ = decide(lambda b, s=seed: blocks_of(1.0, b, drift=lambda t: 2 ** (t / 10), seed=s))
        assert verdict.outcome in (NO_REGRESSION, INCONCLUSIVE), verdict.reason


def test_event_counts_falling_on_their_own_are_not_starvation_but_a_step_halving_them_is():
    falling = lambda t, with_step: max(0.3, 1 - t / 15)  # noqa: E731  45% fewer over the measurement
    verdict, _ = decide(lambda b: blocks_of(1.0, b, count=falling))
    assert verdict.outcome != REGRESSION
    starved = lambda t, with_step: 0.2 if with_step else 1.0  # noqa: E731
    verdict, _ = decide(lambda b: blocks_of(1.0, b, count=starved))
    assert verdict.outcome == REGRESSION and "starved" in verdict.reason


def _stalls(w: Window) -> Window:
    if w.with_step:
        w.values[:8] = 300_000_000  # 8 of 4,000 events wait 300 ms: an RT budget cut
    return w


def test_rare_long_waits_the_step_adds_are_a_regression_the_broad_tail_misses():
    verdict, used = decide(lambda b: blocks_of(1.0, b, before=_stalls))
    assert verdict.outcome == REGRESSION and verdict.rule == "tail regression"
    assert verdict.statistic == "the slowest 0.1%" and verdict.reason.startswith("the slowest 0.1% x")


def test_a_regression_waits_for_its_own_four_degrees_of_freedom():
    verdict, used = decide(lambda b: blocks_of(1.0, b, before=_stalls))
    assert used == 6 and verdict.tail.df == 4  # baseline + 6 blocks, less intercept, effect and a linear trend


@pytest.mark.parametrize("stall_ms, rule", [(300, "large improvement"), (9, "tail bounded")])
def test_a_step_that_trades_rare_stalls_for_middling_waits_is_judged_on_the_metric(stall_ms, rule):
    # FIFO removal under an RT budget: without the step, a few stalls of 300 ms (p999 huge);
    # with it, 5% of events wait 8 ms behind FIFO actors (p99 worse) and the stalls are gone.
    # Stalls of 9 ms: the metric's tail hardly better, and bounded within the tolerance.
    def trade(w: Window) -> Window:
        if w.with_step:
            w.values[: len(w.values) // 20] = 8_000_000
        else:
            w.values[:8] = stall_ms * 1_000_000
        return w
    verdict, _ = decide(lambda b: blocks_of(1.0, b, seed=3, before=trade))
    assert verdict.outcome == NO_REGRESSION and verdict.rule == rule, verdict.reason
    assert "the slowest 5% is x" in verdict.reason and "the p999 decides" in verdict.reason
    assert verdict.statistic == "the slowest 0.1%"


def test_too_few_events_is_inconclusive_at_the_last_block_not_a_pass():
    settings = dataclasses.replace(SETTINGS, max_blocks=4)
    verdict, used = decide(lambda b: blocks_of(1.0, b, events=20), settings)
    assert verdict.outcome == INCONCLUSIVE and used == 4 and "too few samples" in verdict.reason


@pytest.mark.parametrize("drift", ["none", "exp"])
def test_false_regressions_stay_rare_under_bursts_and_drift(drift):
    rng = np.random.default_rng(7)
    regression, _, _ = run_case("switchback", lambda trial: SyntheticSource(rng, 8000, drift, 1.0, 0.5), 100)
    assert regression <= 0.01  # bench/judge_sim.py --trials 2000 measures it: docs/judge.md


def test_rare_long_waits_the_step_removes_decide_within_a_few_blocks_though_the_broad_tail_wanders():
    # An RT budget raised: every block without the step holds four 377 ms waits, and the broad
    # tail wanders by a lognormal factor from block to block.
    def throttled(seed):
        def windows_for(blocks):
            rng = np.random.default_rng(seed)
            arms = [False] + arm_order(np.random.default_rng(seed), blocks)
            windows = []
            for block, with_step in enumerate(arms):
                values = heavy_tail(rng, 4000 if with_step else 2600, float(np.exp(rng.normal(0, 0.5))))
                if not with_step:
                    values[:4] = 377_000_000
                windows.append(Window(values, with_step, block * 0.75 + 0.25, block))
            return windows
        return windows_for
    used = []
    for seed in range(30):
        verdict, blocks = decide(throttled(seed))
        assert verdict.outcome == NO_REGRESSION and verdict.rule == "large improvement", (seed, verdict.reason)
        used.append(blocks)
    assert max(used) <= 6 and np.median(used) <= 4, used


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
        verdict, _ = decide(lambda b, s=seed: blocks_of(1.0, b, seed=s, effect=spins))
        assert verdict.outcome == REGRESSION and verdict.rule == "tail regression", (seed, verdict.reason)
        assert verdict.bound > np.log(1.2)  # its lower bound is beyond the tolerance


def test_a_keep_needs_the_metrics_own_tail_bounded_not_the_broad_tail_alone():
    # 3 ms every second: the slowest 5% hardly moves, and its bound alone is under x2 within a few
    # blocks; the slowest 0.1% is x2 worse, and its bound under x3 comes later, if ever.
    spins = Effect(spins=(3, 1.0))
    broad_alone = kept_early = 0
    for seed in range(20):
        windows = blocks_of(1.0, 10, seed=seed, effect=spins)
        evidence = gather(windows, 10, SETTINGS)
        level = SETTINGS.keep_level(10, 0)
        broad_alone += evidence.broad.bound(1 - level) < math.log(SETTINGS.broad_harm)
        kept_early += look(windows, 10, SETTINGS).outcome == NO_REGRESSION
    assert broad_alone >= 15 and kept_early <= 5, (broad_alone, kept_early)


def test_a_tail_a_little_worse_but_within_the_tolerance_is_not_a_regression_however_sure():
    # Every wait 15% longer, with the block-to-block noise of a quiet host: certainly worse, and
    # within the 20% the profile tolerates. The test is of "worse beyond the tolerance", not "worse".
    verdict, _ = decide(lambda b: blocks_of(1.15, b, events=40000))
    assert verdict.outcome != REGRESSION, verdict.reason


def test_between_the_scheduled_looks_nothing_is_decided():
    settings = SETTINGS
    assert [b for b in range(1, 61) if settings.looks_at(b)] == [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20, 24, 31, 38,
                                                                 48, 60]
    windows = blocks_of(1.0, 9, before=_stalls)  # a regression plain at block 9: not a look
    assert look(windows, 9, settings).outcome is None
    assert look(windows, 8, settings).outcome == REGRESSION


def test_the_looks_levels_spend_no_more_than_the_totals():
    s = SETTINGS
    for rule, share in (("tail", 0.6), ("broad", 0.35), ("starved", 0.05)):
        levels = [s.regression_level(b, rule) for b in range(1, s.max_blocks + 1)]
        assert 0 < sum(levels) and max(levels) <= share * s.alpha  # each look's nominal level, under the share
    runs = dataclasses.replace(s, run_blocks=2)  # the tail's share split between blocks and runs
    assert runs.regression_shares == pytest.approx({"tail": 0.12, "run": 0.48, "broad": 0.35, "starved": 0.05})
    assert sum(runs.regression_shares.values()) == pytest.approx(1.0) and s.regression_level(20, "run") == 0
    over_runs = [runs.regression_level(b, "run") for b in range(1, s.max_blocks + 1)]
    first = next(b for b, level in enumerate(over_runs, 1) if level > 0)
    assert first == 12 and max(over_runs) <= 0.48 * s.alpha  # the runs' fit has 4 degrees of freedom from block 11
    keep = [s.keep_level(b, 0) for b in range(1, s.max_blocks + 1)]
    assert keep[:5] == [0.0] * 5 and keep[5] > 0  # no prior: not before the step's own 4 degrees of freedom
    assert s.keep_level(2, 0) == 0 and s.keep_level(4, 24) > 0  # a prior lets the harm bound look sooner


def test_the_arms_change_in_runs_of_a_second_and_each_pair_of_runs_is_one_coin():
    from tuned_rl.measure.settings import VerifySettings
    order = arm_order(np.random.default_rng(5), 16, 2)
    runs = [order[i:i + 2] for i in range(0, 16, 2)]
    assert all(run[0] == run[1] for run in runs)  # a run: two blocks of one arm
    assert all(runs[i][0] != runs[i + 1][0] for i in range(0, 8, 2))  # a pair of runs: AB or BA
    firsts = [runs[i][0] for i in range(0, 8, 2)]
    assert 0 < sum(firsts) < len(firsts)  # the coin, not a fixed order
    hybrid = arm_order(np.random.default_rng(5), 12, 2, single_blocks=4)  # (explored in the sim)
    assert all(hybrid[i] != hybrid[i + 1] for i in (0, 2)) and hybrid[4] == hybrid[5] and hybrid[6] == hybrid[7]
    assert [run_blocks_for(seconds) for seconds in (0.5, 1.0, 0.25, 0.1)] == [2, 1, 4, 4]  # at most MAX_RUN_BLOCKS
    assert VerifySettings().switchback_settings(1).run_blocks == 2  # the default canary's 0.5 s blocks
    assert VerifySettings().switchback_settings(2).run_blocks == 1  # a slow target's 1 s blocks: runs of one
    assert VerifySettings(run_seconds=0).switchback_settings(1).run_blocks == 1


def test_a_stall_once_a_second_lands_in_every_run_with_the_step_and_the_runs_tail_reverts_it():
    # A helper spinning 3 ms every second: a 0.5 s block holds its spin every other time, a run of two
    # blocks every time. Same seeds, same noise: runs of two blocks against runs of one.
    spins = Effect(spins=(3, 1.0))
    runs = dataclasses.replace(SETTINGS, run_blocks=2)
    over_runs = [decide(lambda b, seed=seed: blocks_of(1.0, b, seed=seed, effect=spins, run_blocks=2, settle=0.1),
                        runs)[0] for seed in range(12)]
    over_blocks = [decide(lambda b, seed=seed: blocks_of(1.0, b, seed=seed, effect=spins, settle=0.1))[0]
                   for seed in range(12)]
    reverted = [v for v in over_runs if v.outcome == REGRESSION]
    assert len(reverted) >= 10 and len(reverted) > sum(v.outcome == REGRESSION for v in over_blocks)
    kept = lambda verdicts: sum(v.outcome == NO_REGRESSION for v in verdicts)  # noqa: E731
    assert kept(over_runs) < kept(over_blocks)  # 1 against 4: pooled p999 x1.55, inside the harm a keep rules out
    over = [v for v in reverted if v.rule == "tail regression over runs"]
    assert over and all(v.unit == "run" and v.reason.startswith("the slowest 0.1% of each run of 2 blocks x")
                        for v in over)


def test_runs_of_two_keep_a_harmless_step_and_revert_a_2x_one():
    runs = dataclasses.replace(SETTINGS, run_blocks=2)
    kept = [decide(lambda b, seed=seed: blocks_of(1.0, b, seed=seed, run_blocks=2, settle=0.1), runs)
            for seed in range(10)]
    assert all(v.outcome == NO_REGRESSION for v, _ in kept) and np.median([used for _, used in kept]) <= 10
    worse = [decide(lambda b, seed=seed: blocks_of(2.0, b, seed=seed, run_blocks=2, settle=0.1), runs)[0]
             for seed in range(10)]
    assert all(v.outcome == REGRESSION for v in worse)


def test_the_randomization_p_is_the_share_of_sign_flips_at_least_as_extreme():
    assert randomization_p((1.0, 1.0, 1.0), 0.0) == pytest.approx(1 / 8)  # 2^-pairs: the smallest it can be
    assert randomization_p((1.0, -1.0), 0.0) == pytest.approx(3 / 4)
    assert randomization_p((0.5, 0.5), 0.5) == 1.0  # at the tolerance itself: no evidence beyond it
    assert randomization_p((), 0.0) == 1.0


def test_the_noise_prior_pools_the_earlier_steps_variance_unless_the_step_is_clearly_noisier_or_has_enough_of_its_own():
    fit = Fit(0.1, math.sqrt(0.25 * 0.5), 3, 0.0, variance=0.25, own_df=3, leverage=0.5)
    prior = NoisePrior(tail=(0.2, 20), broad=(0.1, 20))
    pooled = prior.moderate(fit, "tail")
    assert pooled.df == 23 and pooled.variance == pytest.approx((20 * 0.2 + 3 * 0.25) / 23)
    assert pooled.se == pytest.approx(math.sqrt(pooled.variance * 0.5))
    noisier = dataclasses.replace(fit, variance=5.0)  # 25x the prior's: F(3, 20) = 25, p < 0.01
    assert prior.moderate(noisier, "tail") is noisier
    later = dataclasses.replace(fit, df=7, own_df=7)  # past the step's first 6 degrees of freedom, its own decide
    assert prior.moderate(later, "tail", until_own_df=6) is later and prior.moderate(later, "tail", 7).df == 27
    learned = NO_PRIOR.learned(look(blocks_of(1.0, 12), 12, SETTINGS), SETTINGS.prior_df_cap)
    assert learned.tail[1] > 0 and learned.broad[1] > 0 and learned.df <= SETTINGS.prior_df_cap


def test_a_second_step_with_the_noise_the_first_learned_is_kept_sooner():
    first_used, later_used = [], []
    for seed in range(10):
        first, used = decide(lambda b, s=seed: blocks_of(1.0, b, seed=s))
        prior = NO_PRIOR.learned(first, SETTINGS.prior_df_cap)
        later, used_later = decide(lambda b, s=seed: blocks_of(1.0, b, seed=s + 50), prior=prior)
        assert later.outcome == NO_REGRESSION
        first_used.append(used)
        later_used.append(used_later)
    assert np.median(later_used) < np.median(first_used), (first_used, later_used)


def test_the_sims_warm_up_learns_the_noise_a_kept_step_would_have_learned_on_the_same_host():
    # bench/judge_sim.py --warm-up-blocks: blocks without the step, their noise the first step's prior.
    # On one host (each block's scale jittered the same way) it reads what a kept step's own fit reads.
    def jittered(seed: int) -> Callable[[Window], Window]:
        rng = np.random.default_rng(seed)
        return lambda w: dataclasses.replace(w, values=(w.values * rng.lognormal(0, 0.4)).astype(np.int64))
    ratios = []
    for seed in range(12):
        warm = [dataclasses.replace(w, with_step=False) for w in blocks_of(1.0, 11, seed=seed, before=jittered(seed))]
        prior = warm_up_prior(warm, SETTINGS)
        assert prior.tail[1] == 10 and prior.broad[1] == 10  # 12 blocks less a mean and a linear trend
        step, _ = decide(lambda b, s=seed: blocks_of(1.0, b, seed=s + 50, before=jittered(s + 50)))
        ratios.append(prior.tail[0] / NO_PRIOR.learned(step, SETTINGS.prior_df_cap).tail[0])
    assert 0.5 < np.median(ratios) < 2, ratios
    quiet = warm_up_prior([dataclasses.replace(w, with_step=False) for w in blocks_of(1.0, 11, seed=1)], SETTINGS)
    assert quiet.tail[0] < prior.tail[0]  # no jitter: a quieter host, a smaller variance


def test_an_inconclusive_verdict_says_what_it_could_not_rule_out_and_what_to_do():
    settings = dataclasses.replace(SETTINGS, max_blocks=8)
    spins = Effect(spins=(3, 1.0))
    verdict, used = decide(lambda b: blocks_of(1.0, b, seed=2, effect=spins), settings)
    if verdict.outcome == INCONCLUSIVE:
        assert "cannot be ruled out" in verdict.reason and "--max-blocks" in verdict.reason
        assert "a quieter moment" in verdict.reason
    else:
        assert verdict.outcome == REGRESSION  # never kept: x2 on the tail is not ruled out in 8 blocks


def test_a_kept_step_whose_pooled_p999_rose_says_why_in_one_line():
    # A host's stall in one with-block raises the pooled p999; block by block, drift allowed for,
    # the slowest 0.1% is no worse, and the step is kept, saying why in one line.
    def burst(w: Window) -> Window:
        if w.with_step and w.block <= 2:
            w.values[:3] = 20_000_000
        return w
    verdict, _ = decide(lambda b: blocks_of(1.0, b, seed=6, before=burst))
    assert verdict.outcome == NO_REGRESSION and verdict.pooled > 1.2, verdict.reason
    line = why_not_reverted(verdict, SETTINGS)
    assert line.startswith(f"not reverted though the pooled p999 rose x{verdict.pooled:.2f}: the slowest 0.1% "
                           f"of each block, drift allowed for, is x{np.exp(verdict.tail.effect):.2f} (at most x")
    regression = look(blocks_of(3.0, 8), 8, SETTINGS)
    assert regression.outcome == REGRESSION and why_not_reverted(regression, SETTINGS) is None
    assert why_not_reverted(dataclasses.replace(verdict, pooled=1.1), SETTINGS) is None  # within the tolerance


def test_a_keep_waits_while_the_runs_show_a_sign_of_harm_the_blocks_do_not():
    # A helper spinning 3 ms once a second moves a 0.5 s block's slowest 0.1% in every other block
    # only, inside the x4 a keep rules out; a run of two blocks holds it every time, and its test
    # shows it (worse beyond the tolerance at p <= 0.2) long before it can revert at its spent alpha.
    evidence = dataclasses.replace(gather(blocks_of(1.0, 12), 12, SETTINGS), settings=SETTINGS)
    assert keep_held_back(evidence) is None and harmless(evidence) is not None  # nothing holds it: kept
    runs_worse = dataclasses.replace(evidence, run_tail=Fit(0.35, 0.15, 6, 0.0, 0.09, 6, 0.25))
    assert 0.05 < runs_worse.run_tail.p_beyond(math.log(1.2)) <= SETTINGS.run_sign_p
    assert keep_held_back(runs_worse) == "run sign" and harmless(runs_worse) is None
    at_the_blocks_level = dataclasses.replace(runs_worse, settings=dataclasses.replace(SETTINGS, run_sign_p=0.05))
    assert keep_held_back(at_the_blocks_level) is None  # what the gate was before 2026-12-07: kept
    floor = dataclasses.replace(runs_worse, settings=dataclasses.replace(SETTINGS, run_sign_df=7))
    assert keep_held_back(floor) is None  # the runs' fit has 6 degrees of freedom, under the (explored) floor
    assert SETTINGS.run_sign_df <= runs_worse.run_tail.df  # at the default the sign counts from the first
    from tuned_rl.measure.settings import VerifySettings
    profile = VerifySettings.from_table({"run_sign_p": 0.05}).switchback_settings()
    assert profile.run_sign_p == 0.05 and VerifySettings().switchback_settings().run_sign_p == SETTINGS.run_sign_p


def test_rare_stalls_a_noisy_host_dilutes_are_never_called_harmless():
    # On a host whose own stalls lengthen 0.5% of waits by 0.5-2.5 ms (a fresh CI machine: a quiet
    # p999 of 0.8-2.8 ms), 5 ms spins every 0.5 s move the slowest 0.1% only x1.6-1.9: inside the
    # x3 the harm bound rules out. A tail worse beyond the tolerance at p <= 0.05 is a sign of harm:
    # no keep then, and the measurement goes on to a regression (without that sign check, 32.7% of
    # such steps were reverted in bench/judge_sim.py, 94% with it).
    evidence = gather(blocks_of(1.0, 12), 12, SETTINGS)
    sure_of_1_7x = dataclasses.replace(
        evidence, tail=Fit(np.log(1.7), 0.06, 10, 0.0, 0.01, 10, 0.36),
        keep_tail=Fit(np.log(1.7), 0.06, 10, 0.0, 0.01, 10, 0.36), broad=Fit(0.0, 0.05, 10, 0.0, 0.01, 10, 0.25),
        keep_broad=Fit(0.0, 0.05, 10, 0.0, 0.01, 10, 0.25))
    assert sure_of_1_7x.keep_tail.bound(1 - SETTINGS.keep_level(12, 0)) < math.log(3)  # the bound alone: keep
    assert harmless(sure_of_1_7x) is None and keep_held_back(sure_of_1_7x) == "sign"
    spins, trials = Effect(spins=(5, 0.5)), 60
    rng = np.random.default_rng(7)
    regressions, _, _ = run_case(
        "switchback", lambda trial: SyntheticSource(rng, 8000, "none", spins, 0.5, noisy_host=True), trials)
    assert regressions >= 0.9, regressions
    # and a harmless step on the same host is still kept soon, with no false regression
    regressions, undecided, seconds = run_case(
        "switchback", lambda trial: SyntheticSource(rng, 8000, "none", Effect(), 0.5, noisy_host=True), trials)
    assert regressions == 0 and undecided <= 2 / trials and seconds < 10, (regressions, undecided, seconds)


def test_an_inconclusive_verdict_names_the_slowest_5_percent_when_that_is_what_kept_it_from_a_keep():
    # The metric's tail no worse, the slowest 5% x2.5 in every with-block: no revert (the metric's
    # tail decides that), and no keep (x2 on the slowest 5% not ruled out); the verdict says which.
    def broad_worse(w: Window) -> Window:
        if w.with_step:
            cut = np.quantile(w.values, 0.95)
            middle = (w.values >= cut) & (w.values < np.quantile(w.values, 0.995))
            w.values[middle] = (w.values[middle] * 2.5).astype(w.values.dtype)
        return w
    # (seed 1: a host on which the slowest 5% is neither bounded under x2 nor beyond the tolerance at
    # its spent level by the last look; on others the broad rule reverts, or the tail is bounded
    # within the tolerance, which keeps whatever the slowest 5% does)
    settings = dataclasses.replace(SETTINGS, max_blocks=12)
    verdict, _ = decide(lambda b: blocks_of(1.0, b, seed=1, before=broad_worse), settings)
    assert verdict.outcome == INCONCLUSIVE, verdict.reason
    assert "the slowest 5% is x" in verdict.reason and "cannot be ruled out" in verdict.reason, verdict.reason
    assert keep_held_back(gather(blocks_of(1.0, 12, seed=1, before=broad_worse), 12, settings)) == "broad"


def test_what_held_a_keep_back_is_named_exactly_when_harmless_does_not_keep():
    # bench/judge_looks.py counts what held each undecided look back; it must name something exactly
    # where the keep's own rule declined, over steps that keep, revert and wait.
    seen = set()
    for scale in (1.0, 1.3, 2.0, 3.0):
        for seed in range(4):
            for blocks in (4, 6, 8, 12, 24):
                e = gather(blocks_of(scale, blocks, seed=seed), blocks, SETTINGS)
                held = keep_held_back(e)
                assert (harmless(e) is None) == (held is not None), (scale, seed, blocks, held)
                seen.add(held)
    assert {None, "no keep look"} <= seen and seen & {"tail", "broad", "tail+broad"}, seen


def _idle_or_shared(seed: int):
    """A block's waits as on the 2026-12-03 recording: the canary's CPU idle in some blocks (most waits
    under a microsecond: its slowest 5% reaches down to them) and shared in others (~15 µs); the
    slowest 0.1% alike in both."""
    rng = np.random.default_rng(seed)

    def reshape(window: Window) -> Window:
        n = len(window.values)
        shared = rng.random() < 0.5
        values = np.full(n, 50, dtype=np.int64)  # an idle CPU's wait: 50 ns
        busy = int(n * (0.12 if shared else 0.035))
        values[:busy] = rng.integers(12_000, 20_000, busy)
        tail = max(4, n // 1000)
        values[:tail] = rng.lognormal(math.log(200_000), 0.4, tail).astype(np.int64)
        return dataclasses.replace(window, values=values)
    return reshape


def test_waits_under_10_us_do_not_move_the_broad_statistic_an_idle_cpu_makes_bimodal():
    """With each wait under 10 µs read as 10 µs in the slowest 5% (BROAD_FLOOR_NS), an A/A on a host
    whose canary CPU goes idle and shared from block to block is kept in a few blocks; read at 1 µs,
    the slowest 5% swung by log(15) between the two and the keep waited (or never came)."""
    used = {}
    for floor in (10_000, 1000):
        settings = dataclasses.replace(SETTINGS, broad_floor_ns=floor)
        results = [decide(lambda b, s=seed: blocks_of(1.0, b, seed=s, before=_idle_or_shared(s)), settings)
                   for seed in range(6)]
        assert all(v.outcome != REGRESSION for v, _ in results)
        used[floor] = sorted(b for _, b in results)
    assert all(v <= 12 for v in used[10_000]), used
    assert np.median(used[1000]) >= 2 * np.median(used[10_000]), used


def switched_blocks(blocks: int, cost: float, step: float = 1.0, seed: int = 3) -> list[Window]:
    """A baseline and ``blocks`` blocks of 4,000 waits in AB/BA pairs; every wait of a block measured
    just after a change of arm (and of the baseline, which follows the probe's start) times ``cost``."""
    arms = [False] + arm_order(np.random.default_rng(seed + 1), blocks)
    rng, windows = np.random.default_rng(seed), []
    for block, arm in enumerate(arms):
        changed = block == 0 or arm != arms[block - 1]
        scale = (cost if changed else 1.0) * (step if arm else 1.0)
        windows.append(Window(heavy_tail(rng, 4000, scale), arm, block * 0.75 + 0.25, block))
    return windows


def test_a_block_just_after_a_change_reads_worse_in_either_arm_and_the_fit_takes_that_out_of_the_noise():
    # Live, with a step the canary cannot feel (bench/scenarios/null_write.py), a block measured just
    # after a change read x1.5-2 worse than one that continued its arm, whichever the arm. The coin
    # gives both arms such blocks, so the effect stays unbiased either way; the change term keeps it
    # from widening the bound a keep waits for.
    quiet = gather(switched_blocks(16, 1.0), 16, SETTINGS).tail
    costly = gather(switched_blocks(16, 3.0), 16, SETTINGS).tail
    assert costly.se < 1.15 * quiet.se, (costly.se, quiet.se)
    assert abs(costly.effect - quiet.effect) < 0.05, (costly.effect, quiet.effect)
    # and a real 2x is still seen at its size through the same switching cost
    doubled = gather(switched_blocks(16, 3.0, step=2.0), 16, SETTINGS).tail
    assert abs(doubled.effect - math.log(2)) < 3 * doubled.se, doubled


def test_the_change_term_costs_no_freedom_the_schedule_does_not_count_and_is_dropped_when_it_cannot_be_fitted():
    from tuned_rl.measure.switchback import CHANGE_TERM_FROM, QUADRATIC_FROM, own_df_at
    assert own_df_at(CHANGE_TERM_FROM - 2) == CHANGE_TERM_FROM - 1 - 2 - 1  # before it: intercept, effect, a line
    assert own_df_at(CHANGE_TERM_FROM - 1) == CHANGE_TERM_FROM - 2 - 1 - 1  # from it: and the term
    # Every block after a change but one (ABAB...): too few of the other kind, the term is left out
    # and its degree of freedom goes to the fit, which still decides.
    arms = [False, False] + [bool(i % 2 == 0) for i in range(QUADRATIC_FROM - 2)]
    rng = np.random.default_rng(5)
    windows = [Window(heavy_tail(rng, 4000), arm, block * 0.75, block) for block, arm in enumerate(arms)]
    fit = gather(windows, len(arms) - 1, SETTINGS).tail
    assert fit is not None and fit.df == len(arms) - 2 - 2  # intercept, effect, a parabola: no change term


def test_a_harmless_step_with_a_switching_cost_is_kept_sooner_and_rare_stalls_through_it_are_still_reverted():
    # Each block measured just after a change x2 (in either arm): the fit's change term takes it out
    # of the noise a keep waits for (median 11.9 s of measuring without the term, 9.25 s with it, on
    # these seeds); a helper spinning 5 ms every 0.5 s is reverted through the same cost.
    rng = np.random.default_rng(11)
    regression, undecided, seconds = run_case(
        "switchback", lambda trial: SyntheticSource(rng, 8000, "none", Effect(), 0.5), 100, 1, 2.0)
    assert regression == 0 and undecided <= 0.02 and seconds <= 10, (regression, undecided, seconds)
    rng = np.random.default_rng(11)
    regression, _, _ = run_case(
        "switchback", lambda trial: SyntheticSource(rng, 8000, "none", Effect(spins=(5, 0.5)), 0.5), 100, 1, 2.0)
    assert regression >= 0.98, regression


def _first_crossing(levels: dict[int, float]) -> float:
    """How often a z-score whose information grows as the blocks measured first crosses the looks' levels."""
    looks = sorted(k for k, level in levels.items() if level > 0)
    return first_crossing([levels[k] for k in looks], tuple(looks), paths=1_000_000, seed=2)


def test_each_regression_rule_errs_at_its_share_of_alpha_and_a_keep_at_most_at_its_share_of_beta():
    # On a score whose information grows as the blocks do, as the fit's (1 / leverage within 10% of
    # blocks from block 8). The regression rules exactly: each rule's boundaries are its own share's
    # and know the looks' spacing (before 2026-12-07 they were alpha's over evenly spaced looks,
    # scaled by the share: the tail's rule erred 0.179% for its 0.12%). The keep at most.
    s = dataclasses.replace(SETTINGS, run_blocks=2)
    blocks = range(1, s.max_blocks + 1)
    for rule, share in s.regression_shares.items():
        crossed = _first_crossing({k: s.regression_level(k, rule) for k in blocks})
        assert crossed == pytest.approx(share * s.alpha, rel=0.1), rule
    keep_share = s.beta * 0.8  # the rest of beta is the large improvement's
    kept = _first_crossing({k: s.keep_level(k, 0) for k in blocks})
    assert 0.9 * keep_share < kept <= keep_share
    exact = _first_crossing({k: dataclasses.replace(s, keep_clock="information").keep_level(k, 0) for k in blocks})
    assert exact == pytest.approx(keep_share, rel=0.03) and exact > kept
    with pytest.raises(ValueError):
        dataclasses.replace(s, keep_clock="hourly").keep_level(8, 0)
