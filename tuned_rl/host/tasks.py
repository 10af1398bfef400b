"""The ground floor of host/: what a task is, and the bounded, bare reads of /proc.

Everything else in tuned_rl.host (the Host, the process table, shared-memory segments) builds on
these and nothing here imports them back.
"""

from __future__ import annotations

import os
import select
from dataclasses import dataclass

from tuned_rl.host.untrusted import printable

# What is read of a command line, and so matched: its first 4 KiB (the page that
# /proc/PID/cmdline returned whole before Linux 4.2). A user can make argv megabytes long;
# a bounded read keeps planning's memory and a regular expression's time bounded too.
CMDLINE_LIMIT = 4096
COMM_LIMIT = 64  # TASK_COMM_LEN is 16; a little room, never a whole file
PIDFD_THREAD = os.O_EXCL  # pidfd_open() of a thread, not only a process (Linux 6.9)


class TaskGone(LookupError):
    """The task no longer exists, or its pid now belongs to another task."""


@dataclass(frozen=True)
class Task:
    """A thread or process, identified by pid *and* start time: pids are reused."""

    pid: int
    start_time: int  # clock ticks after boot, field 22 of /proc/<pid>/stat
    comm: str = ""

    def label(self) -> str:
        return f"pid {self.pid} ({printable(self.comm)})" if self.comm else f"pid {self.pid}"


def read_small(path: str, limit: int) -> bytes:
    """At most ``limit`` bytes of a procfs file, read through a bare file descriptor."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        parts, left = [], limit
        while left > 0 and (part := os.read(fd, min(left, 65536))):
            parts.append(part)
            left -= len(part)
        return b"".join(parts)
    finally:
        os.close(fd)


def read_once(path: str, limit: int) -> bytes:
    """One read() of at most ``limit`` bytes: what procfs gives in one go (a short read is not retried)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, limit)
    finally:
        os.close(fd)


def open_pidfd(task: Task) -> int | None:
    """A pidfd for the task (thread or process), or None where the kernel cannot give one."""
    for flags in (PIDFD_THREAD, 0):
        try:
            return os.pidfd_open(task.pid, flags)
        except ProcessLookupError as err:
            raise TaskGone(f"{task.label()} has exited") from err
        except (OSError, AttributeError):
            continue  # EINVAL: an older kernel without PIDFD_THREAD, or a thread; ENOSYS: no pidfds
    return None


def has_exited(pidfd: int) -> bool:
    """A pidfd polls readable once its task has exited."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))
