"""What does the probe cost the rest of the machine? hackbench with and without it, alternating.

    .venv/bin/python bench/probe_overhead.py [--pairs 15] [--probe bpf]

A canary runs throughout (so both arms carry the same load); in the "with" arm the
probe is attached to it. hackbench (rt-tests) makes hundreds of thousands of context
switches a second, every one of which passes through the probe's sched_switch handler.
Prints each pair's times and the median ratio with/without (1.02 = 2% slower).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess

from tuned_rl.measure.canary import Canary, CanarySpec
from tuned_rl.host import Host
from tuned_rl.measure.probes import PROBES

HACKBENCH = ["hackbench", "-p", "-g", "1", "-l", "10000"]  # 40 tasks: steadier than many groups on 2 CPUs


def hackbench_seconds() -> float:
    out = subprocess.run(HACKBENCH, capture_output=True, text=True, check=True).stdout
    return float(re.search(r"Time:\s*([\d.]+)", out)[1])


def context_switches() -> int:
    with open("/proc/stat") as stat:
        return int(next(line for line in stat if line.startswith("ctxt")).split()[1])


def timed_with_probe(probe_name: str, canary: Canary) -> float:
    probe = PROBES[probe_name]()
    probe.start(canary.tids())
    try:
        return hackbench_seconds()
    finally:
        probe.drain()
        probe.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--probe", default="bpf", choices=["bpf", "tracefs"])
    args = parser.parse_args()
    ratios = []
    with Canary(CanarySpec(), Host()) as canary:
        started = context_switches()
        warm = hackbench_seconds()
        print(f"warm-up: {(context_switches() - started) / warm:,.0f} context switches/s on the machine", flush=True)
        for pair in range(args.pairs):
            # Alternate which arm goes first, so a drift does not favour one of them.
            if pair % 2:
                with_probe, without = timed_with_probe(args.probe, canary), hackbench_seconds()
            else:
                without, with_probe = hackbench_seconds(), timed_with_probe(args.probe, canary)
            ratios.append(with_probe / without)
            print(f"pair {pair + 1:2d}: without {without:.3f} s, with {args.probe} {with_probe:.3f} s, "
                  f"ratio {ratios[-1]:.3f}", flush=True)
    quartiles = statistics.quantiles(ratios, n=4)
    print(f"{' '.join(HACKBENCH)}, {args.pairs} pairs: median ratio with/without {args.probe} = "
          f"{statistics.median(ratios):.3f} ({(statistics.median(ratios) - 1) * 100:+.1f}%), "
          f"quartiles {quartiles[0]:.3f}-{quartiles[2]:.3f}")


if __name__ == "__main__":
    main()
