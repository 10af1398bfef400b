"""A helper that sleeps, then spins: every --every-s seconds it holds its CPU for --spin-ms.

    python bench/scenarios/stall_helper.py --spin-ms 5 --every-s 0.5 [--marker NAME]

Pinned to the target's CPU by the lab (taskset), and SCHED_IDLE (chrt --idle): its spin gives way to
the target's wake-ups at once; made SCHED_FIFO (the lab's plugin, [lab_stall]) it does not, and
each spin becomes one stall of the target's waits that fall into it. Runs until killed.
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spin-ms", type=float, default=5.0)
    parser.add_argument("--every-s", type=float, default=0.5)
    parser.add_argument("--marker", default="tuned-rl-lab-stall-helper", help="names it in its command line")
    args = parser.parse_args()
    deadline = time.monotonic()
    while True:
        deadline += args.every_s
        time.sleep(max(0.0, deadline - time.monotonic()))
        end = time.monotonic() + args.spin_ms / 1000
        while time.monotonic() < end:
            pass


if __name__ == "__main__":
    main()
