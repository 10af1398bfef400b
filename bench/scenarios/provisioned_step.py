"""Provisioned step: a step applied before the workload exists is verified by `tuned-rl watch`
when the workload starts, and reverted there if it hurts.

At provisioning `apply` has no workload to measure: it applies the step unverified and says that
watch verifies it. Two steps, one at a time:

- ``harmful``: the lab's third-party plugin ([lab_stall]) makes a helper pinned to CPU 1
  SCHED_FIFO; it spins 10 ms every 0.25 s (4% of the CPU: the p99 hardly moves, the p999 does).
  Not 5 ms every 0.5 s: the workload wakes about 8,000 times a second on 5 threads, so a stall
  that rare delays about 0.13% of its waits, at the edge of the slowest 0.1%, and was sometimes
  kept (the alternation's figures: docs/watch.md). `--spin-ms 5 --every-s 0.5` runs that shape.
- ``harmless``: [sysctl] vm.stat_interval = 10 (per-CPU VM statistics folded every 10 s, not 1).

`tuned-rl watch --json` starts, then the request/response workload (workload.py) pinned to CPU
1. The run records what watch made of the step (kept, reverted, inconclusive), on how many of
the workload's waits, how long after its start, and whether the host was put back by rollback.

    sudo .venv/bin/python bench/scenarios/provisioned_step.py [--step harmful|harmless] [--runs N]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from lab import apply_profile, processes, rollback, start_watch, wait_for  # noqa: E402
from rare_stalls import helper_command, workload_command  # noqa: E402
from workload import MARKER  # noqa: E402

STEPS = {
    "harmful": '[lab_stall]\npid = {pid}\npolicy = "SCHED_FIFO:10"\n',
    "harmless": '[sysctl]\n"vm.stat_interval" = 10\n',
}
PROFILE = f"""\
[profile]
name = "lab-provisioned-step"

[target]
name = "{MARKER}"

"""
STAT_INTERVAL = Path("/proc/sys/vm/stat_interval")
HELPER_SPIN_MS, HELPER_EVERY_S = 10.0, 0.25


@dataclass
class Provisioned:
    step: str
    applied_reason: str = ""  # what apply said of the step
    outcome: str = ""  # what watch made of it
    reason: str = ""
    samples: tuple = (0, 0)
    p999_us: tuple = (0.0, 0.0)
    verified_after_s: float | None = None  # from the workload's start to watch's verdict
    value_after_verdict: str = ""
    restored: bool = False
    watch_exit: int | None = None
    events: list[dict] = field(default_factory=list)

    def row(self) -> str:
        after = "-" if self.verified_after_s is None else f"{self.verified_after_s:.1f} s"
        return (f"provisioned {self.step}: {self.outcome} by watch {after} after the workload started, on "
                f"{self.samples[0]} / {self.samples[1]} waits, p999 {self.p999_us[0] / 1000:.2f} -> "
                f"{self.p999_us[1] / 1000:.2f} ms; then {self.value_after_verdict}; put back "
                f"{'yes' if self.restored else 'NO'}; watch exit {self.watch_exit}")


def policy_name(pid: int) -> str:
    policy = os.sched_getscheduler(pid)
    return {os.SCHED_IDLE: "SCHED_IDLE", os.SCHED_FIFO: "SCHED_FIFO", os.SCHED_OTHER: "SCHED_OTHER"}.get(policy,
                                                                                                       str(policy))


def run(state_dir: Path, step: str = "harmful", spin_ms: float = HELPER_SPIN_MS,
        every_s: float = HELPER_EVERY_S) -> Provisioned:
    result = Provisioned(step)
    stat_interval = STAT_INTERVAL.read_text().strip()
    with processes([helper_command(spin_ms, every_s, 1)]) as (helper,):
        time.sleep(0.3)
        report, _ = apply_profile(PROFILE + STEPS[step].format(pid=helper.pid), state_dir, lab_plugin=True)
        [applied] = report["steps"]
        assert applied["outcome"] == "applied" and "before" not in applied, applied
        result.applied_reason = applied["reason"]
        watch = start_watch(state_dir, result.events, lab_plugin=True, args=("--warm-up-seconds", "2"))
        try:
            with processes([workload_command(1)]):
                began = time.monotonic()
                wait_for(lambda: any(e["event"] == "verified" for e in result.events) or watch.poll() is not None,
                         300, "watch's verdict")
                result.verified_after_s = time.monotonic() - began
                verdict = next((e for e in result.events if e["event"] == "verified"), {})
                result.outcome, result.reason = verdict.get("outcome", "none"), verdict.get("reason", "")
                result.samples = (verdict.get("samples_without", 0), verdict.get("samples_with", 0))
                result.p999_us = (verdict.get("p999_without_us", 0.0), verdict.get("p999_with_us", 0.0))
                result.value_after_verdict = (f"helper {policy_name(helper.pid)}" if step == "harmful" else
                                              f"vm.stat_interval {STAT_INTERVAL.read_text().strip()}")
                watch.send_signal(signal.SIGTERM)
                result.watch_exit = watch.wait(timeout=10)
        finally:
            if watch.poll() is None:
                watch.kill()
                watch.wait()
            rollback(state_dir)
        result.restored = (policy_name(helper.pid) == "SCHED_IDLE"
                           and STAT_INTERVAL.read_text().strip() == stat_interval)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--step", choices=sorted(STEPS), default="harmful")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--spin-ms", type=float, default=HELPER_SPIN_MS, help="the helper's spin")
    parser.add_argument("--every-s", type=float, default=HELPER_EVERY_S, help="the helper spins this often")
    args = parser.parse_args()
    results = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as state:
            results.append(run(Path(state), args.step, args.spin_ms, args.every_s))
        print(results[-1].row(), flush=True)
        print(f"  {results[-1].reason}", flush=True)
    outcomes = [r.outcome for r in results]
    print(f"{len(results)} runs: " + ", ".join(f"{o} {outcomes.count(o)}" for o in sorted(set(outcomes)))
          + f"; verdict median {statistics.median(r.verified_after_s or 0 for r in results):.1f} s after the workload "
          f"started; put back {sum(r.restored for r in results)}")


if __name__ == "__main__":
    main()
