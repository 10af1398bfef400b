"""A workload of threads that wake on a timer, as the canary does, but started by the lab and named.

    python bench/scenarios/waker.py --marker NAME --threads 4 --period-us 2000 [--fifo 50] [--start-after 0.5]

The threads start after --start-after seconds, so the lab can move the process into a cgroup
first (threads then inherit it); with --fifo each thread makes itself SCHED_FIFO at that
priority. Runs until killed.
"""

from __future__ import annotations

import argparse
import os
import threading
import time


def wake(period_s: float, fifo: int | None) -> None:
    if fifo is not None:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(fifo))  # 0: this thread
    while True:
        time.sleep(period_s)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--marker", required=True, help="names the process in its command line")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--period-us", type=int, default=2000)
    parser.add_argument("--fifo", type=int, help="SCHED_FIFO priority of each thread")
    parser.add_argument("--start-after", type=float, default=0.5)
    args = parser.parse_args()
    time.sleep(args.start_after)
    for _ in range(args.threads):
        threading.Thread(target=wake, args=(args.period_us / 1e6, args.fifo), daemon=True).start()
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
