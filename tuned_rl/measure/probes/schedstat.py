"""The schedstat probe: a canary's own per-wakeup growth of run_delay in /proc/thread-self/schedstat."""

from __future__ import annotations

import fcntl
import os
from typing import Iterable

import numpy as np

from tuned_rl.measure.canary import RECORD
from tuned_rl.host import Host
from tuned_rl.measure.probes.base import LatencyProbe, Obstacle, Waits, read_available


class SchedstatProbe(LatencyProbe):
    """Needs no tracing at all, but sees only a canary: the canary reports its own waits.

    Each event is all the run-queue wait of one wake-work cycle (the wakeup and
    any preemption during the work), with the kernel's ns accounting. Its start is the
    moment the canary's thread came out of its sleep less the wait: the wake-up's wait, so
    placed, began then; a preemption's within the work is counted with it.
    """

    name = "schedstat"

    def __init__(self, canary_stdout):
        self._fd = canary_stdout.fileno()
        flags = fcntl.fcntl(self._fd, fcntl.F_GETFL)
        fcntl.fcntl(self._fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)
        self._pending = b""

    @classmethod
    def obstacles(cls, host: Host, canary: bool) -> list[Obstacle]:
        found = []
        if not canary:
            found.append(Obstacle("schedstat sees only a canary (it reports its own run-queue wait)",
                                  "measure a canary target, or use the bpf or tracefs probe"))
        if not host.exists(f"/proc/{os.getpid()}/schedstat"):
            found.append(Obstacle("/proc/<pid>/schedstat is missing (CONFIG_SCHED_INFO off)",
                                  "use a kernel with CONFIG_SCHED_INFO=y"))
        return found

    def start(self, tids: Iterable[int]) -> None:
        self.drain()  # anything from before the window

    def watch(self, tids: Iterable[int]) -> None:
        pass  # every canary thread reports by itself

    def drain(self) -> Waits:
        data = self._pending + read_available(self._fd)
        whole = len(data) - len(data) % RECORD.size
        self._pending = data[whole:]
        records = np.frombuffer(data[:whole], dtype=np.dtype([("tid", "<u4"), ("ns", "<u8"), ("awake", "<u8")]))
        waits = records["ns"].astype(np.int64)
        return Waits(waits, records["awake"].astype(np.int64) - waits, records["tid"].astype(np.int64))

    @property
    def lost(self) -> int:
        return 0  # a pipe blocks the writer rather than dropping records

    def stop(self) -> None:
        pass
