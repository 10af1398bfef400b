"""The verification loop's decisions, with a fake probe whose latency depends on the host's state."""


from __future__ import annotations
import sys
from pathlib import Path

import numpy as np
import pytest

from tuned_rl.core.agent import Agent
from tuned_rl.host import Host
from tuned_rl.core.journal import Journal
from tuned_rl.core.plugin_host import load_plugins
from tuned_rl.profiles.loader import load_profile
from tuned_rl.measure.targets import Target
from tuned_rl.core.verify import Verifier
from tuned_rl.measure.probes import ProbeError, Waits
from tuned_rl.measure.settings import VerifySettings

sys.path.insert(0, str(Path(__file__).parent.parent / "bench"))
from judge_sim import heavy_tail  # noqa: E402  the bench's noise model

SWAPPINESS = "/proc/sys/vm/swappiness"


class StateProbe:
    """Each drain returns one window of events whose scale depends on the state (and on time, for drift);
    the drain numbered ``fail_at`` raises as a broken probe would."""

    name = "fake"
    follows_forks = False

    def __init__(self, scale_of_state, events: int = 4000, fail_at: int | None = None):
        self.scale_of_state, self.lost, self.events, self.fail_at = scale_of_state, 0, events, fail_at
        self.rng = np.random.default_rng(11)
        self.drains = 0

    def drain(self):
        self.drains += 1
        if self.drains == self.fail_at:
            raise ProbeError("the ring buffer could not be read")
        values = heavy_tail(self.rng, self.events, self.scale_of_state())
        return Waits(values, None)  # no start times: each wait counts in the window it is drained in

    def watch(self, tids):
        pass


def verifier_with(scale_of_state, probe=None, **settings):
    """A verifier on the fake probe: windows of 1 ms, each a block of 4,000 waits, the arms changing
    in runs of two blocks as at the defaults (0.5 s windows, runs of 1 s)."""
    settings = {"run_seconds": 0.002, **settings}
    verifier = Verifier(Host("/nonexistent"), Target("canary"), None,
                        VerifySettings(window_seconds=0.001, settle_seconds=0, **settings))
    verifier._probe = probe or StateProbe(scale_of_state)
    return verifier


def run_step(verifier, harm: float, drift=lambda drains: 1.0):
    state = {"applied": False, "applies": 0, "reverts": 0}

    def apply():
        state["applied"], state["applies"] = True, state["applies"] + 1

    def revert():
        state["applied"], state["reverts"] = False, state["reverts"] + 1

    probe = verifier._probe
    probe.scale_of_state = lambda: (harm if state["applied"] else 1.0) * drift(probe.drains)
    return verifier.verify("step", apply, revert), state


@pytest.mark.parametrize("design", ["switchback", "before-after"])
def test_a_harmful_step_is_reverted_and_a_harmless_one_kept(design):
    verifier = verifier_with(lambda: 1.0, design=design)
    result, state = run_step(verifier, harm=3.0)
    assert result.outcome == "reverted" and not state["applied"]
    result, state = run_step(verifier, harm=1.0)
    assert result.outcome == "kept" and state["applied"]


def test_a_large_improvement_is_decided_at_the_first_look_the_data_allows_and_its_last_block_is_the_next_baseline():
    for seed in range(5):
        verifier = verifier_with(lambda: 1.0)
        verifier._order = np.random.default_rng(seed)
        first, state = run_step(verifier, harm=0.01)  # RT throttling lifted: 100x better
        assert first.outcome == "kept" and state["applied"], first.verdict.reason
        assert first.verdict.rule == "large improvement" and len(first.blocks) <= 6, len(first.blocks)  # 3 s at 0.5 s blocks
        ended_with_step = first.blocks[-1]["with_step"]
        second, _ = run_step(verifier, harm=1.0)
        assert not first.reused_baseline and second.reused_baseline == ended_with_step
        if ended_with_step:  # the host as the first step left it: the second's baseline
            assert [id(span) for span in second.before.spans[:1]] == [id(span) for span in first.after.spans[-1:]]


