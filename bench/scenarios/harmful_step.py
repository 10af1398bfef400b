"""A harmful step is reverted: an RT budget lowered below what the group's FIFO actors use.

The RT-throttling scenario the other way round: two SCHED_FIFO actors at 80% duty and
a FIFO canary share a cpu cgroup with a budget of 950000 us a second, which they fit in.
The profile (one copied from a node whose actors needed less) sets 500000; the group is
then throttled for half of every second and the canary waits hundreds of milliseconds.
tuned-rl sees the canary's p999 jump, reverts the step, and the budget is 950000 again
before `apply` returns.

    sudo .venv/bin/python bench/scenarios/harmful_step.py [--runs 20 [--verify harm=4]]
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from lab import Outcome, main_once, main_runs  # noqa: E402
from rt_throttling import run_budget_change  # noqa: E402


def run(state_dir: Path, verify: Sequence[str] = ()) -> Outcome:
    return run_budget_change(state_dir, "harmful step", 950000, 500000, verify)


if __name__ == "__main__":
    main_runs(run, verify=True) if "--runs" in sys.argv else main_once(run)
