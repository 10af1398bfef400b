"""The port every latency probe implements: run-queue latency events of a set of threads."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
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
    def drain(self) -> tuple[np.ndarray, np.ndarray]:
        """(thread ids, latencies in ns) of the events recorded since the last drain.

        The thread ids may be empty: a probe that sums waits in the kernel does not know them.
        """

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


def to_arrays(tids: list[int], latencies: list[int]) -> tuple[np.ndarray, np.ndarray]:
    return np.asarray(tids, dtype=np.int64), np.asarray(latencies, dtype=np.int64)