def test_a_pair_that_meets_the_next_with_one_arm_makes_no_change_between_them():
    verifier = verifier_with(lambda: 1.0)
    verifier._order = np.random.default_rng(3)
    result, state = run_step(verifier, harm=1.0)
    arms = [False] + [b["with_step"] for b in result.blocks]  # the baseline, then each block
    switches = sum(a != b for a, b in zip(arms, arms[1:]))
    assert state["applies"] + state["reverts"] == switches + (arms[-1] != state["applied"])
    assert switches < len(result.blocks) or len(result.blocks) <= 2  # some pairs met with one arm


def test_a_harmless_step_on_a_drifting_target_is_not_reverted_but_before_after_would_be():
    # The target's tail grows 3% a window (x2.4 over a 30-window measurement), as a workload
    # started beside CPU-bound jobs does; the step itself does nothing.
    drift = lambda drains: 1.03 ** drains  # noqa: E731
    result, state = run_step(verifier_with(lambda: 1.0), harm=1.0, drift=drift)
    assert result.outcome in ("kept", "inconclusive") and state["applied"]
    fixed, state = run_step(verifier_with(lambda: 1.0, design="before-after"), harm=1.0, drift=drift)
    assert fixed.outcome == "reverted"  # what a before/after comparison makes of drift


def test_a_regression_under_drift_is_still_seen():
    drift = lambda drains: 1.03 ** drains  # noqa: E731
    result, state = run_step(verifier_with(lambda: 1.0), harm=3.0, drift=drift)
    assert result.outcome == "reverted" and not state["applied"]


def test_too_few_samples_is_inconclusive_and_kept_or_reverted_by_policy():
    keep = verifier_with(lambda: 1.0, min_samples=10**6, max_blocks=2)
    result, state = run_step(keep, harm=1.0)
    assert result.outcome == "inconclusive" and state["applied"] and "too few samples" in result.verdict.reason
    revert = verifier_with(lambda: 1.0, min_samples=10**6, max_blocks=2, on_inconclusive="revert")
    result, state = run_step(revert, harm=1.0)
    assert result.outcome == "reverted" and not state["applied"]


def test_rounds_alternate_and_report_each_round():
    verifier = verifier_with(lambda: 1.0, design="before-after", rounds=3, windows=9)
    result, state = run_step(verifier, harm=3.0)
    assert (state["applies"], state["reverts"]) == (3, 3)  # A B A B A B, then the regression is reverted
    assert [r["round"] for r in result.rounds] == [1, 2, 3]
    assert len(result.before.windows) == 3 * 3  # the settling window after each switch is dropped
    assert result.outcome == "reverted" and not state["applied"]


# Drains, counted from 1: the baseline's window, then each block's window, and a settling drain before
# each block that follows a change of arm. The coin orders the runs, so a drain falls in the baseline
# (1), a block or a settling; a harmless step is kept at block 6 at the soonest, 8 drains and more in
# (runs of two: at least two changes by then), so each of these falls while the step is measured.
@pytest.mark.parametrize("fail_at", [1, 3, 5, 7, 8])
def test_a_probe_failure_at_any_point_leaves_the_step_applied_and_says_so(fail_at):
    verifier = verifier_with(lambda: 1.0, probe=StateProbe(lambda: 1.0, fail_at=fail_at))
    with pytest.raises(ProbeError):
        run_step(verifier, harm=1.0)
    state = {"applied": False}
    verifier._probe.scale_of_state = lambda: 1.0
    with pytest.raises(ProbeError, match="the probe failed"):  # and it is not trusted again
        verifier.verify("next", lambda: state.update(applied=True), lambda: state.update(applied=False))
    assert state["applied"]


@pytest.mark.parametrize("fail_at", [1, 3, 5, 7, 8])
def test_the_agent_reports_a_step_whose_probe_failed_as_applied_and_journals_it_done(fail_at, tree, profile_file,
                                                                                     state_dir):
    agent = Agent(load_plugins(), tree.host, Journal(state_dir))
    profile = load_profile(profile_file("[rt_runtime]\nglobal_runtime_us = 900000\n"))
    step = load_plugins().plan(profile, tree.host)[0]
    verifier = verifier_with(lambda: 1.0, probe=StateProbe(lambda: 1.0, fail_at=fail_at))
    report = agent.writer.apply(0, step, "label", verifier, "")
    assert report.outcome == "applied" and "not verified: the probe failed" in report.reason
    assert "the step is applied" in report.reason
    assert tree.get("/proc/sys/kernel/sched_rt_runtime_us") == "900000"
    assert [r.state for r in Journal(state_dir).records()] == ["done"]


