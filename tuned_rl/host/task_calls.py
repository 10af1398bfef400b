"""The Host's calls on one task: its identity checked around each, and what tuned-rl changes of it
(scheduling policy, affinity, nice, I/O priority, pages)."""

from __future__ import annotations

import os
import time

from tuned_rl.host.cpus import format_cpu_list, parse_cpu_list
from tuned_rl.host.numa import migrate_pages
from tuned_rl.host.processes import parse_stat
from tuned_rl.host.syscalls import syscall
from tuned_rl.host.tasks import Task, TaskGone, has_exited

SCHED_POLICIES = {
    "SCHED_OTHER": os.SCHED_OTHER,
    "SCHED_FIFO": os.SCHED_FIFO,
    "SCHED_RR": os.SCHED_RR,
    "SCHED_BATCH": os.SCHED_BATCH,
    "SCHED_IDLE": os.SCHED_IDLE,
}
_POLICY_NAMES = {number: name for name, number in SCHED_POLICIES.items()}
IOPRIO_CLASSES = {"none": 0, "realtime": 1, "best-effort": 2, "idle": 3}  # include/uapi/linux/ioprio.h
_IOPRIO_NAMES = {number: name for name, number in IOPRIO_CLASSES.items()}
IOPRIO_CLASS_SHIFT = 13
IOPRIO_WHO_PROCESS = 1  # a thread id


class TaskCalls:
    """A part of :class:`tuned_rl.host.Host` (its reads and its root's pin are the Host's)."""

    def task(self, pid: int) -> Task:
        """The task now using ``pid``; raises TaskGone if there is none."""
        try:
            stat = self.read(f"/proc/{pid}/stat")
        except (FileNotFoundError, ProcessLookupError) as err:
            raise TaskGone(f"pid {pid} does not exist") from err
        comm, fields = parse_stat(stat)
        return Task(pid=pid, start_time=int(fields[19]), comm=comm)

    def started_at(self, task: Task) -> float:
        """When ``task`` started, as Unix time: its start time counts clock ticks of CLOCK_BOOTTIME."""
        return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME) + task.start_time / os.sysconf("SC_CLK_TCK")

    def check_task(self, task: Task) -> None:
        """Raise TaskGone unless ``task`` is still the task behind its pid."""
        if self.task(task.pid).start_time != task.start_time:
            raise TaskGone(f"{task.label()} has exited; its pid now belongs to another task")

    def on_task(self, task: Task, call):
        """``call(pid)`` on ``task``, only if its pid still belongs to it; TaskGone if it does not.

        Every syscall on a task goes through here (a kind of change that needs a new one
        passes its own ``call``), so the identity check lives in one place. On the live
        host the task is pinned by a pidfd opened *before* its start time is checked, so
        the pidfd is the task checked; after the call, the pidfd says whether that task
        was still alive, which means its pid was still its own when the call ran.
        (Linux has no pidfd form of sched_setaffinity or of a cgroup write: a pid that
        is freed and reused inside the call itself is the one case left, and it is
        reported as gone.)
        """
        pidfd = self.root_access.pin(task)
        try:
            self.check_task(task)
            try:
                result = call(task.pid)
            except ProcessLookupError as err:
                raise TaskGone(f"{task.label()} has exited") from err
            if pidfd is not None and has_exited(pidfd):
                raise TaskGone(f"{task.label()} exited while it was being changed")
            return result
        finally:
            if pidfd is not None:
                os.close(pidfd)

    def get_sched(self, task: Task) -> str:
        """Scheduling policy and priority as "SCHED_FIFO:50"."""
        policy, priority = self.on_task(task, lambda pid: (os.sched_getscheduler(pid),
                                                           os.sched_getparam(pid).sched_priority))
        return f"{_POLICY_NAMES.get(policy, str(policy))}:{priority}"

    def set_sched(self, task: Task, value: str) -> None:
        name, _, priority = value.partition(":")
        if name not in SCHED_POLICIES:
            raise OSError(f"cannot set scheduling policy {name!r}")
        self.on_task(task, lambda pid: os.sched_setscheduler(pid, SCHED_POLICIES[name],
                                                             os.sched_param(int(priority or 0))))

    def get_affinity(self, task: Task) -> str:
        """CPU affinity as a cpu list ("0-3,8")."""
        return format_cpu_list(self.on_task(task, os.sched_getaffinity))

    def set_affinity(self, task: Task, value: str) -> None:
        self.on_task(task, lambda pid: os.sched_setaffinity(pid, parse_cpu_list(value)))

    def migrate_pages(self, task: Task, old_nodes: set[int], new_nodes: set[int]) -> int:
        """Move the process's pages from ``old_nodes`` to ``new_nodes``; how many could not be moved."""
        return self.on_task(task, lambda pid: migrate_pages(pid, old_nodes, new_nodes))

    def get_nice(self, task: Task) -> str:
        """The thread's nice value ("-20" .. "19"); per thread, as Linux keeps it."""
        return str(self.on_task(task, lambda pid: os.getpriority(os.PRIO_PROCESS, pid)))

    def set_nice(self, task: Task, value: str) -> None:
        self.on_task(task, lambda pid: os.setpriority(os.PRIO_PROCESS, pid, int(value)))

    def get_io_priority(self, task: Task) -> str:
        """The thread's I/O scheduling class and level: "none:0", "best-effort:4", "idle:0"."""
        value = self.on_task(task, lambda pid: syscall("ioprio_get", IOPRIO_WHO_PROCESS, pid))
        return f"{_IOPRIO_NAMES.get(value >> IOPRIO_CLASS_SHIFT, str(value >> IOPRIO_CLASS_SHIFT))}:{value & 0x1FFF}"

    def set_io_priority(self, task: Task, value: str) -> None:
        name, _, level = value.partition(":")
        if name not in IOPRIO_CLASSES:
            raise OSError(f"cannot set I/O class {name!r}")
        ioprio = IOPRIO_CLASSES[name] << IOPRIO_CLASS_SHIFT | int(level or 0)
        self.on_task(task, lambda pid: syscall("ioprio_set", IOPRIO_WHO_PROCESS, pid, ioprio))

    def _read_task_file(self, task: Task, name: str) -> str:
        try:
            return self.read(f"/proc/{task.pid}/{name}")
        except (FileNotFoundError, ProcessLookupError) as err:
            raise TaskGone(f"{task.label()} has exited") from err
