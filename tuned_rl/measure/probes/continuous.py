"""watch's always-on probe: the target's run-queue latency summed in the kernel, read as totals,
and each wait past the alarm threshold counted per CPU and handed to user space.

BpfProbe's default program (sched_info where the kernel's BTF has it: one program on sched_switch
that reads only `current`), its histogram kept without the ring by start (NO_GRANULES: nothing
reads it), plus ALARM_NS: a wait of at least that long adds one to its CPU's count and one small
record (thread, CPU, length, start) to a ring buffer of its own. Nothing runs for an unwatched
switch that the measuring probe does not run already; what is added runs once per long wait.
Who held the CPU is not known here: that is the attributing probe's work, armed around the worst
waits (tuned_rl.watch.telemetry).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

from tuned_rl.measure.probes.bpf import BpfProbe


@dataclass(frozen=True)
class LongWait:
    """One wait of the target past the alarm threshold, as the kernel saw it."""

    tid: int
    cpu: int          # where it was measured: the CPU the thread ran on after it
    wait_ns: int
    start_ns: int     # CLOCK_MONOTONIC, when it began

    @property
    def end_ns(self) -> int:
        return self.start_ns + self.wait_ns


@dataclass(frozen=True)
class Totals:
    """The kernel's sums since the probe started (they only grow)."""

    counts: np.ndarray                 # waits per fine bucket (bpf.FINE_BUCKET_MIDDLES)
    sum_ns: int
    longest_ns: int
    over_threshold: dict[int, int]     # CPU -> waits of ALARM_NS or more
    lost: int                          # waits the probe could not measure (bpf's lost)
    long_waits_lost: int               # long waits counted but not handed over (their ring was full)


class _LongWaitRecord(ctypes.Structure):
    _fields_ = [("tid", ctypes.c_uint32), ("cpu", ctypes.c_uint32), ("delta_ns", ctypes.c_uint64),
                ("start_ns", ctypes.c_uint64)]


class ContinuousProbe(BpfProbe):
    """The measuring probe's program as watch runs it, all the time: read ``totals()`` and ``long_waits()``."""

    def __init__(self, alarm_ns: int, max_threads: int = 16384, variant: str = "auto"):
        super().__init__(max_threads, ring_pages=1, variant=variant, summed=True)
        self.alarm_ns = int(alarm_ns)
        self._long: list[LongWait] = []

    def _program(self) -> tuple[str, list[str]]:
        program, cflags = super()._program()
        return program, [*cflags, f"-DALARM_NS={self.alarm_ns}ULL", "-DNO_GRANULES"]

    def start(self, tids) -> None:
        super().start(tids)
        self._bpf[b"long_waits"].open_ring_buffer(self._on_long_wait)

    def forget(self, tids) -> None:
        """These threads exited: the kernel cleared their bits; a later thread with one of their ids is new."""
        self._watched -= set(tids)

    def drain(self):  # nothing reads waits one by one here
        raise NotImplementedError("ContinuousProbe keeps totals only: read totals()")

    def _on_long_wait(self, ctx, data, size) -> None:
        record = ctypes.cast(data, ctypes.POINTER(_LongWaitRecord)).contents
        self._long.append(LongWait(int(record.tid), int(record.cpu), int(record.delta_ns), int(record.start_ns)))

    def long_waits(self) -> list[LongWait]:
        """The long waits handed over since the last call (a poll that does not block)."""
        self._bpf.ring_buffer_consume()
        taken, self._long = self._long, []
        return taken

    def totals(self) -> Totals:
        over = self._bpf[b"over_threshold"][ctypes.c_int(0)]
        return Totals(self.wait_counts(), int(sum(self._bpf[b"latency_sum"][ctypes.c_int(0)])), self.longest_wait_ns(),
                      {cpu: int(n) for cpu, n in enumerate(over)}, self.lost,
                      int(sum(self._bpf[b"long_waits_lost"][ctypes.c_int(0)])))