class FakeVerifier:
    """Stands in for a started Verifier inside the agent: applies, then calls the step harmful."""

    notes: list = []

    def __init__(self, keep):
        self.keep = keep

    def verify(self, label, apply, revert):
        from tuned_rl.measure.judge import Verdict
        from tuned_rl.measure.measurement import Measurement, Span
        from tuned_rl.core.verify import StepVerdict
        apply()
        if not self.keep:
            revert()
        verdict = Verdict("regression" if not self.keep else "no regression", 100.0, 300.0, 0.001, "p999 100 -> 300")
        return StepVerdict(self.keep, "kept" if self.keep else "reverted", verdict,
                           Measurement("fake", [Span(0, 1, chunks=[np.array([100_000])])]),
                           Measurement("fake", [Span(1, 2, chunks=[np.array([300_000])])]))


def test_the_agent_undoes_a_reverted_step_and_forgets_its_records(tree, profile_file, state_dir):
    agent = Agent(load_plugins(), tree.host, Journal(state_dir))
    profile = load_profile(profile_file("[rt_runtime]\nglobal_runtime_us = 900000\n"))
    step = load_plugins().plan(profile, tree.host)[0]
    before = tree.snapshot()
    report = agent.writer.apply(0, step, "label", FakeVerifier(keep=False), "")
    assert report.outcome == "reverted" and report.before["p999_us"] == 100 and report.after["p999_us"] == 300
    assert tree.snapshot() == before and Journal(state_dir).records() == []
    report = agent.writer.apply(0, step, "label", FakeVerifier(keep=True), "")
    assert report.outcome == "kept" and tree.get("/proc/sys/kernel/sched_rt_runtime_us") == "900000"
    records = Journal(state_dir).records()
    assert [r.state for r in records] == ["done"] and len(records[0].changes) == 2  # one record per step


def test_a_profile_without_target_is_applied_unverified(tree, cli, profile_file):
    import json
    out = json.loads(cli("apply", profile_file("[rt_runtime]\nglobal_runtime_us = 900000\n"), "--json")[1])
    assert out["steps"][0]["outcome"] == "applied"
    assert out["steps"][0]["reason"] == "not verified: the profile names no [target]"


def test_a_target_that_cannot_be_measured_leaves_steps_applied_not_kept(tree, cli, profile_file):
    import json
    tree.add_process(4242, "llm-server")  # it exists, but no tracefs in this tree can see it
    text = "[target]\npid = 4242\n[verify]\nprobe = \"tracefs\"\n[rt_runtime]\nglobal_runtime_us = 900000\n"
    out = json.loads(cli("apply", profile_file(text), "--json")[1])
    assert out["steps"][0]["outcome"] == "applied" and out["steps"][0]["reason"].startswith("not verified: ")


def test_the_report_shows_what_decided_each_arms_figure_and_the_bound():
    from tuned_rl.core.report import StepReport
    result, _ = run_step(verifier_with(lambda: 1.0), harm=3.0)
    verdict = result.verdict.to_dict()
    assert verdict["rule"] in ("tail regression", "broad regression") and verdict["metric"] == "p999"
    assert verdict["statistic_without_us"] * 2 < verdict["statistic_with_us"]  # the arms' figures, as judged
    assert verdict["effect_lower"] > 1.2 and verdict["effect_upper"] is None and verdict["confidence"] == 0.99
    assert verdict["without_us"] == pytest.approx(result.before.summary().p999_us, rel=0.01)
    step = StepReport("sysctl", "set vm.swappiness", [], result.outcome, result.verdict.reason,
                      *result.figures(), verdict)
    text = "\n".join(" ".join(row) for row in _rows(step))
    assert "latency without -> with the step: p99" in text
    at_look = level_text(verdict["look_level"])
    assert (f"judged on {verdict['statistic']} of each block's waits: " in text and "with the step (geometric means); "
            f"drift allowed for x{verdict['effect']:.3g}, at least x{verdict['effect_lower']:.3g} ({at_look} at this "
            "look)" in text)
    assert verdict["look_level"] > 0.99  # a look spends a share of the 1%
    assert (f"reverted: {verdict['statistic']} worse than the tolerance at 99% (a step within the tolerance is "
            "reverted at most 1% of the time, over every look)") in text


