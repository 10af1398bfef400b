"""Late workload: isolation applied at provisioning, before the workload exists; `tuned-rl watch`
places the workload when it starts and verifies the deferred step on it.

Three CPU-bound neighbours run (no table names them). The profile ([cpu_isolation], latency CPU
1) is applied while the workload does not run: its step is deferred. `tuned-rl watch --json`
starts, then the request/response workload (workload.py). The run records how long after the
workload's start it was in the workload's cpuset (from /proc), and what watch said of the
deferred step (kept, reverted, inconclusive). Then the workload is measured with the neighbours
running (isolated, 8 s), the profile rolled back, the neighbours stopped (SIGSTOP), and the
workload measured again alone on both CPUs: the quiet floor of the same run. Every task's
placement is compared with the start.

    sudo .venv/bin/python bench/scenarios/late_workload.py [--runs N]
"""

from __future__ import annotations

import os
import signal
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from lab import (apply_profile, hog_command, measure, placement, placement_differences, processes,  # noqa: E402
                 rollback, runs, start_watch, wait_for)
from noisy_neighbour import workload_command  # noqa: E402
from workload import MARKER  # noqa: E402

PROFILE = f"""\
[profile]
name = "lab-late-workload"

[target]
name = "{MARKER}"

[cpu_isolation]
latency_cpus = "1"
"""


@dataclass
class LateWorkload:
    placed_after_s: float | None = None  # from the workload's start to its being in the workload's cpuset
    outcome: str = ""
    reason: str = ""
    isolated_p999_us: float = 0.0
    quiet_p999_us: float = 0.0
    differences: list[str] = field(default_factory=list)
    watch_exit: int | None = None
    events: list[dict] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return self.isolated_p999_us / self.quiet_p999_us if self.quiet_p999_us else float("inf")

    def row(self) -> str:
        placed = "-" if self.placed_after_s is None else f"{self.placed_after_s:.2f} s"
        floor = (f"p999 isolated beside the neighbours {self.isolated_p999_us / 1000:.3f} ms, quiet on both CPUs "
                 f"{self.quiet_p999_us / 1000:.3f} ms (x{self.ratio:.2f})" if self.quiet_p999_us else "p999 not measured")
        return (f"late workload: placed after {placed}; deferred step {self.outcome}; {floor}; put back "
                f"{'yes' if not self.differences else 'NO'}; watch exit {self.watch_exit}"
                + "".join(f"\n  not put back: {d}" for d in self.differences[:5]))


def cpuset_of(pid: int) -> str:
    return next(line.rsplit(":", 1)[1].strip() for line in open(f"/proc/{pid}/cgroup") if line.split(":")[1] == "cpuset")


def run(state_dir: Path, measure_floor: bool = True) -> LateWorkload:
    """One run; ``measure_floor`` False leaves out the two 8 s measurements (isolated beside the
    neighbours, then quiet): the kernel test asserts what watch does, the bench the p999."""
    result = LateWorkload()
    original = placement()
    with processes([hog_command()] * 3, kill_children=True) as neighbours:
        time.sleep(0.5)
        report, _ = apply_profile(PROFILE, state_dir)
        assert report["steps"][0]["outcome"] == "skipped", report
        watch = start_watch(state_dir, result.events)
        try:
            with processes([workload_command()]) as (workload,):
                began = time.monotonic()
                wait_for(lambda: cpuset_of(workload.pid) == "/tuned-rl-workload", 10, "the workload's placement")
                result.placed_after_s = time.monotonic() - began
                wait_for(lambda: any(e["event"] == "verified" for e in result.events), 300, "the deferred verdict")
                verdict = next(e for e in result.events if e["event"] == "verified")
                result.outcome, result.reason = verdict["outcome"], verdict.get("reason", "")
                if measure_floor:
                    result.isolated_p999_us = measure(f"name:{MARKER}", 8, state_dir)["p999_us"]
                watch.send_signal(signal.SIGTERM)
                result.watch_exit = watch.wait(timeout=10)
                rollback(state_dir)
                if measure_floor:
                    for neighbour in neighbours:
                        os.kill(neighbour.pid, signal.SIGSTOP)
                    time.sleep(0.5)
                    result.quiet_p999_us = measure(f"name:{MARKER}", 8, state_dir)["p999_us"]
        finally:
            if watch.poll() is None:
                watch.kill()
                watch.wait()
            rollback(state_dir)
    result.differences = placement_differences(original, placement())
    return result


def main() -> None:
    results = runs(run, __doc__.splitlines()[0])
    outcomes = [r.outcome for r in results]
    print(f"{len(results)} runs: " + ", ".join(f"{o} {outcomes.count(o)}" for o in sorted(set(outcomes)))
          + f"; placed after median {statistics.median(r.placed_after_s or 0 for r in results):.2f} s; isolated/quiet "
          f"median x{statistics.median(r.ratio for r in results):.2f}; put back {sum(not r.differences for r in results)}")


if __name__ == "__main__":
    main()
