"""The one object through which tuned-rl reads and changes the host."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

SCHED_POLICIES = {
    "SCHED_OTHER": os.SCHED_OTHER,
    "SCHED_FIFO": os.SCHED_FIFO,
    "SCHED_RR": os.SCHED_RR,
    "SCHED_BATCH": os.SCHED_BATCH,
    "SCHED_IDLE": os.SCHED_IDLE,
}
_POLICY_NAMES = {number: name for name, number in SCHED_POLICIES.items()}


class TaskGone(LookupError):
    """The task no longer exists, or its pid now belongs to another task."""


@dataclass(frozen=True)
class Task:
    """A thread or process, identified by pid *and* start time: pids are reused."""

    pid: int
    start_time: int  # clock ticks after boot, field 22 of /proc/<pid>/stat
    comm: str = ""

    def label(self) -> str:
        return f"pid {self.pid} ({self.comm})" if self.comm else f"pid {self.pid}"


class Host:
    """Reads and writes /proc, /sys and cgroupfs below ``root``.

    Tests point ``root`` at a temporary tree; every path a caller passes is
    host-absolute ("/proc/sys/kernel/...") and is resolved below the root.
    Scheduling calls (policy, affinity) act on the live kernel whatever the
    root, but task identity is still read from ``<root>/proc``.
    """

    def __init__(self, root: str | os.PathLike = "/"):
        self.root = Path(root)
        self._boot_id: str | None = None

    def path(self, target: str) -> Path:
        pure = PurePosixPath(target)
        if not pure.is_absolute() or ".." in pure.parts:
            raise ValueError(f"not a host-absolute path: {target!r}")
        return self.root.joinpath(*pure.parts[1:])

    # -- files ---------------------------------------------------------------

    def read(self, target: str) -> str:
        return self.path(target).read_text().strip()

    def write(self, target: str, value: str) -> None:
        # One write() call: procfs and sysfs take a value in a single write.
        fd = os.open(self.path(target), os.O_WRONLY | os.O_TRUNC)
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)

    def exists(self, target: str) -> bool:
        return self.path(target).exists()

    def is_dir(self, target: str) -> bool:
        return self.path(target).is_dir()

    def writable(self, target: str) -> bool:
        return os.access(self.path(target), os.W_OK)

    def subdirs(self, target: str) -> list[str]:
        base = self.path(target)
        return sorted(str(PurePosixPath(target) / p.name) for p in base.iterdir() if p.is_dir())

    def boot_id(self) -> str:
        # Read once: it cannot change while we run, and every journal record carries it.
        if self._boot_id is None:
            self._boot_id = self.read("/proc/sys/kernel/random/boot_id")
        return self._boot_id

    # -- cgroups -------------------------------------------------------------

    def mounts(self) -> list[tuple[str, str, list[str]]]:
        """(mount point, filesystem type, options) for each line of /proc/self/mounts."""
        rows = []
        for line in self.read("/proc/self/mounts").splitlines():
            fields = line.split()
            if len(fields) >= 4:
                rows.append((fields[1], fields[2], fields[3].split(",")))
        return rows

    def cgroup_v1_mount(self, controller: str) -> str | None:
        """Where the cgroup v1 hierarchy holding ``controller`` is mounted, or None."""
        for mount_point, fstype, options in self.mounts():
            if fstype == "cgroup" and controller in options:
                return mount_point
        return None

    # -- tasks ---------------------------------------------------------------

    def task(self, pid: int) -> Task:
        """The task now using ``pid``; raises TaskGone if there is none."""
        try:
            stat = self.read(f"/proc/{pid}/stat")
        except (FileNotFoundError, ProcessLookupError) as err:
            raise TaskGone(f"pid {pid} does not exist") from err
        # comm may hold spaces and parentheses: split after the last ')'.
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        return Task(pid=pid, start_time=int(fields[19]), comm=comm)

    def check_task(self, task: Task) -> None:
        """Raise TaskGone unless ``task`` is still the task behind its pid."""
        if self.task(task.pid).start_time != task.start_time:
            raise TaskGone(f"{task.label()} has exited; its pid now belongs to another task")

    def get_sched(self, task: Task) -> str:
        """Scheduling policy and priority as "SCHED_FIFO:50"."""
        self.check_task(task)
        try:
            policy = os.sched_getscheduler(task.pid)
            priority = os.sched_getparam(task.pid).sched_priority
        except ProcessLookupError as err:
            raise TaskGone(f"{task.label()} has exited") from err
        return f"{_POLICY_NAMES.get(policy, str(policy))}:{priority}"

    def set_sched(self, task: Task, value: str) -> None:
        name, _, priority = value.partition(":")
        self.check_task(task)
        try:
            os.sched_setscheduler(task.pid, SCHED_POLICIES[name], os.sched_param(int(priority or 0)))
        except ProcessLookupError as err:
            raise TaskGone(f"{task.label()} has exited") from err

    def get_affinity(self, task: Task) -> str:
        """CPU affinity as a cpu list ("0-3,8")."""
        self.check_task(task)
        try:
            return format_cpu_list(os.sched_getaffinity(task.pid))
        except ProcessLookupError as err:
            raise TaskGone(f"{task.label()} has exited") from err

    def set_affinity(self, task: Task, value: str) -> None:
        self.check_task(task)
        try:
            os.sched_setaffinity(task.pid, parse_cpu_list(value))
        except ProcessLookupError as err:
            raise TaskGone(f"{task.label()} has exited") from err

    def get_cgroup(self, task: Task, hierarchy: str) -> str:
        """The task's cgroup, relative to the hierarchy mounted at ``hierarchy``."""
        self.check_task(task)
        wanted = self._hierarchy_key(hierarchy)
        for line in self.read(f"/proc/{task.pid}/cgroup").splitlines():
            _, controllers, path = line.split(":", 2)
            if controllers == wanted:
                return path
        raise LookupError(f"{task.label()} is in no cgroup of {hierarchy}")

    def set_cgroup(self, task: Task, hierarchy: str, cgroup: str) -> None:
        """Move one thread (``tasks``) into ``cgroup`` of the hierarchy at ``hierarchy``."""
        self.check_task(task)
        self.write(str(PurePosixPath(hierarchy) / cgroup.lstrip("/") / "tasks"), str(task.pid))

    def _hierarchy_key(self, hierarchy: str) -> str:
        """The controller field /proc/<pid>/cgroup uses for a mounted hierarchy."""
        for mount_point, fstype, options in self.mounts():
            if mount_point != hierarchy:
                continue
            if fstype == "cgroup2":
                return ""
            names = [o for o in options if o in _V1_CONTROLLERS or o.startswith("name=")]
            return ",".join(names)
        raise LookupError(f"no cgroup hierarchy is mounted at {hierarchy}")


_V1_CONTROLLERS = {
    "cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "net_cls", "blkio",
    "perf_event", "net_prio", "hugetlb", "pids", "rdma", "misc",
}


def parse_cpu_list(text: str) -> set[int]:
    """"0-2,5" -> {0, 1, 2, 5}; raises ValueError on anything else."""
    cpus: set[int] = set()
    for part in text.split(","):
        low, sep, high = part.strip().partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            raise ValueError(f"not a CPU list: {text!r}")
        cpus.update(range(int(low), int(high if sep else low) + 1))
    return cpus


def format_cpu_list(cpus) -> str:
    """{0, 1, 2, 5} -> "0-2,5"."""
    ordered, ranges = sorted(cpus), []
    for cpu in ordered:
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(f"{a}-{b}" if a != b else f"{a}" for a, b in ranges)
