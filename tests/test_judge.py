"""The judge: inconclusive when it cannot know, robust to bursts, sees real regressions."""


from __future__ import annotations
import sys
from pathlib import Path

import numpy as np
import pytest

from tuned_rl.measure.judge import (INCONCLUSIVE, NO_REGRESSION, REGRESSION, JudgeSettings, average_ranks, judge,
                                   permutation_p_value, window_tail)
from tuned_rl.measure.stats import format_us, quantile, summarize

sys.path.insert(0, str(Path(__file__).parent.parent / "bench"))
from judge_sim import synthetic_arm  # noqa: E402  the bench's noise models, shared on purpose


def test_nearest_rank_quantiles():
    values = np.arange(1, 1001)
    assert quantile(values, 0.999) == 999 and quantile(values, 0.5) == 500 and quantile(values, 1.0) == 1000
    summary = summarize(values * 1000)
    assert (summary.n, summary.p50_us, summary.p99_us, summary.p999_us, summary.max_us) == (1000, 500, 990, 999, 1000)


def test_latencies_print_in_the_unit_people_read():
    assert [format_us(x) for x in (5.25, 83, 2400, 374_666, 1_500_000)] == \
        ["5.2 µs", "83 µs", "2.40 ms", "374.7 ms", "1.50 s"]


def test_too_few_samples_is_inconclusive_never_a_pass():
    rng = np.random.default_rng(0)
    before = [rng.integers(1, 100, 50) for _ in range(10)]
    after = [w * 10 for w in before]
    verdict = judge(before, after, JudgeSettings(min_samples=2000))
    assert verdict.outcome == INCONCLUSIVE and "too few samples" in verdict.reason


def test_too_few_windows_for_the_confidence_is_inconclusive():
    rng = np.random.default_rng(0)
    verdict = judge(synthetic_arm(rng, 3, 1, False), synthetic_arm(rng, 3, 5, False), JudgeSettings(min_samples=10))
    assert verdict.outcome == INCONCLUSIVE and "cannot reach 99% confidence" in verdict.reason


def test_a_clear_regression_is_named_with_its_figures():
    rng = np.random.default_rng(3)
    verdict = judge(synthetic_arm(rng, 15, 1, False), synthetic_arm(rng, 15, 3, False))
    assert verdict.outcome == REGRESSION and verdict.p_value < 0.01 and verdict.ratio > 2
    assert verdict.reason.startswith("p999 ") and "->" in verdict.reason


def test_an_improvement_is_no_regression():
    rng = np.random.default_rng(4)
    assert judge(synthetic_arm(rng, 15, 3, False), synthetic_arm(rng, 15, 1, False)).outcome == NO_REGRESSION


def test_one_burst_window_is_not_a_regression():
    rng = np.random.default_rng(5)
    before, after = synthetic_arm(rng, 15, 1, False), synthetic_arm(rng, 15, 1, False)
    after[7] = after[7] * 20  # another tenant's burst, in one window only
    verdict = judge(before, after)
    assert verdict.ratio > 2  # the pooled p999 alone would call it
    assert verdict.outcome == NO_REGRESSION and "not significant" in verdict.reason


def test_the_window_tail_is_the_mean_log_of_the_top_share():
    window = np.array([1, 2, 3, 4, 5, 6, 7, 8, 9, 1000, 10000])
    assert window_tail(window, 0.1) == pytest.approx((np.log(1000) + np.log(10000)) / 2)
    assert window_tail(np.array([], dtype=np.int64), 0.1) == -np.inf


def test_false_regression_rate_on_a_a_pairs_stays_within_one_percent():
    rng = np.random.default_rng(2026)
    calls = [judge(synthetic_arm(rng, 15, 1, bursty), synthetic_arm(rng, 15, 1, bursty)).outcome
             for bursty in (False, True) for _ in range(150)]
    assert calls.count(REGRESSION) / len(calls) <= 0.01


def test_a_true_2x_regression_is_detected_nearly_always():
    rng = np.random.default_rng(7)
    calls = [judge(synthetic_arm(rng, 15, 1, False), synthetic_arm(rng, 15, 2, False)).outcome for _ in range(60)]
    assert calls.count(REGRESSION) / len(calls) >= 0.95


def test_a_step_that_starves_the_target_is_a_regression_not_inconclusive():
    rng = np.random.default_rng(8)
    before = synthetic_arm(rng, 15, 1, False)
    starved = [w[:50] * 5 for w in synthetic_arm(rng, 15, 1, False)]  # 750 events where there were 15,000
    verdict = judge(before, starved)
    assert verdict.outcome == REGRESSION and "starved" in verdict.reason
    thin_before = [w[:100] for w in before]  # too few events on both sides: nothing to compare
    assert judge(thin_before, starved).outcome == INCONCLUSIVE


def test_tied_windows_favour_neither_arm():
    # Waits summed in the kernel come back as bucket values: identical windows tie exactly.
    assert average_ranks(np.array([3.0, 1.0, 3.0, 2.0, 3.0])).tolist() == [4.0, 1.0, 4.0, 2.0, 4.0]
    window = np.repeat(np.array([10_000, 1_081_300]), [9_990, 10])
    p = permutation_p_value([window] * 4, [window] * 4, 0.999, 2000, 1)
    assert p == 1.0  # every split's rank sum equals the observed one: no evidence either way
