"""The port every latency probe implements: run-queue latency events of a set of threads."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar, Iterable

import numpy as np

from tuned_rl.host import Host


@dataclass(frozen=True)
class Obstacle:
    """Why a probe cannot run here, and what fixes it."""

    problem: str
    fix: str

    @staticmethod
    def describe(obstacles: "list[Obstacle]") -> str:
        """Every obstacle and its fix, on one line."""
        return "; ".join(f"{o.problem} (fix: {o.fix})" for o in obstacles)


class ProbeError(RuntimeError):
    """The probe failed to start or to read its events."""


@dataclass(frozen=True)
class Waits:
    """Waits a probe measured: each one's length and the moment it began.

    ``starts`` are CLOCK_MONOTONIC nanoseconds (``time.monotonic_ns()``'s clock), so that each
    wait is counted in the window where it began, not where it ended: a wait of half a second
    that began without a step and ended with it is the without-arm's. A probe that sums waits in
    the kernel gives the start of the interval each was counted in (``LatencyProbe.start_resolution_ns``);
    ``starts`` None: the probe cannot tell (each wait then counts where it was drained). A start
    below 0 means the wait began too long ago for the probe to say when.
    """

    latencies: np.ndarray  # ns
    starts: np.ndarray | None  # ns, CLOCK_MONOTONIC
    tids: np.ndarray = field(default_factory=lambda: np.array([], dtype=np.int64))  # may be empty

    def __len__(self) -> int:
        return len(self.latencies)

    @staticmethod
    def empty() -> "Waits":
        return Waits(np.array([], dtype=np.int64), np.array([], dtype=np.int64))


class LatencyProbe(ABC):
    """Measures run-queue latency per wakeup (and per preemption) of the watched threads.

    Life: ``start(tids)``, then ``watch(tids)`` as the target gains threads and
    ``drain()`` to take the events since the last drain, then ``stop()``. A probe
    follows threads that watched threads create by itself where it can
    (``follows_forks``); the caller refreshes the set for targets that gain
    threads otherwise (a cgroup, a name pattern).
    """

    name: ClassVar[str]
    follows_forks: ClassVar[bool] = False
    start_resolution_ns: ClassVar[int] = 1  # how precisely ``Waits.starts`` place a wait in time

    @classmethod
    @abstractmethod
    def obstacles(cls, host: Host, canary: bool) -> list[Obstacle]:
        """What stops this probe from running on ``host`` ([] if nothing).

        :param canary: the target is a canary tuned-rl started (some probes need one).
        """

    @abstractmethod
    def start(self, tids: Iterable[int]) -> None:
        """Attach and begin recording events of ``tids``; raises ProbeError."""

    @abstractmethod
    def watch(self, tids: Iterable[int]) -> None:
        """Also record these threads from now on."""

    @abstractmethod
    def drain(self) -> Waits:
        """The waits recorded since the last drain (whenever they began)."""

    @property
    @abstractmethod
    def lost(self) -> int:
        """Events the probe saw but could not deliver, since start."""

    @abstractmethod
    def stop(self) -> None:
        """Detach; leaves nothing behind on the host."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def read_available(fd: int) -> bytes:
    """Everything a non-blocking pipe or trace_pipe holds now."""
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def to_waits(tids: list[int], latencies: list[int], starts: list[int]) -> Waits:
    return Waits(np.asarray(latencies, dtype=np.int64), np.asarray(starts, dtype=np.int64),
                 np.asarray(tids, dtype=np.int64))
