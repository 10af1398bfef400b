"""The scenario lab as kernel tests: RT throttling kept, a harmful budget cut, rare stalls and a harmful cpuset move reverted, a harmless sysctl kept."""


from __future__ import annotations
import os
import sys
from pathlib import Path

import pytest

from tuned_rl.host import Host
from tuned_rl.measure.probes import BpfProbe

sys.path.insert(0, str(Path(__file__).parent.parent.parent / "bench" / "scenarios"))
import drifting_target  # noqa: E402
import harmful_cpuset  # noqa: E402
import harmful_step  # noqa: E402
import harmless_step  # noqa: E402
import rare_stalls  # noqa: E402
import rt_throttling  # noqa: E402

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or BpfProbe.obstacles(Host(), True) != [],
                                reason="needs root and a working BPF probe")


def test_raising_a_throttled_cgroups_rt_budget_is_kept_and_p999_falls_tenfold(tmp_path):
    result = rt_throttling.run(tmp_path)
    step = result.report["steps"][-1]
    print(result.row())
    assert step["outcome"] == "kept", step["reason"]
    assert step["changes"][-1]["before"] == "500000" and step["changes"][-1]["after"] == "950000"
    assert step["before"]["n"] >= 2000 and step["after"]["n"] >= 2000
    assert result.after_p999_us <= result.before_p999_us / 10
    assert result.before_p999_us > 100_000  # throttled for hundreds of milliseconds
    assert result.seconds < 120 and result.host_restored


def test_a_harmful_step_is_reverted_and_its_value_is_back(tmp_path):
    result = harmful_step.run(tmp_path)
    step = result.report["steps"][-1]
    print(result.row())
    assert step["outcome"] == "reverted", step["reason"]
    assert step["changes"][-1]["before"] == "950000" and step["changes"][-1]["after"] == "500000"
    # A budget that throttles the workload can starve it of waits in the arm with the step: that
    # rule decides on the event count, with no p-value (one fresh-clone run: 0.14 -> 553.65 ms).
    verdict = step["verdict"]
    assert verdict["rule"] == "starved" or verdict["p_value"] < 0.01, verdict
    assert result.after_p999_us > 1.2 * result.before_p999_us
    assert result.value_after_apply == "950000"  # back when apply returned, before any rollback
    assert result.seconds < 120 and result.host_restored


@pytest.mark.parametrize("target", ["canary", "workload"])
def test_a_step_that_adds_rare_stalls_is_reverted_on_what_the_slowest_tenth_of_a_percent_shows(target, tmp_path):
    # A third-party plugin's step makes a SCHED_IDLE helper on the target's CPU SCHED_FIFO; it spins
    # 5 ms every 0.5 s: a few waits a second milliseconds long, the p99 hardly moved. Reverted in 20
    # of 20 bench runs on either target (rare_stalls.py --runs 20). One fresh CI machine kept it
    # once, on the workload, at the first look that may keep: a p999 of 1.80 ms without the step
    # and 1.28 ms with it, the stall not in the step's arm at all. So a keep is followed by a second
    # run that first measures the step's effect by hand (printed), and that run must revert.
    results = [rare_stalls.run(tmp_path / "1", target)]
    if results[0].decision != "reverted":
        results.append(rare_stalls.run(tmp_path / "2", target, show_effect=True))
    for result in results:
        print(result.row(), result.report["steps"][-1]["reason"], *(result.differences or []))
        assert result.host_restored
    result = results[-1]
    step = result.report["steps"][-1]
    assert step["plugin"] == "lab_stall" and step["outcome"] == "reverted", step["reason"]
    verdict = step["verdict"]
    # Here the slowest 0.1% decides, over blocks or over runs of two; on a noisier machine (a fresh CI
    # one: a quiet canary's p999 of 0.35 ms, the hypervisor stealing 100-300 ms) its blocks scatter
    # more and the slowest 5% can be significant first, and a broad regression is called only when
    # the slowest 0.1% agrees (x10.9 there). The report's per-arm figures are the deciding
    # statistic's: the slowest 0.1% rose x7.8-10 here, x1.97 under bench/host_noise.py, whose own
    # stalls of up to 2.5 ms fill the tail without the step; a broad regression's slowest 5% rose
    # beyond the 20% tolerance.
    assert verdict["rule"] in ("tail regression", "tail regression over runs", "broad regression"), verdict
    if verdict["rule"] != "broad regression":
        assert verdict["statistic"] == "the slowest 0.1%" and verdict["effect_lower"] > 1.2
        assert verdict["statistic_with_us"] > 1.5 * verdict["statistic_without_us"]
    else:
        assert verdict["statistic_with_us"] > 1.2 * verdict["statistic_without_us"]
    assert result.value_after_apply == "SCHED_IDLE" and result.host_restored  # put back before apply returned
    assert result.seconds < 120


