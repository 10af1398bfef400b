"""Processes and threads as procfs shows them: identity, name, user, cgroups, policy, affinity, kernel flags.

Read from ``<root>/proc`` files only (never from syscalls), so a test points the
host at a temporary tree and plugins see the processes it holds.

Why not psutil: its ``PROCFS_PATH`` is one global for the whole interpreter,
not a property of a host object; it has no per-thread view (comm, policy,
flags, cgroups of a thread id) and does not expose a task's kernel flags
(PF_KTHREAD, PF_NO_SETAFFINITY), which decide what may be moved; and its
setters act on a bare pid. What it would parse here is three files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tuned_rl.host.tasks import CMDLINE_LIMIT, Task

if TYPE_CHECKING:
    from tuned_rl.host.host import Host

# /proc/<pid>/stat flags (include/linux/sched.h)
PF_KTHREAD = 0x00200000
PF_NO_SETAFFINITY = 0x04000000  # kthread_bind(): sched_setaffinity and cpuset moves fail EINVAL

POLICY_NAMES = {0: "SCHED_OTHER", 1: "SCHED_FIFO", 2: "SCHED_RR", 3: "SCHED_BATCH", 5: "SCHED_IDLE",
                6: "SCHED_DEADLINE"}


@dataclass(frozen=True)
class ProcessInfo:
    """One thread or process (a process is its main thread, ``pid == tgid``)."""

    pid: int  # the thread id, for a thread
    tgid: int  # the process it belongs to
    ppid: int
    start_time: int  # clock ticks after boot: with pid, the task's identity
    comm: str
    cmdline: str  # arguments joined by spaces; "" for kernel threads
    uid: int  # the real user id
    policy: str  # "SCHED_FIFO"
    priority: int  # real-time priority, 0 for normal policies
    nice: int
    affinity: str  # CPU list
    cgroups: dict[str, str] = field(default_factory=dict)  # hierarchy key -> path; "" is cgroup v2
    flags: int = 0
    uids: tuple[int, ...] = ()  # real, effective, saved, filesystem (the status Uid: line)

    @property
    def kernel_thread(self) -> bool:
        return bool(self.flags & PF_KTHREAD)

    @property
    def fixed_affinity(self) -> bool:
        """The kernel will not move it to other CPUs (a per-CPU kernel thread)."""
        return bool(self.flags & PF_NO_SETAFFINITY)

    @property
    def is_thread_leader(self) -> bool:
        return self.pid == self.tgid

    @property
    def task(self) -> Task:
        return Task(self.pid, self.start_time, self.comm)

    @property
    def sched(self) -> str:
        return f"{self.policy}:{self.priority}"


class ProcessVanished(LookupError):
    """The process exited while it was being read."""


def parse_stat(text: str) -> tuple[str, list[str]]:
    """(comm, the fields after it) of a /proc/<pid>/stat line; comm may hold spaces and ')'."""
    comm = text[text.index("(") + 1 : text.rindex(")")]
    return comm, text[text.rindex(")") + 2 :].split()


def read_cmdline(host: "Host", base: str) -> str:
    """The command line under ``base`` ("/proc/PID"), arguments joined by spaces: its first
    CMDLINE_LIMIT bytes only."""
    return host.read_prefix(f"{base}/cmdline", CMDLINE_LIMIT).replace(b"\0", b" ").decode(errors="replace").strip()


def read_process(host: "Host", pid: int, tgid: int | None = None, cmdline: str | None = None) -> ProcessInfo:
    """Everything tuned-rl needs of one task; raises ProcessVanished if it is gone.

    ``tgid``: read the thread ``pid`` of that process (under /proc/<tgid>/task/). ``cmdline``: the
    process's command line, already read (its threads share it).
    """
    relative = f"{int(tgid)}/task/{int(pid)}" if tgid is not None else f"{int(pid)}"
    try:
        comm, fields = parse_stat(host.read_proc(f"{relative}/stat"))
        status = _status(host.read_proc(f"{relative}/status"))
        if cmdline is None:
            cmdline = read_cmdline(host, f"/proc/{relative}")
        cgroups = parse_cgroup_file(host.read_proc(f"{relative}/cgroup"))
    except (FileNotFoundError, ProcessLookupError) as err:
        raise ProcessVanished(f"pid {pid} has exited") from err
    policy = int(fields[38]) if len(fields) > 38 else 0
    return ProcessInfo(
        pid=pid, tgid=int(status.get("Tgid", pid)), ppid=int(fields[1]), start_time=int(fields[19]),
        comm=comm, cmdline=cmdline, uid=int(status.get("Uid", "0").split()[0]),
        policy=POLICY_NAMES.get(policy, str(policy)), priority=int(fields[37]) if len(fields) > 37 else 0,
        nice=int(fields[16]), affinity=status.get("Cpus_allowed_list", ""), cgroups=cgroups, flags=int(fields[6]),
        uids=tuple(int(x) for x in status.get("Uid", "0").split()),
    )


def read_signature(host: "Host", pid: int) -> bytes:
    """What the rules of tuned-rl's plugins read of one process, as raw bytes: its comm and start
    time (stat), its user ids and allowed CPUs (status), its cgroups, and the start of its command
    line. Equal signatures: nothing a rule depends on changed, so a rescan need not plan it again.
    Raises ProcessVanished."""
    base = f"/proc/{int(pid)}"
    # One read() of each: a short read only makes the signature differ, and the process planned.
    read = host.read_once  # one read() on the live host; a tree's through the host, which a test may map
    try:
        stat = read(f"{base}/stat", 4096)
        status = read(f"{base}/status", 1 << 16)
        cgroup = read(f"{base}/cgroup", 1 << 16)
        cmdline = read(f"{base}/cmdline", CMDLINE_LIMIT)
    except (FileNotFoundError, ProcessLookupError) as err:
        raise ProcessVanished(f"pid {pid} has exited") from err
    close = stat.rfind(b")")
    fields = stat[close + 2:].split(b" ", 20)
    start_time = fields[19] if len(fields) > 19 else b""
    return b"\0".join((stat[:close + 1], start_time, _status_line(status, b"\nUid:"),
                       _status_line(status, b"\nCpus_allowed_list:"), cgroup, cmdline))


def _status_line(status: bytes, key: bytes) -> bytes:
    start = status.find(key)
    return status[start:status.find(b"\n", start + 1)] if start >= 0 else b""


def parse_cgroup_file(text: str) -> dict[str, str]:
    """/proc/<pid>/cgroup as {hierarchy key: path}: "cpu,cpuacct" for v1, "" for v2, "name=systemd"."""
    rows = {}
    for line in text.splitlines():
        if not line:
            continue
        _, controllers, path = line.split(":", 2)
        rows[controllers] = path
    return rows


STATUS_KEYS = ("Tgid", "Uid", "Cpus_allowed_list")


def _status(text: str) -> dict[str, str]:
    """The keys of /proc/<pid>/status that tuned-rl reads (found, not every line parsed: a rescan
    reads thousands of these)."""
    rows, text = {}, "\n" + text
    for key in STATUS_KEYS:
        start = text.find(f"\n{key}:")
        if start >= 0:
            end = text.find("\n", start + 1)
            rows[key] = text[start + len(key) + 2:end if end >= 0 else None].strip()
    return rows
