"""SCHED_FIFO removal, where it helps and where it hurts: the loop must tell them apart.

- ``helps`` (the first field report): the RT-throttling setup. Two SCHED_FIFO actors at 80%
  duty share a cpu cgroup whose RT budget is 500000 of 1000000 us, with the workload (four
  SCHED_FIFO threads waking every 2 ms, waker.py). Throttled, it waits hundreds of
  milliseconds. [sched_fifo] makes its threads SCHED_OTHER at nice -20: never throttled,
  they now wait only behind the actors' 8 ms bursts. Bar: kept, p999 down at least 10x.
- ``hurts``: the same workload, SCHED_FIFO in the root cgroup (RT budget enough), beside
  three CPU-bound jobs. FIFO is what keeps it ahead of them; as SCHED_OTHER it queues behind
  them. Bar: reverted, and its threads are SCHED_FIFO at priority 50 again when apply returns.

    sudo .venv/bin/python bench/scenarios/fifo_removal.py [--variant helps|hurts] [--runs N]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from lab import (CPU, Outcome, apply_profile, cgroup, hog_command, main_once, main_runs,  # noqa: E402
                 outcome_of, processes, rollback, rt_actors)

MARKER = "tuned-rl-lab-fifo-workload"
PROFILE = f'[profile]\nname = "lab-fifo-{{variant}}"\n\n[target]\nname = "{MARKER}"\n\n[sched_fifo]\n'


def waker_command() -> list[str]:
    return [sys.executable, str(Path(__file__).parent / "waker.py"), "--marker", MARKER, "--threads", "4",
            "--period-us", "2000", "--fifo", "50", "--start-after", "0.5"]


def policies(pid: int) -> list[str]:
    """The policy and priority of each waking thread of ``pid`` (its main thread only sleeps)."""
    found = []
    for tid in sorted(int(t) for t in os.listdir(f"/proc/{pid}/task")):
        if tid != pid:
            found.append(f"{os.sched_getscheduler(tid)}:{os.sched_getparam(tid).sched_priority}")
    return found


def run(state_dir: Path, variant: str = "helps") -> Outcome:
    if variant == "helps":
        with cgroup(CPU, "tuned-rl-lab-rt", {"cpu.rt_runtime_us": "500000"}) as directory:
            with rt_actors(directory), \
                    processes([waker_command()], lambda p: (directory / "cgroup.procs").write_text(str(p.pid))) as [w]:
                report, seconds, after_apply = _apply(state_dir, variant, w.pid)
    else:
        with processes([waker_command()]) as [w], processes([hog_command()] * 3):
            report, seconds, after_apply = _apply(state_dir, variant, w.pid)
    result = outcome_of(f"fifo, {variant}", report, seconds, after_apply[1] == after_apply[0])
    result.value_after_apply = " ".join(after_apply[2])
    return result


def _apply(state_dir: Path, variant: str, pid: int) -> tuple[dict, float, tuple]:
    import time
    time.sleep(1.5)  # the threads have started and made themselves SCHED_FIFO
    before = policies(pid)
    report, seconds = apply_profile(PROFILE.format(variant=variant), state_dir)
    after_apply = policies(pid)  # a reverted step put them back
    rollback(state_dir)
    return report, seconds, (before, policies(pid), after_apply)


if __name__ == "__main__":
    variant = sys.argv[sys.argv.index("--variant") + 1] if "--variant" in sys.argv else "helps"
    if "--variant" in sys.argv:
        del sys.argv[sys.argv.index("--variant"):sys.argv.index("--variant") + 2]
    main_runs(lambda state: run(state, variant)) if "--runs" in sys.argv else main_once(lambda state: run(state, variant))
