"""The Host's reads of the process table: pids, threads, children, and what tuned-rl matches of a
process (names, user ids, cgroup, pid namespace, program), each read bounded."""

from __future__ import annotations

import os

from tuned_rl.host.processes import ProcessInfo, ProcessVanished, read_cmdline, read_process, read_signature
from tuned_rl.host.tasks import CMDLINE_LIMIT, COMM_LIMIT, TaskGone, read_small


class ProcessTable:
    """A part of :class:`tuned_rl.host.Host` (``_proc`` is the Host's /proc, as a string)."""

    def pids(self) -> list[int]:
        """The process ids in /proc (thread group leaders)."""
        return sorted(int(name) for name in os.listdir(self._proc) if name.isdigit())

    def thread_ids(self, pid: int) -> set[int]:
        """The thread ids of process ``pid`` (empty if it exited)."""
        try:
            return {int(name) for name in os.listdir(f"{self._proc}/{int(pid)}/task") if name.isdigit()}
        except (FileNotFoundError, ProcessLookupError):
            return set()

    def children(self, pid: int) -> list[int]:
        """The pids of the processes ``pid`` forked (from each thread's /proc/PID/task/TID/children,
        CONFIG_PROC_CHILDREN; without those files, from every process's parent pid)."""
        found, listed = [], False
        for tid in sorted(self.thread_ids(pid)):
            try:
                text = self.read_proc(f"{int(pid)}/task/{tid}/children")
            except (FileNotFoundError, ProcessLookupError):
                continue
            listed = True
            found += [int(child) for child in text.split()]
        if listed:
            return sorted(set(found))
        return [p.pid for p in self.processes() if p.ppid == pid and p.pid != pid]

    def process_names(self, pid: int) -> tuple[str, str]:
        """(comm, command line) of one process, two small reads (the command line's first
        CMDLINE_LIMIT bytes); raises TaskGone if it is gone.

        A name target is looked up by calling this for every process, every second, while the
        workload is measured: its paths are plain strings and its reads bare system calls
        (bench/name_lookup.py: 66 processes took 2.8 ms of CPU through pathlib, 1.0 ms this
        way), so the measuring process's bursts stay short."""
        base = f"{self._proc}/{int(pid)}/"
        try:
            comm = read_small(base + "comm", COMM_LIMIT).decode(errors="replace").strip()
            cmdline = read_small(base + "cmdline", CMDLINE_LIMIT).replace(b"\0", b" ").decode(errors="replace").strip()
        except (FileNotFoundError, ProcessLookupError) as err:
            raise TaskGone(f"pid {pid} has exited") from err
        return comm, cmdline

    def pid_namespace(self, pid: int) -> str | None:
        """The pid namespace a process is in (``pid:[4026531836]``, from /proc/PID/ns/pid); None if
        it cannot be read (gone, or a kernel without it)."""
        try:
            return os.readlink(f"{self._proc}/{int(pid)}/ns/pid")
        except OSError:
            return None

    def process_cgroup_path(self, pid: int) -> str | None:
        """A process's cgroup in systemd's hierarchy (cgroup v2's, or v1's name=systemd), from
        /proc/PID/cgroup; None if it has none there. Raises TaskGone if it is gone."""
        try:
            text = read_small(f"{self._proc}/{int(pid)}/cgroup", 65536).decode(errors="replace")
        except (FileNotFoundError, ProcessLookupError) as err:
            raise TaskGone(f"pid {pid} has exited") from err
        paths = dict(line.split(":", 2)[1:] for line in text.splitlines() if line.count(":") >= 2)
        return paths.get("", paths.get("name=systemd"))

    def process_uids(self, pid: int) -> tuple[int, ...]:
        """The real, effective, saved and filesystem user ids of a process (its status ``Uid:`` line).

        Not the owner of /proc/PID: a process that makes itself non-dumpable shows as root there.
        Raises TaskGone if it is gone."""
        try:
            status = read_small(f"{self._proc}/{int(pid)}/status", 65536).decode(errors="replace")
        except (FileNotFoundError, ProcessLookupError) as err:
            raise TaskGone(f"pid {pid} has exited") from err
        for line in status.splitlines():
            if line.startswith("Uid:"):
                return tuple(int(x) for x in line.split()[1:])
        raise TaskGone(f"pid {pid}: no Uid line in its status")

    def process_exe(self, pid: int) -> str | None:
        """The path of the program a process runs (its /proc/PID/exe link), or None if it cannot be
        read (a kernel thread, an exited process)."""
        try:
            return os.readlink(f"{self._proc}/{int(pid)}/exe")
        except OSError:
            return None

    def process(self, pid: int) -> ProcessInfo:
        """What tuned-rl knows of one process or thread; raises TaskGone if it is gone."""
        try:
            return read_process(self, pid)
        except ProcessVanished as err:
            raise TaskGone(str(err)) from err

    def process_signature(self, pid: int) -> bytes:
        """:func:`tuned_rl.host.processes.read_signature`; raises TaskGone if it is gone."""
        try:
            return read_signature(self, pid)
        except ProcessVanished as err:
            raise TaskGone(str(err)) from err

    def processes(self) -> list[ProcessInfo]:
        """Every process (its main thread), those that exit while being read left out."""
        return self._read_all((pid, None) for pid in self.pids())

    def threads(self, pid: int) -> list[ProcessInfo]:
        """Every thread of process ``pid`` (main thread included); the command line, which all
        threads share, is read once."""
        try:
            cmdline = read_cmdline(self, f"/proc/{int(pid)}")
        except (FileNotFoundError, ProcessLookupError):
            return []
        return self._read_all(((tid, pid) for tid in sorted(self.thread_ids(pid))), cmdline)

    def _read_all(self, ids, cmdline: str | None = None) -> list[ProcessInfo]:
        found = []
        for pid, tgid in ids:
            try:
                found.append(read_process(self, pid, tgid, cmdline=cmdline))
            except ProcessVanished:
                continue
        return found

    def user_name(self, uid: int) -> str:
        """The account name of ``uid`` (the number as text if it has none)."""
        try:
            for line in self.read("/etc/passwd").splitlines():
                fields = line.split(":")
                if len(fields) > 2 and fields[2] == str(uid):
                    return fields[0]
        except FileNotFoundError:
            pass
        return self.root_access.account_name(uid) or str(uid)

    def user_id(self, name: str) -> int | None:
        """The uid of the account ``name``, or None if there is none."""
        try:
            for line in self.read("/etc/passwd").splitlines():
                fields = line.split(":")
                if len(fields) > 2 and fields[0] == name and fields[2].isdigit():
                    return int(fields[2])
        except FileNotFoundError:
            pass
        return self.root_access.account_id(name)
