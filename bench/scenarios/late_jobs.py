"""Late jobs: the offline jobs start after the apply, and `tuned-rl watch` evicts them as they start.

The request/response workload runs (workload.py); a profile like the one TuneD's daemon was
measured with in this scenario (the workload to CPU 1, the jobs to CPU 0 at a background policy):
[cpu_isolation] with latency CPU 1 and [offline_eviction] of the jobs, matched by command line,
at SCHED_IDLE. It is applied while no job exists: the isolation step is verified on the
workload, the eviction step skipped.
Then `tuned-rl watch --json` starts, and three CPU-bound jobs start, each forking a child at
once that execs a busy shell loop (a command line no matcher names: it is moved because its
parent was, having been forked before the move). The run checks that every job and child is in
the offline cgroup at SCHED_IDLE, records each one's reaction time (exec to evicted, from
watch's events), then measures the workload in alternating windows with the jobs stopped
(SIGSTOP: the quiet floor) and running, and compares the medians of the windows' p999. watch
is stopped (SIGTERM: the tuning stays), rollback puts every job and child back where it was
(cgroups and policy, checked before they are killed), and every other task's placement is
compared with the start.

    sudo .venv/bin/python bench/scenarios/late_jobs.py [--runs N]
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
from lab import (OFFLINE_JOB, apply_profile, measure, placement, placement_differences, processes,  # noqa: E402
                 rollback, runs, start_watch, wait_for)
from noisy_neighbour import workload_command  # noqa: E402
from workload import MARKER  # noqa: E402

PROFILE = f"""\
[profile]
name = "lab-late-jobs"

[target]
name = "{MARKER}"

[cpu_isolation]
latency_cpus = "1"

[offline_eviction]
policy = "SCHED_IDLE"

