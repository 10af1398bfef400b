"""The Host's cgroup calls: mounted hierarchies, their directories' tasks, a task's cgroup."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import PurePosixPath

from tuned_rl.host.processes import parse_cgroup_file, parse_stat
from tuned_rl.host.tasks import Task

_V1_CONTROLLERS = {
    "cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "net_cls", "blkio",
    "perf_event", "net_prio", "hugetlb", "pids", "rdma", "misc",
}


@dataclass(frozen=True)
class CgroupMount:
    """A mounted cgroup hierarchy: where, which version, and its key in /proc/<pid>/cgroup."""

    mount_point: str
    version: int  # 1 or 2
    key: str  # "cpu,cpuacct" (v1), "" (v2)


class CgroupAccess:
    """A part of :class:`tuned_rl.host.Host` (its reads and task calls are the Host's)."""

    _mounts_holders = 0  # mounts_held() blocks open
    _mounts_memo: list | None = None

    @contextlib.contextmanager
    def mounts_held(self):
        """Within the block, read /proc/self/mounts once: for a pass over thousands of processes
        (`tuned-rl watch`'s rescan), in which nothing is mounted."""
        self._mounts_holders += 1
        try:
            yield
        finally:
            self._mounts_holders -= 1
            if not self._mounts_holders:
                self._mounts_memo = None

    def mounts(self) -> list[tuple[str, str, list[str]]]:
        """(mount point, filesystem type, options) for each line of /proc/self/mounts."""
        if self._mounts_holders:
            if self._mounts_memo is None:
                self._mounts_memo = self._read_mounts()
            return self._mounts_memo
        return self._read_mounts()

    def _read_mounts(self) -> list[tuple[str, str, list[str]]]:
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

    def cgroup_mounts(self) -> list[CgroupMount]:
        found = []
        for mount_point, fstype, options in self.mounts():
            if fstype == "cgroup2":
                found.append(CgroupMount(mount_point, 2, ""))
            elif fstype == "cgroup":
                names = [o for o in options if o in _V1_CONTROLLERS or o.startswith("name=")]
                found.append(CgroupMount(mount_point, 1, ",".join(names)))
        return found

    def cgroup_mount(self, directory: str) -> CgroupMount:
        """The hierarchy a cgroup directory (or a mount point) belongs to; LookupError if none."""
        candidates = [m for m in self.cgroup_mounts()
                      if directory == m.mount_point or directory.startswith(m.mount_point.rstrip("/") + "/")]
        if not candidates:
            raise LookupError(f"{directory} is in no mounted cgroup hierarchy")
        return max(candidates, key=lambda m: len(m.mount_point))

    def cgroup_tasks(self, directory: str, threads: bool = True) -> list[int]:
        """Thread ids (or, with ``threads=False``, process ids) in one cgroup directory."""
        names = ("tasks", "cgroup.threads") if threads else ("cgroup.procs",)
        for name in names:
            if self.exists(f"{directory}/{name}"):
                return [int(line) for line in self.read(f"{directory}/{name}").split()]
        raise LookupError(f"{directory} is not a cgroup directory")

    def get_cgroup(self, task: Task, hierarchy: str) -> str:
        """The task's cgroup, relative to the hierarchy mounted at ``hierarchy``."""
        self.check_task(task)
        wanted = self.cgroup_mount(hierarchy).key
        path = parse_cgroup_file(self._read_task_file(task, "cgroup")).get(wanted)
        if path is None:
            raise LookupError(f"{task.label()} is in no cgroup of {hierarchy}")
        return path

    def thread_cgroups(self, task: Task, hierarchy: str) -> dict[Task, str]:
        """Each thread of process ``task`` and its cgroup relative to ``hierarchy`` (threads that exit
        while being read left out)."""
        self.check_task(task)
        wanted = self.cgroup_mount(hierarchy).key
        found = {}
        for tid in sorted(self.thread_ids(task.pid)):
            base = f"/proc/{task.pid}/task/{tid}"
            try:
                comm, fields = parse_stat(self.read(f"{base}/stat"))
                path = parse_cgroup_file(self.read(f"{base}/cgroup")).get(wanted, "/")
            except (FileNotFoundError, ProcessLookupError):
                continue
            found[Task(tid, int(fields[19]), comm)] = path
        return found

    def set_cgroup(self, task: Task, hierarchy: str, cgroup: str, whole_process: bool = False) -> None:
        """Move a thread, or with ``whole_process`` its whole process, into ``cgroup`` of ``hierarchy``.

        cgroup v1 takes a thread in ``tasks`` and a process in ``cgroup.procs``; v2 takes a
        process in ``cgroup.procs`` and a thread in ``cgroup.threads`` (threaded subtrees only).
        """
        mount = self.cgroup_mount(hierarchy)
        name = "cgroup.procs" if whole_process else ("tasks" if mount.version == 1 else "cgroup.threads")
        directory = str(PurePosixPath(hierarchy) / cgroup.lstrip("/"))
        self.on_task(task, lambda pid: self.write(f"{directory}/{name}", str(pid)))
