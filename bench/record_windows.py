"""Record windows of real per-event latencies of a canary with the BPF probe, for bench/judge_sim.py.

    .venv/bin/python bench/record_windows.py --windows 1200 --window-seconds 0.25 \\
        [--jobs-come-and-go] --out bench/data/NAME.npz

Runs as root. With --jobs-come-and-go, three CPU-bound jobs start and stop at random
moments (each second, each flips with probability 1/15), as other tenants of a node do:
the recording then holds the drift and bursts a live node has. The file holds, in time
order, each window's largest 20% of events and its count (the statistics read at most
the top 5% of up to four merged windows), and the window length (``window_seconds``),
so the simulation can merge consecutive windows into longer ones. bench/data/ holds
recordings of a default canary (8,000 events a second), 300 s each: canary8k_quiet.npz,
canary8k_jobs.npz (--jobs-come-and-go) and canary8k_noisy_host.npz (recorded under
bench/host_noise.py's defaults: `bench/host_noise.py -- .venv/bin/python bench/record_windows.py ...`),
and pinned_quiet.npz (the canary pinned to CPU 1).
"""


from __future__ import annotations
import argparse
import os
import random
import signal
import subprocess
import sys
import threading

import numpy as np

from tuned_rl.host import Host
from tuned_rl.measure.canary import CanarySpec
from tuned_rl.measure.measurement import measure_target
from tuned_rl.measure.targets import Target


def jobs_come_and_go(stop: threading.Event, seed: int) -> None:
    """Three CPU-bound jobs, each flipping between running and stopped now and then."""
    rng = random.Random(seed)
    jobs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3)]
    running = [True] * 3
    try:
        while not stop.wait(1.0):
            for i, job in enumerate(jobs):
                if rng.random() < 1 / 15:
                    running[i] = not running[i]
                    os.kill(job.pid, signal.SIGCONT if running[i] else signal.SIGSTOP)
    finally:
        for job in jobs:
            os.kill(job.pid, signal.SIGCONT)
            job.kill()
            job.wait()


KEPT_SHARE = 0.2  # each window's largest 20%: a merge of up to four windows still has its top 5% exact


def save_compact(path: str, windows: list[np.ndarray], window_seconds: float) -> None:
    """Each window's largest events and its count (bench/judge_sim.py pads the rest back)."""
    arrays = {"window_seconds": np.array(window_seconds)}
    for index, window in enumerate(windows):
        kept = max(1, int(np.ceil(KEPT_SHARE * len(window)))) if len(window) else 0
        arrays[f"top_{index}"] = np.sort(np.partition(window, len(window) - kept)[len(window) - kept:]) if kept else window
        arrays[f"count_{index}"] = np.array(len(window))
    np.savez_compressed(path, **arrays)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--windows", type=int, default=1200)
    parser.add_argument("--window-seconds", type=float, default=0.25)
    parser.add_argument("--probe", default="bpf")
    parser.add_argument("--canary-period-us", type=int, default=CanarySpec.period_us)
    parser.add_argument("--canary-threads", type=int, default=CanarySpec.threads)
    parser.add_argument("--canary-cpus", help="pin the canary to these CPUs (as a profile's canary_cpus)")
    parser.add_argument("--jobs-come-and-go", action="store_true")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    stop = threading.Event()
    jobs = threading.Thread(target=jobs_come_and_go, args=(stop, args.seed))
    if args.jobs_come_and_go:
        jobs.start()
    try:
        spec = CanarySpec(period_us=args.canary_period_us, threads=args.canary_threads, cpus=args.canary_cpus)
        measurement = measure_target(Host(), Target("canary"), args.windows, args.window_seconds, args.probe, spec,
                                     progress=lambda left: print(f"\r{left:.0f} s left ", end="", file=sys.stderr))
    finally:
        stop.set()
        if jobs.is_alive():
            jobs.join()
    save_compact(args.out, measurement.windows, args.window_seconds)
    print(f"\n{len(measurement.windows)} windows of {args.window_seconds} s, {measurement.summary()} "
          f"lost={measurement.lost} -> {args.out}")


if __name__ == "__main__":
    main()