def test_a_kept_step_says_what_harm_it_ruled_out_and_at_what_confidence():
    from tuned_rl.core.report import StepReport
    result, _ = run_step(verifier_with(lambda: 1.0), harm=1.0)
    verdict = result.verdict.to_dict()
    assert result.outcome == "kept" and verdict["harm"] == 4.0 and verdict["confidence"] == 0.95
    assert verdict["effect_upper"] < verdict["harm"]  # the bound a keep needs
    step = StepReport("sysctl", "set vm.swappiness", [], result.outcome, result.verdict.reason,
                      *result.figures(), verdict)
    text = "\n".join(" ".join(row) for row in _rows(step))
    assert (f"kept: {verdict['statistic']} worse than x4 ruled out at 95% (a step that harmful is kept at most 5% "
            "of the time, over every look)") in text or verdict["rule"] == "tail bounded"


def level_text(level):
    from tuned_rl.core.report import level_text
    return level_text(level)


def _rows(step):
    from tuned_rl.core.report import _rows_of
    return _rows_of(step)


@pytest.mark.parametrize("events_per_second, windows", [(16_000, 1), (8_005, 1), (7_890, 1), (6_500, 1),
                                                         (6_000, 2), (1_000, 2), (10, 2)])
def test_a_block_is_one_window_at_the_canarys_rate_whichever_side_of_8000_its_first_window_fell(
        events_per_second, windows):
    # The default canary reads 7,890-8,005 events a second: sized strictly at 4,000 a window, every
    # other apply measured all its steps in 1 s blocks.
    assert VerifySettings().windows_per_block(events_per_second) == windows
    assert VerifySettings(block_windows=3).windows_per_block(events_per_second) == 3


class EveryOtherDrainStalls(StateProbe):
    """With the step in place, every other drain (window) holds eight waits of 5 ms: a stall that
    comes once in two blocks, as a helper spinning once a second does to 0.5 s blocks."""

    def __init__(self, applied):
        super().__init__(lambda: 1.0)
        self.applied = applied

    def drain(self):
        waits = super().drain()
        if self.applied() and self.drains % 2 == 0:
            waits.latencies[:8] = 5_000_000
        return waits


def test_a_stall_every_other_block_is_reverted_over_runs_and_the_report_says_what_was_judged():
    from tuned_rl.core.report import StepReport
    outcomes, rules = [], []
    for seed in range(6):
        state = {"applied": False}
        verifier = verifier_with(lambda: 1.0, probe=EveryOtherDrainStalls(lambda: state["applied"]))
        verifier._order = np.random.default_rng(seed)
        result = verifier.verify("step", lambda: state.update(applied=True), lambda: state.update(applied=False))
        outcomes.append(result.outcome)
        verdict = result.verdict.to_dict()
        rules.append(verdict["rule"])
        assert verdict["run_blocks"] == 2 and state["applied"] == (result.outcome != "reverted")
        if verdict["rule"] == "tail regression over runs":
            assert verdict["unit"] == "run" and verdict["statistic"] == "the slowest 0.1%"
            step = StepReport("lab", "stall", [], result.outcome, result.verdict.reason, *result.figures(), verdict)
            text = "\n".join(" ".join(row) for row in _rows(step))
            assert "judged on the slowest 0.1% of each run's waits (2 blocks of one arm in a row): " in text
            assert "the slowest 0.1% of each run of 2 blocks x" in text
    assert outcomes.count("reverted") == 6 and "tail regression over runs" in rules, (outcomes, rules)


def test_each_look_that_could_keep_but_measured_on_says_in_the_blocks_what_held_the_keep_back():
    held_somewhere = False
    for seed in range(6):
        verifier = verifier_with(lambda: 1.0)
        verifier._order = np.random.default_rng(seed)
        result, _ = run_step(verifier, harm=1.6)  # inside the indifference zone: measured for a while
        looks = verifier.settings.switchback_settings(verifier._per_block)
        held = {b["block"]: b["keep_held_back"] for b in result.blocks if "keep_held_back" in b}
        assert all(looks.looks_at(block) for block in held), held  # only where a look was made
        assert set(held.values()) <= {"tail", "broad", "tail+broad", "run sign", "sign"}, held
        assert result.blocks[-1]["block"] not in held  # the deciding look held nothing back
        held_somewhere |= bool(held)
    assert held_somewhere
