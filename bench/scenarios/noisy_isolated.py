"""Noisy neighbour, isolated: CPU-bound jobs crowd the workload on both CPUs; [cpu_isolation] gives it CPU 1.

The request/response workload (workload.py: a server and four clients waking every
millisecond) runs alone first, and its quiet floor is measured (10 s). Then three CPU-bound
jobs start, unpinned, and a profile naming the workload applies [cpu_isolation]
(latency CPU 1, housekeeping CPU 0) and [irq_isolation], verified. The bar: the step is kept
and the workload's p999 with the step is at most 1.5x the quiet floor of the same run;
after rollback, every IRQ, mask, cpuset and task's cpuset and affinity is as it was.

    sudo .venv/bin/python bench/scenarios/noisy_isolated.py [--runs N]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from lab import (Outcome, apply_profile, hog_command, main_once, main_runs, measure, outcome_of, placement,  # noqa: E402
                 placement_differences, processes, rollback)
from workload import MARKER  # noqa: E402

PROFILE = f"""\
[profile]
name = "lab-noisy-isolated"

[target]
name = "{MARKER}"

[cpu_isolation]
latency_cpus = "1"

[irq_isolation]
latency_cpus = "1"
"""


def workload_command() -> list[str]:
    return [sys.executable, str(Path(__file__).parent / "workload.py"), "--marker", MARKER, "--clients", "4",
            "--period-us", "1000"]


def run(state_dir: Path) -> Outcome:
    original = placement()
    with processes([workload_command()]):
        time.sleep(3)  # past its start-up
        quiet = measure(f"name:{MARKER}", 10, state_dir)
        with processes([hog_command()] * 3):
            time.sleep(1)
            report, seconds = apply_profile(PROFILE, state_dir)
            rollback(state_dir)
    differences = placement_differences(original, placement())
    outcome = outcome_of("noisy, isolated", report, seconds, not differences)
    outcome.quiet_p999_us = quiet["p999_us"]
    outcome.differences = differences
    step = next(s for s in report["steps"] if s["plugin"] == "cpu_isolation")
    outcome.decision, outcome.before_p999_us = step["outcome"], (step.get("before") or {}).get("p999_us")
    outcome.after_p999_us = (step.get("after") or {}).get("p999_us")
    return outcome


def row(result: Outcome) -> str:
    ratio = result.after_p999_us / result.quiet_p999_us if result.after_p999_us and result.quiet_p999_us else None
    return (f"{result.row()}  quiet {result.quiet_p999_us / 1000:.2f} ms, after/quiet "
            f"{'-' if ratio is None else f'{ratio:.2f}x'}"
            + "".join(f"\n  not put back: {d}" for d in (result.differences or [])[:5]))


if __name__ == "__main__":
    main_runs(run, row) if "--runs" in sys.argv else main_once(run, row)
