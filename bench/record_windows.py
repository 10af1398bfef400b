"""Record windows of real per-event latencies of a canary with the BPF probe, for bench/judge_sim.py.

    .venv/bin/python bench/record_windows.py --windows 200 --out bench/data/canary_windows.npz

Runs as root. The canary is a default one (1 kHz wake, no work), as `tuned-rl measure` starts it.
"""

import argparse
import sys

import numpy as np

from tuned_rl.measure.canary import CanarySpec
from tuned_rl.host import Host
from tuned_rl.measure.measurement import measure_target
from tuned_rl.measure.targets import Target


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--windows", type=int, default=200)
    parser.add_argument("--window-seconds", type=float, default=1.0)
    parser.add_argument("--probe", default="bpf")
    parser.add_argument("--out", default="bench/data/canary_windows.npz")
    args = parser.parse_args()
    measurement = measure_target(Host(), Target("canary"), args.windows, args.window_seconds, args.probe,
                                 CanarySpec(), progress=lambda left: print(f"\r{left:.0f} s left ", end="",
                                                                           file=sys.stderr))
    np.savez_compressed(args.out, *measurement.windows)
    print(f"\n{len(measurement.windows)} windows, {measurement.summary()} lost={measurement.lost} -> {args.out}")


if __name__ == "__main__":
    main()
