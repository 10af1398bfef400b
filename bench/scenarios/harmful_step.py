"""A harmful step is reverted: moving the canary's cpuset onto a CPU crowded with hogs.

The canary runs alone on CPU 1 (its cpuset); three CPU hogs at nice -10 are pinned to CPU 0. The lab
plugin's step rewrites the cpuset to CPU 0. tuned-rl sees the canary's p999 jump,
reverts the step, and the cpuset is back on CPU 1.

    sudo .venv/bin/python bench/scenarios/harmful_step.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from lab import (CPUSET, Outcome, apply_profile, cgroup, hog_command, lab_plugin_path,  # noqa: E402
                 main_once, outcome_of, processes, rollback)

NAME = "tuned-rl-lab-cpuset"
PROFILE = """\
[profile]
name = "lab-harmful"

[target]
canary = true
canary_cgroup = "{directory}"

[lab_write]
path = "{directory}/cpuset.cpus"
value = "0"
title = "move the canary's cpuset onto CPU 0 (where the hogs are)"
"""


def pin_to_cpu0_at_nice_minus_10(process) -> None:
    # An offline job started at high priority: the canary's wakeups wait behind it.
    os.sched_setaffinity(process.pid, {0})
    os.setpriority(os.PRIO_PROCESS, process.pid, -10)


def run(state_dir: Path) -> Outcome:
    with lab_plugin_path() as plugin_path, \
            cgroup(CPUSET, NAME, {"cpuset.mems": "0", "cpuset.cpus": "1"}) as directory, \
            processes([hog_command()] * 3, pin_to_cpu0_at_nice_minus_10):
        report, seconds = apply_profile(PROFILE.format(directory=directory), state_dir, plugin_path)
        after_apply = (directory / "cpuset.cpus").read_text().strip()  # a reverted step put it back itself
        rollback(state_dir)
        restored = (directory / "cpuset.cpus").read_text().strip() == "1"
    result = outcome_of("harmful step", report, seconds, restored)
    result.value_after_apply = after_apply
    return result


if __name__ == "__main__":
    main_once(run)
