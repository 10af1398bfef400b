"""A workload whose ioctls on a pty last milliseconds, timed by its own clock (the ioctl timer's test).

Each round, a writer thread writes 128 KiB to the pty's slave side, more than the pty holds, so
its write(2) blocks holding the tty's write lock until a reader thread drains the master side,
``--reader-delay-ms`` later. Meanwhile the main thread ("pty-ioctl") calls
ioctl(slave, TCSETSW): set the terminal's attributes once output has drained, which takes the
same write lock first (drivers/tty/tty_ioctl.c set_termios, Linux 6.4 and later), so the call
lasts until the writer is done. That is one tty_ioctl call per round, timed with
CLOCK_MONOTONIC around the call. At the end (after ``--calls``, or on SIGTERM) one JSON line says
how many ioctls the main thread made and their total and mean time by its own clock.

    python3 bench/scenarios/pty_workload.py --calls 100 --reader-delay-ms 1
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import select
import signal
import sys
import termios
import threading
import time

from migrating_threads import name_thread  # this folder is on sys.path when run

FILL = 128 * 1024


def one_round(master: int, slave: int, attributes: bytes, delay_s: float) -> int:
    """One TCSETSW behind a blocked writer; its length in ns by this thread's clock."""
    written = threading.Event()

    def writer():
        name_thread("pty-writer")
        os.write(slave, b"y" * FILL)
        written.set()

    def reader():
        name_thread("pty-reader")
        time.sleep(delay_s)
        while not written.is_set():
            select.select([master], [], [], 0.01)
            _drain(master)
        _drain(master)

    threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
    threads[0].start()
    time.sleep(0.0005)  # the writer is blocked by now, holding the write lock
    threads[1].start()
    began = time.monotonic_ns()
    fcntl.ioctl(slave, termios.TCSETSW, attributes)
    took = time.monotonic_ns() - began
    for thread in threads:
        thread.join()
    return took


def _drain(master: int) -> None:
    while True:
        try:
            if not os.read(master, 1 << 20):
                return
        except BlockingIOError:
            return


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--reader-delay-ms", type=float, default=1.0)
    parser.add_argument("--ready-file", help="write 'PID TID' here (TID: the thread making the ioctls) when ready")
    parser.add_argument("--start-file", help="wait for this file before the first call")
    args = parser.parse_args(argv)
    master, slave = os.openpty()
    os.set_blocking(master, False)
    attributes = bytearray(fcntl.ioctl(slave, termios.TCGETS, bytes(64)))
    lflag = int.from_bytes(attributes[12:16], sys.byteorder) & ~termios.ECHO  # c_lflag: no echo back
    attributes[12:16] = lflag.to_bytes(4, sys.byteorder)
    fcntl.ioctl(slave, termios.TCSETS, bytes(attributes))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    name_thread("pty-ioctl")
    if args.ready_file:
        with open(args.ready_file + ".tmp", "w") as handle:
            handle.write(f"{os.getpid()} {threading.get_native_id()}\n")
        os.replace(args.ready_file + ".tmp", args.ready_file)
    while args.start_file and not os.path.exists(args.start_file) and not stop.is_set():
        time.sleep(0.01)
    calls, total_ns = 0, 0
    while calls < args.calls and not stop.is_set():
        total_ns += one_round(master, slave, bytes(attributes), args.reader_delay_ms / 1000)
        calls += 1
    print(json.dumps({"ioctls": calls, "total_ns": total_ns, "mean_us": round(total_ns / max(calls, 1) / 1e3, 2)}),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
