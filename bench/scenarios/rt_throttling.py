"""RT throttling (the first field report): raising a cgroup's cpu.rt_runtime_us is kept, p999 falls.

Two SCHED_FIFO actors at 80% duty share a cpu cgroup whose RT budget is 500000 of
1000000 us: the group is throttled for about half of every second, and the FIFO
canary in it waits up to hundreds of milliseconds. The profile raises the budget
to 950000; tuned-rl measures before and after and keeps the step.

    sudo .venv/bin/python bench/scenarios/rt_throttling.py [--runs 20 [--verify harm=4]]
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from lab import (CPU, Outcome, apply_profile, cgroup, main_once, main_runs, outcome_of, rollback,  # noqa: E402
                 rt_actors, verify_table)

NAME = "tuned-rl-lab-rt"
PROFILE = """\
[profile]
name = "lab-{scenario}"

[target]
# Four threads waking every 2 ms: 2,000 events a second, of which a
# throttled second holds a few of hundreds of milliseconds, inside the p999.
canary = true
canary_period_us = 2000
canary_threads = 4
canary_cgroup = "{directory}"
canary_policy = "SCHED_FIFO"
canary_priority = 50

[rt_runtime]
cgroup = "{name}"
cgroup_runtime_us = {runtime}
"""


def run_budget_change(state_dir: Path, scenario: str, start: int, runtime: int,
                      verify: Sequence[str] = ()) -> Outcome:
    """FIFO actors at 80% duty in a cgroup with RT budget ``start``; the profile sets ``runtime``
    (``verify``: [verify] settings for it)."""
    with cgroup(CPU, NAME, {"cpu.rt_runtime_us": str(start)}) as directory:
        with rt_actors(directory):
            text = PROFILE.format(directory=directory, name=NAME, runtime=runtime, scenario=scenario.replace(" ", "-"))
            text += verify_table(verify)
            report, seconds = apply_profile(text, state_dir)
            after_apply = (directory / "cpu.rt_runtime_us").read_text().strip()  # a reverted step put it back
            rollback(state_dir)
            restored = (directory / "cpu.rt_runtime_us").read_text().strip() == str(start)
    result = outcome_of(scenario, report, seconds, restored)
    result.value_after_apply = after_apply
    return result


def run(state_dir: Path, verify: Sequence[str] = ()) -> Outcome:
    return run_budget_change(state_dir, "rt throttling", 500000, 950000, verify)


if __name__ == "__main__":
    main_runs(run, verify=True) if "--runs" in sys.argv else main_once(run)