def test_isolating_a_workload_onto_too_few_cpus_is_reverted_and_every_task_is_back(tmp_path):
    # The workload's learner (at nice -10) and its clients squeezed onto one CPU: a cpuset move
    # that hurts, the slowest 5% x5-7 on a 1.5-2.2 ms baseline. Reverted in 17 of 17 bench runs
    # (2026-12-07); at nice 0 it hurt only x1.5 on p999, a harm the judge may keep, and was kept in
    # 3 of 15 and in one CI run twice. A second run still decides before the test calls it a failure.
    results = [harmful_cpuset.run(tmp_path / "1")]
    if results[0].decision != "reverted":
        results.append(harmful_cpuset.run(tmp_path / "2"))
    for result in results:
        print(harmful_cpuset.row(result))
        assert result.host_restored, result.differences  # as found once apply returned (reverted), and after rollback
        assert result.seconds < 120
    step = results[-1].report["steps"][-1]
    assert step["plugin"] == "cpu_isolation" and step["outcome"] == "reverted", step["reason"]
    # The figures that decided show it: each arm's figure of the deciding statistic (the pooled p999 of
    # a run rests on a few waits: one CI run with a busy neighbour read 2.95 -> 3.60 ms pooled).
    verdict = step["verdict"]
    assert verdict["rule"] == "starved" or verdict["statistic_with_us"] > 1.2 * verdict["statistic_without_us"], \
        verdict


def test_a_harmless_step_is_not_reverted(tmp_path):
    # What the user must never meet: a harmless step reverted (a false regression, ~1% of harmless
    # steps; a second run decides before the test calls it a failure). Whether the judge stops
    # early ("kept") or measures to the last block ("inconclusive", kept by on_inconclusive) is how
    # noisy the host is: 5 of 20 inconclusive in a noisy hour (docs/judge.md), 5 of 15 on
    # 2026-12-02 here, when CI met two in a row; the bench counts it (harmless_step.py --runs 20).
    results = [harmless_step.run(tmp_path / "1")]
    if results[0].decision == "reverted":
        results.append(harmless_step.run(tmp_path / "2"))
    for result in results:
        print(result.row())
        assert result.seconds < 120 and result.host_restored
    step = results[-1].report["steps"][-1]
    assert results[-1].decision in ("kept", "inconclusive"), step["reason"]
    if results[-1].decision == "inconclusive":  # it says what it could not rule out, and that it kept the step
        assert "cannot be ruled out" in step["reason"] and "kept (on_inconclusive = keep)" in step["reason"], step
    blocks = step["blocks"]  # the switchback verdict: runs of two blocks of one arm, pairs of runs AB or BA
    runs = [blocks[i:i + 2] for i in range(0, len(blocks) - 1, 2)]
    assert len(blocks) >= 2 and all(a["with_step"] == b["with_step"] for a, b in runs), blocks
    assert all(x[0]["with_step"] != y[0]["with_step"] for x, y in zip(runs[::2], runs[1::2])), blocks
    arms = [False] + [b["with_step"] for b in blocks]  # a change made only where the arm changes
    assert [b["after_change"] for b in blocks] == [x != y for x, y in zip(arms, arms[1:])]
    assert all(b["n"] > 0 for b in blocks) and step["verdict"]["windows"] >= 1 + len(blocks)
    assert step["verdict"]["without_us"] > 0 and step["verdict"]["with_us"] > 0  # the figures that decided


def test_a_three_step_profile_is_verified_step_by_step_and_inconclusive_only_at_the_last_block(tmp_path):
    # How long five steps take is a bench figure (five_steps.py; docs/judge.md: 53-113 s, median 62 s,
    # in noisy hours, when harmless steps run to the last block and are reported inconclusive);
    # three, with `[verify] max_blocks = 12` (the profile's own budget, honoured), show the same
    # here in the time CI has (three harmless steps at 24 blocks took 73 s in one fresh-clone run).
    # Each step judged on its own switchback blocks,
    # none of these harmless steps reverted (one allowed: one of 75 harmless steps in the lab runs
    # was a false regression, 0.1% in simulation), a step not decided before the last block said
    # to be inconclusive and no other, and everything put back. (How often the sequential stop
    # comes before the last block is the bench's: harmless_step.py --runs 20, five_steps.py.)
    import five_steps
    report, seconds, restored = five_steps.run(tmp_path, steps=3, max_blocks=12)
    outcomes = [s["outcome"] for s in report["steps"]]
    print(f"{seconds:.1f} s", outcomes, [s["verdict"]["blocks"] for s in report["steps"]])
    assert len(outcomes) == 3 and set(outcomes) <= {"kept", "reverted", "inconclusive"}
    assert outcomes.count("reverted") <= 1
    assert all(len(s["blocks"]) >= 2 for s in report["steps"])
    blocks = [s["verdict"]["blocks"] for s in report["steps"]]
    assert all(b <= 12 for b in blocks), blocks
    assert all(b == 12 for b, o in zip(blocks, outcomes) if o == "inconclusive"), (outcomes, blocks)
    assert seconds < 3 * 25 and restored  # three steps at their budget (9 s of measuring each)


