"""A workload whose named threads migrate: ``--threads`` threads called "stream-N", each busy
``--work-ms`` then asleep ``--sleep-ms``, with no CPU affinity of their own, so that the scheduler
moves them between CPUs as a neighbour loads one (the second field report's CUDA-stream threads).
Runs until SIGTERM. Prints its pid once its threads are named.

    python3 bench/scenarios/migrating_threads.py --threads 3
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
import threading
import time


def name_thread(name: str) -> None:
    ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME


def stream(number: int, work_s: float, sleep_s: float, stop: threading.Event, named: threading.Barrier) -> None:
    name_thread(f"stream-{number}")
    named.wait()
    while not stop.is_set():
        end = time.perf_counter() + work_s
        while time.perf_counter() < end:
            pass
        time.sleep(sleep_s)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=3)
    parser.add_argument("--work-ms", type=float, default=1.0)
    parser.add_argument("--sleep-ms", type=float, default=2.0)
    args = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    named = threading.Barrier(args.threads + 1)
    threads = [threading.Thread(target=stream, args=(n, args.work_ms / 1000, args.sleep_ms / 1000, stop, named))
               for n in range(args.threads)]
    for thread in threads:
        thread.start()
    named.wait()
    print(os.getpid(), flush=True)
    while not stop.is_set():
        time.sleep(0.1)
    for thread in threads:
        thread.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
