"""What does measuring cost the workload being measured? The same quiet workload measured by the
ways tuned-rl has read its waits, in rotated order each round, by this one process:

- ``events, lookup 4/s``: each wait handed to user space through the ring buffer, and the name
  target looked up (every process's stat, status, cmdline and cgroup read) four times a second:
  tuned-rl until 2026-11-30;
- ``events, lookup 1/s``: the same events, the target looked up once a second, comm and cmdline
  only (a probe that follows forks needs a lookup only for new processes);
- ``summed``: each wait summed in a histogram in the kernel (16 buckets per doubling), read in one
  map lookup four times a second: tuned-rl now (BpfProbe's default).

The workload is bench/scenarios/workload.py (a server and four clients waking every millisecond),
on its own. Printed per arm, medians (quartiles) over the rounds: its p99 and p999 as that arm
measured them, and the CPU this process used while measuring (a share of one CPU). Whatever the
measuring process does, the workload may wait behind it: the lower arm is closer to the truth.

    sudo .venv/bin/python bench/observer_effect.py [--rounds 8] [--seconds 6]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent / "scenarios"))
from lab import processes  # noqa: E402
from workload import MARKER  # noqa: E402

from tuned_rl.host import Host, TaskGone  # noqa: E402
from tuned_rl.measure import measurement, targets  # noqa: E402
from tuned_rl.measure.probes.bpf import BpfProbe  # noqa: E402
from tuned_rl.measure.targets import Target  # noqa: E402

ARMS = ("events, lookup 4/s", "events, lookup 1/s", "summed")


def full_read_match(host: Host, pid: int, pattern) -> bool:
    """The name lookup as it was: every field of every process."""
    try:
        process = host.process(pid)
    except TaskGone:
        return False
    return bool(pattern.search(process.comm) or pattern.search(process.cmdline))


def measure_once(arm: str, seconds: float) -> tuple[float, float, float]:
    """(p99 µs, p999 µs, CPU share) of the workload as ``arm`` measures it."""
    host, target = Host(), Target.parse(f"name:{MARKER}")
    cheap_match, rescan = targets._matches, measurement.RESCAN_S
    if arm == ARMS[0]:
        targets._matches, measurement.RESCAN_S = full_read_match, measurement.REFRESH_S
    try:
        with ExitStack() as stack:
            probe_class = type("Probe", (BpfProbe,), {"__init__": lambda self: BpfProbe.__init__(
                self, summed=arm == "summed")})
            attached = measurement.attach_probe(stack, host, target, "bpf", None, probe_class)
            before = resource.getrusage(resource.RUSAGE_SELF)
            measured = measurement.record_windows(attached.probe, attached.tid_source, 1, seconds)
            after = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        targets._matches, measurement.RESCAN_S = cheap_match, rescan
    cpu = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / measured.seconds
    values = measured.values
    return float(np.percentile(values, 99)) / 1000, float(np.percentile(values, 99.9)) / 1000, cpu


def workload_command() -> list[str]:
    return [sys.executable, str(Path(__file__).parent / "scenarios" / "workload.py"), "--marker", MARKER,
            "--clients", "4", "--period-us", "1000"]


def quartiles(values: list[float], unit: str, digits: int = 0) -> str:
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")[0], statistics.median(values), \
        statistics.quantiles(values, n=4, method="inclusive")[2]
    return f"{median:.{digits}f}{unit} ({q1:.{digits}f}-{q3:.{digits}f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=6.0)
    args = parser.parse_args()
    results: dict[str, list[tuple[float, float, float]]] = {arm: [] for arm in ARMS}
    with processes([workload_command()]):
        time.sleep(3)  # past its start-up
        for number in range(args.rounds):
            order = ARMS[number % len(ARMS):] + ARMS[:number % len(ARMS)]
            for arm in order:
                results[arm].append(measure_once(arm, args.seconds))
            print(f"round {number + 1}: " + "; ".join(
                f"{arm}: p999 {results[arm][-1][1]:.0f} µs, CPU {results[arm][-1][2]:.1%}" for arm in ARMS), flush=True)
    print(f"\n{'arm':<20} {'p99 µs':>18} {'p999 µs':>20} {'measurer CPU %':>18}")
    for arm in ARMS:
        p99, p999, cpu = (list(column) for column in zip(*results[arm]))
        print(f"{arm:<20} {quartiles(p99, ''):>18} {quartiles(p999, ''):>20} "
              f"{quartiles([100 * c for c in cpu], '', 1):>18}")


if __name__ == "__main__":
    main()
