"""A harmful cpuset move is reverted: a workload isolated onto fewer CPUs than it needs.

The request/response workload (workload.py: a server and four clients waking every
millisecond) runs with a CPU-bound part of its own (a "learner" whose command line carries
the workload's marker, so `[target] name` takes it in too, and which runs at nice -10, as a
trainer given priority over its own clients does), each pinned by the application as it would
be: the learner on CPU 0, the server and clients on CPU 1, which they have to themselves. The profile, as if written for a node with more CPUs, isolates the workload onto
CPU 1 ([cpu_isolation], latency CPU 1): the workload's cpuset overrides the learner's pin, the
learner joins the clients on CPU 1, and every wake-up waits behind its slice. tuned-rl sees
the workload's p999 jump and reverts the step (the cpusets it made removed, every task back
where it was, the learner on CPU 0) before `apply` returns; the placement is compared task by
task with the start then, and again after rollback.

Why nice -10: at nice 0 the learner shares CPU 1 fairly, every wake-up waits at most about a
slice, and the p999 rose only x1.5-1.7 on this VM's 1.1-2.2 ms baseline of 2026-12-07 (the
slowest 5% about x2): inside the judge's zone between the 20% tolerance and the harm a keep
rules out, where either verdict is allowed, and kept in 3 of 15 runs. At nice -10 the slowest
5% rises x5-7 (docs/lab.md). `run(state, learner_nice=0)` runs the old shape.

    sudo .venv/bin/python bench/scenarios/harmful_cpuset.py [--runs 20]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from lab import Outcome, apply_profile, main_once, main_runs, outcome_of, placement, placement_differences, processes, rollback  # noqa: E402
from noisy_neighbour import workload_command  # noqa: E402
from workload import MARKER  # noqa: E402

PROFILE = f"""[profile]
name = "lab-harmful-cpuset"

[target]
name = "{MARKER}"

[cpu_isolation]
latency_cpus = "1"
"""


LEARNER_NICE = -10


def learner_command(nice: int = LEARNER_NICE) -> list[str]:
    """The workload's own CPU-bound part, pinned to CPU 0: its command line names the workload."""
    return ["nice", "-n", str(nice), "taskset", "-c", "0", sys.executable, "-c", "while True: pass",
            f"{MARKER}-learner"]


def run(state_dir: Path, learner_nice: int = LEARNER_NICE) -> Outcome:
    original = placement()
    with processes([["taskset", "-c", "1", *workload_command()], learner_command(learner_nice)]):
        time.sleep(2)  # past its start-up
        report, seconds = apply_profile(PROFILE, state_dir)
        after_apply = placement()
        rollback(state_dir)
    differences = placement_differences(original, placement())
    if report["steps"][-1]["outcome"] == "reverted":  # put back before apply returned, not by the rollback
        differences += [f"when apply returned: {d}" for d in placement_differences(original, after_apply)]
    outcome = outcome_of("harmful cpuset", report, seconds, not differences)
    outcome.differences = differences
    return outcome


def row(result: Outcome) -> str:
    return result.row() + "".join(f"\n  not put back: {d}" for d in (result.differences or [])[:5])


if __name__ == "__main__":
    main_runs(run, row) if "--runs" in sys.argv else main_once(run, row)
