"""The canary process's own side (tuned_rl.measure.canary starts it and reads it).

A module of its own, which nothing imports: ``python -m`` runs a module as ``__main__`` after
importing its package, and tuned_rl's package imports the canary's parent side, so a child run as
``-m tuned_rl.measure.canary`` warned "found in sys.modules ... prior to execution" on every start.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time

from tuned_rl.measure.canary import RECORD


def _run_thread(period_s: float, work_s: float, report: bool, stop: threading.Event) -> None:
    # The canary's own thread's counters, in this process: always the live kernel's (a Host's
    # root names where tuned-rl reads and writes the host, not where its own threads run).
    schedstat = "/proc/thread-self/schedstat"
    tid = threading.get_native_id()
    last_wait = _run_delay(schedstat) if report else 0
    deadline = time.monotonic()
    while not stop.is_set():
        deadline += period_s
        now = time.monotonic()
        if deadline > now:
            time.sleep(deadline - now)
        else:
            deadline = now  # fell behind: do not try to catch up in a burst
        awake = time.monotonic_ns()
        end = time.monotonic() + work_s
        while time.monotonic() < end:
            pass
        if report:
            wait = _run_delay(schedstat)
            os.write(1, RECORD.pack(tid, wait - last_wait, awake))
            last_wait = wait


def _run_delay(path: str) -> int:
    with open(path, "rb") as handle:
        return int(handle.read().split()[1])


PR_SET_PDEATHSIG = 1


def _die_with(parent: int) -> None:
    """Have the kernel SIGKILL this process when ``parent`` exits; exit now if it already has."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # it died before the line above took effect
        os._exit(1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="tuned-rl-canary")
    parser.add_argument("--parent", type=int, help="die when this process exits")
    parser.add_argument("--period-us", type=int, default=1000)
    parser.add_argument("--work-us", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--report-schedstat", action="store_true")
    args = parser.parse_args(argv)
    if args.parent:
        _die_with(args.parent)
    sys.stdin.readline()  # placed by the parent: go
    stop = threading.Event()
    loop = (args.period_us / 1e6, args.work_us / 1e6, args.report_schedstat, stop)
    threads = [threading.Thread(target=_run_thread, args=loop, daemon=True) for _ in range(args.threads)]
    for thread in threads:
        thread.start()
    signal.signal(signal.SIGUSR1, lambda *_: threading.Thread(target=_run_thread, args=loop, daemon=True).start())
    sys.stdin.read()  # until the parent closes stdin
    stop.set()


if __name__ == "__main__":
    main()
