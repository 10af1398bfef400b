"""SCHED_FIFO removal, where it helps and where it hurts: the loop must tell them apart.

- ``helps`` (the first field report): the RT-throttling setup. Two SCHED_FIFO actors at 80%
  duty share a cpu cgroup whose RT budget is 500000 of 1000000 us, with the workload (four
  SCHED_FIFO threads waking every 2 ms, waker.py). Throttled, it waits hundreds of
  milliseconds. [sched_fifo] makes its threads SCHED_OTHER at nice -20: never throttled,
  they now wait only behind the actors' 8 ms bursts. Bar: kept, p999 down at least 10x.
- ``hurts``: the same workload, SCHED_FIFO in the root cgroup (RT budget enough), on CPU 1
  with three CPU-bound jobs at nice -20 (as important as it by nice). FIFO is what keeps it
  ahead of them; as SCHED_OTHER at nice -20 it shares the CPU with them and waits behind their
  slices. Bar: reverted, and its threads are SCHED_FIFO at priority 50 again when apply returns.
  With the jobs at nice 0 the harm came and went (kernel 6.18's EEVDF mostly lets a nice -20
  waker preempt a nice 0 job at once): unpinned, p999 x1.05 in a fresh clone's CI run, where the
  judge rightly kept the step and the bar failed; pinned to CPU 1, x1.13 in 1 of 3 runs. At
  nice -20 on CPU 1: x62-92 in 4 of 4. Pinned, the jobs leave CPU 0 to the agent (three nice -20
  jobs free to run anywhere starved its judge).

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
# The workload starts at nice -20 too: at nice 0 its interpreter, behind three nice -20 jobs on
# its CPU, had not started its threads 1.5 s later.
ON_CPU_1_AT_NICE_MINUS_20 = ["taskset", "-c", "1", "nice", "-n", "-20"]
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
        with processes([ON_CPU_1_AT_NICE_MINUS_20 + waker_command()]) as [w], \
                processes([ON_CPU_1_AT_NICE_MINUS_20 + hog_command()] * 3):
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
