"""A request/response workload over shared memory: one server, clients waking on a timer.

    python bench/scenarios/workload.py --clients 4 --period-us 1000 [--ramp-from-us 4000 --ramp-seconds 60]

Each client writes a request into its slot of a shared-memory segment, wakes the
server through a pipe, and waits on its own pipe for the answer, like the RL actors
of the first field report talking to their inference server. With --ramp-from-us
the clients start at that period and speed up to --period-us over --ramp-seconds:
a request rate that ramps up while it is measured. Every process's command line holds
MARKER, so a profile names them all with `[target] name = "tuned-rl-lab-rr"`.
"""

from __future__ import annotations

import argparse
import os
import signal
import struct
import sys
import time
from multiprocessing import shared_memory

MARKER = "tuned-rl-lab-rr"
SLOT = struct.Struct("=QQ")  # request number, answer


def server(shm_name: str, requests: int, answers: list[int]) -> None:
    memory = shared_memory.SharedMemory(shm_name)
    try:
        while True:
            data = os.read(requests, 64)  # one byte per request: the client's number
            if not data:
                return
            for client in data:
                offset = client * SLOT.size
                number, _ = SLOT.unpack_from(memory.buf, offset)
                SLOT.pack_into(memory.buf, offset, number, number * 2)
                os.write(answers[client], b"a")
    finally:
        memory.close()


def client(index: int, shm_name: str, requests: int, answer: int, period_s: float, ramp_from_s: float,
           ramp_seconds: float) -> None:
    memory = shared_memory.SharedMemory(shm_name)
    started = deadline = time.monotonic()
    number = 0
    try:
        while True:
            elapsed = time.monotonic() - started
            share = min(elapsed / ramp_seconds, 1.0) if ramp_seconds > 0 else 1.0
            deadline += ramp_from_s + (period_s - ramp_from_s) * share
            pause = deadline - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            else:
                deadline = time.monotonic()
            number += 1
            SLOT.pack_into(memory.buf, index * SLOT.size, number, 0)
            os.write(requests, bytes([index]))
            if not os.read(answer, 1):
                return
    finally:
        memory.close()


def die_with_parent() -> None:
    """A client goes when the server does, however the server ends (the lab SIGKILLs it)."""
    import ctypes
    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def main() -> None:
    parser = argparse.ArgumentParser(description=f"{MARKER}: a request/response workload")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--period-us", type=int, default=1000)
    parser.add_argument("--ramp-from-us", type=int, default=0, help="start at this period (default: no ramp)")
    parser.add_argument("--ramp-seconds", type=float, default=60)
    parser.add_argument("--marker", default=MARKER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    memory = shared_memory.SharedMemory(create=True, size=SLOT.size * args.clients)
    requests_read, requests_write = os.pipe()
    answer_pipes = [os.pipe() for _ in range(args.clients)]
    children = []
    for index in range(args.clients):
        pid = os.fork()
        if pid == 0:
            die_with_parent()
            period = args.period_us / 1e6
            ramp_from = args.ramp_from_us / 1e6 if args.ramp_from_us else period
            client(index, memory.name, requests_write, answer_pipes[index][0], period, ramp_from,
                   args.ramp_seconds if args.ramp_from_us else 0)
            os._exit(0)
        children.append(pid)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server(memory.name, requests_read, [w for _, w in answer_pipes])
    finally:
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        memory.close()
        memory.unlink()


if __name__ == "__main__":
    main()