[[offline_eviction.match]]
cmdline = "{OFFLINE_JOB}"
"""
JOB = ("import os\nif os.fork() == 0:\n    os.execvp('sh', ['sh', '-c', 'while :; do :; done'])\n"
       "while True:\n    pass\n")
WINDOWS = 4  # pairs of quiet and loaded windows
WINDOW_S = 2.0


@dataclass
class LateJobs:
    """What one run showed."""

    placed: bool = False  # every job and child in the offline cgroup at SCHED_IDLE
    reaction_ms: list[float] = field(default_factory=list)
    quiet_p999_us: float = 0.0
    loaded_p999_us: float = 0.0
    put_back: bool = False  # rollback returned every late process to its cgroups and policy
    differences: list[str] = field(default_factory=list)
    watch_exit: int | None = None
    events: list[dict] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return self.loaded_p999_us / self.quiet_p999_us if self.quiet_p999_us else float("inf")

    def row(self) -> str:
        reaction = f"{statistics.median(self.reaction_ms):.1f} ms median" if self.reaction_ms else "-"
        floor = (f"p999 quiet {self.quiet_p999_us / 1000:.3f} ms, jobs running {self.loaded_p999_us / 1000:.3f} ms "
                 f"(x{self.ratio:.2f})" if self.quiet_p999_us else "p999 not measured")
        return (f"late jobs: placed {'yes' if self.placed else 'NO'}; reaction {reaction}; {floor}; put back "
                f"{'yes' if self.put_back else 'NO'}; watch exit {self.watch_exit}"
                + "".join(f"\n  not put back: {d}" for d in self.differences[:5]))


def where(pid: int) -> tuple[str, str, str]:
    """(cpu cgroup, cpuset, policy) of a process now."""
    groups = dict(line.strip().split(":", 2)[1:] for line in open(f"/proc/{pid}/cgroup"))
    return groups.get("cpu,cpuacct", groups.get("cpu", "")), groups.get("cpuset", ""), _policy(pid)


def _policy(pid: int) -> str:
    return {os.SCHED_OTHER: "SCHED_OTHER", os.SCHED_IDLE: "SCHED_IDLE", os.SCHED_BATCH: "SCHED_BATCH"}.get(
        os.sched_getscheduler(pid), str(os.sched_getscheduler(pid)))


def children_of(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def run(state_dir: Path, measure_floor: bool = True) -> LateJobs:
    """One run; ``measure_floor`` False leaves out the alternating windows (16 s of measuring):
    the kernel test asserts what watch does, the bench the p999 beside the evicted jobs."""
    result = LateJobs()
    original = placement()
    with processes([workload_command()]):
        time.sleep(3)  # past its start-up
        report, _ = apply_profile(PROFILE, state_dir)
        eviction = next(s for s in report["steps"] if s["plugin"] == "offline_eviction")
        assert eviction["outcome"] == "skipped", report
        watch = start_watch(state_dir, result.events)
        try:
            with processes([[sys.executable, "-c", JOB, OFFLINE_JOB]] * 3, kill_children=True) as jobs:
                wait_for(lambda: all(children_of(j.pid) for j in jobs), 10, "the jobs to fork")
                late = [j.pid for j in jobs] + [c for j in jobs for c in children_of(j.pid)]
                before = {pid: where(pid) for pid in late}
                wait_for(lambda: all(where(pid)[0] == "/tuned-rl-offline" and where(pid)[2] == "SCHED_IDLE"
                                      for pid in late), 5, "watch to evict every job and child",
                          lambda: f"{[(pid, where(pid)) for pid in late]}; watch said {result.events}")
                result.placed = True
                result.reaction_ms = [e["reaction_ms"] for e in result.events if e["event"] == "evicted"]
                if measure_floor:
                    quiet, loaded = [], []
                    for _ in range(WINDOWS):
                        for windows, signal_number in ((quiet, signal.SIGSTOP), (loaded, signal.SIGCONT)):
                            for pid in late:
                                os.kill(pid, signal_number)
                            windows.append(measure(f"name:{MARKER}", WINDOW_S, state_dir)["p999_us"])
                    result.quiet_p999_us, result.loaded_p999_us = statistics.median(quiet), statistics.median(loaded)
                watch.send_signal(signal.SIGTERM)
                result.watch_exit = watch.wait(timeout=10)
                assert where(late[0])[0] == "/tuned-rl-offline"  # stopping watch leaves the tuning
                rollback(state_dir)
                result.differences += [f"late pid {pid}: {where(pid)}, was {_unplaced(before[pid])}" for pid in late
                                       if where(pid) != _unplaced(before[pid])]
                result.put_back = not result.differences
        finally:
            if watch.poll() is None:
                watch.kill()
                watch.wait()
            rollback(state_dir)  # again, if a check failed half-way: the host must not keep the tuning
    result.differences += placement_differences(original, placement())
    return result


def _unplaced(place: tuple[str, str, str]) -> tuple[str, str, str]:
    """Where a late process would be without tuned-rl: where it was when read, unless tuned-rl
    had placed it (watch may have acted first; a job started by a housekeeping process inherits
    its cpuset): the root cgroups, at SCHED_OTHER."""
    cpu, cpuset, policy = place
    ours = ("/tuned-rl-offline", "/tuned-rl-housekeeping")
    return ("/" if cpu in ours else cpu, "/" if cpuset in ours else cpuset,
            "SCHED_OTHER" if cpu in ours or policy == "SCHED_IDLE" else policy)


def main() -> None:
    results = runs(run, __doc__.splitlines()[0])
    reactions = sorted(ms for r in results for ms in r.reaction_ms)
    print(f"{len(results)} runs: placed {sum(r.placed for r in results)}, put back "
          f"{sum(r.put_back and not r.differences for r in results)}; p999 running/quiet median "
          f"x{statistics.median(r.ratio for r in results):.2f} (max x{max(r.ratio for r in results):.2f}); "
          f"reaction median {statistics.median(reactions):.1f} ms, max {max(reactions):.1f} ms over {len(reactions)}")


if __name__ == "__main__":
    main()