@pytest.mark.parametrize("variant", ["start", "ramp"])
def test_a_harmless_step_on_a_drifting_live_workload_is_not_reverted(variant, tmp_path):
    # The bar is at most 1 revert in 20 runs (bench: drifting_target.py --runs 20); a second
    # run decides before one revert fails CI.
    results = [drifting_target.run(tmp_path / "1", variant)]
    if results[0].decision == "reverted":
        results.append(drifting_target.run(tmp_path / "2", variant))
    for result in results:
        print(result.row(), result.report["steps"][-1]["reason"])
        # The workload's ~6,400 events a second make 1 s blocks: up to 60 of them (61 s of measuring
        # to the last block, 76 s an apply, in one fresh-clone run), twice the canary's budget.
        assert result.host_restored and result.seconds < 100
    step = results[-1].report["steps"][-1]
    assert results[-1].decision in ("kept", "inconclusive"), step["reason"]
    # The profile names the workload and has no canary: these events are the workload's own.
    assert step["before"]["n"] >= 2000 and step["after"]["n"] >= 2000


@pytest.mark.skipif(Host().online_cpus() != {0, 1} or not Path("/sys/fs/cgroup/cpuset/cpuset.cpus").exists(),
                    reason="the noisy-neighbour scenarios are written for this 2-CPU host with a v1 cpuset")
@pytest.mark.parametrize("variant", ["isolate", "evict", "evict-isolate"])
def test_a_noisy_neighbour_is_moved_away_kept_and_put_back(variant, tmp_path):
    import noisy_neighbour
    from lab import near_floor

    def meets_bar(result) -> bool:
        if variant == "evict":
            # The jobs' share gone, as the judge saw it in alternating blocks (drift allowed for):
            # x0.04-0.15 on the slowest 0.1% here, x0.46-0.61 under bench/host_noise.py's CI-like
            # noise, x0.54 on a fresh CI machine, where the pooled p999 fell only 1.5-2.6x because
            # the host's own stalls stay on the jobs' busy CPU, which the workload still wakes on.
            return (result.placement_verdict["effect"] <= 0.75
                    and result.before_p999_us >= 1.25 * result.after_p999_us)
        # Isolation: back at the quiet floor of the same run (here 0.6-1.2x of 0.04-0.1 ms; under
        # CI-like noise 0.9-1.1x of about 1.9 ms).
        return near_floor(result.after_p999_us, result.quiet_p999_us, 1.5)

    # A second run decides before a moment of the VM's host fails the test. For "evict-isolate" the
    # judged step, eviction after isolation, changes little for the workload, already alone on its
    # CPU (here x0.92-1.42, kept in 2.5-6.5 s of measuring, 5 of 5): the judge may end such a step
    # inconclusive on a noisy host (at most 5% of harmless steps; a fresh CI machine: 47 s of
    # measuring, "x2.21"), never reverted. A revert fails at once; an inconclusive run is run again.
    for attempt in range(2):
        result = noisy_neighbour.run(tmp_path / str(attempt), variant)
        print(noisy_neighbour.row(result))
        assert result.host_restored, result.differences
        assert result.decision in ("kept", "inconclusive"), result.report
        if result.decision == "kept" and meets_bar(result):
            return
    assert result.decision == "kept", result.report
    assert meets_bar(result)


def test_fifo_removal_is_kept_where_the_rt_budget_throttles_the_workload(tmp_path):
    import fifo_removal
    result = fifo_removal.run(tmp_path, "helps")
    print(result.row())
    assert result.decision == "kept", result.report["steps"][-1]["reason"]
    assert result.after_p999_us * 10 <= result.before_p999_us and result.host_restored


def test_fifo_removal_is_reverted_where_fifo_kept_the_workload_ahead_of_cpu_hogs(tmp_path):
    import fifo_removal
    result = fifo_removal.run(tmp_path, "hurts")
    print(result.row())
    assert result.decision == "reverted", result.report["steps"][-1]["reason"]
    assert result.value_after_apply == " ".join([f"{os.SCHED_FIFO}:50"] * 4)  # FIFO again when apply returned
    assert result.host_restored
