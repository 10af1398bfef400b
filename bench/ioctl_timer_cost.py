"""What does the ioctl timer cost? System calls timed with it off and on, alternating, in one run.

Three loops, each timed per call by its own clock (time.perf_counter_ns around a batch of calls):

- **counted ioctl**: ioctl(TIOCOUTQ) on a pty (tty_ioctl), by a watched thread: the path the timer
  times, each call a microsecond or two;
- **other ioctl**: ioctl(FIONREAD) on a pipe (pipe_ioctl) by the same thread: caught and passed over;
- **other system call**: getppid(), which no ioctl probe should touch. (On a kernel without
  kprobes the timer uses the ioctl system call's tracepoints, and any syscall tracepoint in use
  sends every system call of every task through the kernel's slower tracing entry path; with
  kprobes only the function is probed.)

Each round runs the loops with no timer, then with `IoctlTimer("tty_ioctl")` watching this thread,
in rotated order; printed per loop: the median ns per call of each arm over the rounds, and
what the timer adds (median of the per-round differences). The timer's own figures of the
counted loop are checked against the calls made.

    sudo .venv/bin/python bench/ioctl_timer_cost.py [--rounds 7] [--calls 20000]
"""

from __future__ import annotations

import argparse
import fcntl
import os
import statistics
import sys
import termios
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))
from tuned_rl.host import Host  # noqa: E402
from tuned_rl.measure.probes.ioctl import IoctlTimer  # noqa: E402


def loops(calls: int, slave: int, read_end: int) -> dict[str, float]:
    """ns per call of each loop (the files are opened before the timer starts: openpty's own ioctls
    are not the loop's)."""
    buffer = bytearray(4)
    result = {}
    for name, call in (("counted ioctl", lambda: fcntl.ioctl(slave, termios.TIOCOUTQ, buffer)),
                       ("other ioctl", lambda: fcntl.ioctl(read_end, termios.FIONREAD, buffer)),
                       ("other system call", os.getppid)):
        began = time.perf_counter_ns()
        for _ in range(calls):
            call()
        result[name] = (time.perf_counter_ns() - began) / calls
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("needs root (BPF)", file=sys.stderr)
        return 2
    figures: dict[str, dict[str, list[float]]] = {"off": {}, "on": {}}
    counted_ok = True
    master, slave = os.openpty()
    read_end, write_end = os.pipe()
    for round_number in range(args.rounds):
        for arm in (("off", "on") if round_number % 2 == 0 else ("on", "off")):
            timer = None
            if arm == "on":
                timer = IoctlTimer(Host(), "tty_ioctl")
                timer.start({threading.get_native_id()})
            try:
                for name, ns in loops(args.calls, slave, read_end).items():
                    figures[arm].setdefault(name, []).append(ns)
                if timer is not None and timer.times().calls != args.calls:
                    counted_ok = False
                    print(f"the timer counted {timer.times().calls} calls of {args.calls}", file=sys.stderr)
            finally:
                if timer is not None:
                    timer.stop()
        print(f"round {round_number + 1}/{args.rounds} done", file=sys.stderr)
    how = IoctlTimer(Host(), "tty_ioctl").how
    print(f"ioctl timer on tty_ioctl ({how}), {args.rounds} rounds of {args.calls} calls per loop")
    print(f"{'loop':<20} {'off ns/call':>12} {'on ns/call':>12} {'adds ns':>9}")
    for name in figures["off"]:
        off, on = figures["off"][name], figures["on"][name]
        added = statistics.median(b - a for a, b in zip(off, on))
        print(f"{name:<20} {statistics.median(off):>12.0f} {statistics.median(on):>12.0f} {added:>9.0f}")
    print(f"the timer counted every counted-ioctl call in each round: {'yes' if counted_ok else 'NO'}")
    return 0 if counted_ok else 1


if __name__ == "__main__":
    sys.exit(main())
