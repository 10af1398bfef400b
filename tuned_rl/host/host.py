"""The one object through which tuned-rl reads and changes the host."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import select
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from tuned_rl.host.cpus import format_cpu_list, parse_cpu_list
from tuned_rl.host.syscalls import syscall
from tuned_rl.host.untrusted import printable
from tuned_rl.host.processes import (ProcessInfo, ProcessVanished, parse_cgroup_file, parse_stat, read_cmdline,
                                     read_process, read_signature)

SCHED_POLICIES = {
    "SCHED_OTHER": os.SCHED_OTHER,
    "SCHED_FIFO": os.SCHED_FIFO,
    "SCHED_RR": os.SCHED_RR,
    "SCHED_BATCH": os.SCHED_BATCH,
    "SCHED_IDLE": os.SCHED_IDLE,
}
_POLICY_NAMES = {number: name for name, number in SCHED_POLICIES.items()}

# Commands a change may name as its follow-up (run after it is written and after it is
# undone). A journal record names one of these, never a command line of its own.
ACTIONS = {
    "systemd-daemon-reload": ["systemctl", "daemon-reload"],
    # irqbalance reads its settings only when it starts; try-restart leaves a stopped one stopped.
    "irqbalance-try-restart": ["systemctl", "try-restart", "--", "irqbalance.service"],
    # After a drop-in changed: reload, then restart the unit whose "<unit>.d" directory holds the
    # changed file (the unit comes from the change's path, checked against UNIT_DROP_IN).
    "systemd-daemon-reload-and-restart": ["systemctl", "daemon-reload"],
}
TARGETED_ACTIONS = {"systemd-daemon-reload-and-restart"}
UNIT_DROP_IN = re.compile(r"^/(?:etc|run)/systemd/system/([A-Za-z0-9@_.:\-]+\.service)\.d/[A-Za-z0-9_.\-]+\.conf$")
# What is read of a command line, and so matched: its first 4 KiB (the page that
# /proc/PID/cmdline returned whole before Linux 4.2). A user can make argv megabytes long;
# a bounded read keeps planning's memory and a regular expression's time bounded too.
CMDLINE_LIMIT = 4096
COMM_LIMIT = 64  # TASK_COMM_LEN is 16; a little room, never a whole file


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


@dataclass(frozen=True)
class CgroupMount:
    """A mounted cgroup hierarchy: where, which version, and its key in /proc/<pid>/cgroup."""

    mount_point: str
    version: int  # 1 or 2
    key: str  # "cpu,cpuacct" (v1), "" (v2)


class Host:
    """Reads and writes /proc, /sys and cgroupfs below ``root``.

    Tests point ``root`` at a temporary tree; every path a caller passes is
    host-absolute ("/proc/sys/kernel/...") and is resolved below the root.
    Scheduling calls (policy, affinity) act on the live kernel whatever the
    root, but task identity is still read from ``<root>/proc``.
    """

    _mounts_holders = 0  # mounts_held() blocks open
    _mounts_memo: list | None = None

    def __init__(self, root: str | os.PathLike = "/"):
        self.root = Path(root)
        self._boot_id: str | None = None
        self._proc = os.path.join(str(self.root), "proc")  # process_names builds paths below it as strings

    def path(self, target: str) -> Path:
        pure = PurePosixPath(target)
        if not pure.is_absolute() or ".." in pure.parts:
            raise ValueError(f"not a host-absolute path: {target!r}")
        return self.root.joinpath(*pure.parts[1:])

    def _write_path(self, target: str) -> Path:
        """``path(target)`` for a change: below a moved root, no part of it may be a symbolic link,
        so a link planted in the tree (``etc -> /etc``) never turns a test's write into the real host's."""
        path = self.path(target)
        if not self.is_live:
            walked = self.root
            for part in PurePosixPath(target).parts[1:]:
                walked = walked / part
                if walked.is_symlink():
                    raise OSError(f"{target}: {walked} is a symbolic link below the host root {self.root}; "
                                  "tuned-rl does not follow it")
        return path

    @property
    def is_live(self) -> bool:
        """The root is the real host's (not a test tree)."""
        return str(self.root) == "/"  # asked for every /proc read: no Path built each time

    # -- files ---------------------------------------------------------------

    def read(self, target: str) -> str:
        return self.path(target).read_text().strip()

    def read_bytes(self, target: str) -> bytes:
        return self.path(target).read_bytes()

    def read_proc(self, relative: str, limit: int = 1 << 20) -> str:
        """``/proc/<relative>`` as text, through a bare file descriptor (no pathlib): planning reads
        three such files for each of a workload's threads, which may be tens of thousands."""
        if not self.is_live:  # a test tree: through path(), which a stand-in host may map
            return self.read_prefix(f"/proc/{relative}", limit).decode(errors="replace").strip()
        return _read_small(f"{self._proc}/{relative}", limit).decode(errors="replace").strip()

    def read_prefix(self, target: str, limit: int) -> bytes:
        """The first ``limit`` bytes of a file, never more (a /proc/PID/cmdline can be megabytes)."""
        if self.is_live and target.startswith("/proc/") and ".." not in target:
            return _read_small(target, limit)  # the hot path of reading processes: no pathlib
        return _read_small(str(self.path(target)), limit)

    def write(self, target: str, value: str) -> None:
        # One write() call: procfs and sysfs take a value in a single write.
        data = value.encode()
        fd = os.open(self._write_path(target), os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
        try:
            written = os.write(fd, data)
        finally:
            os.close(fd)
        if written != len(data):
            raise OSError(f"{target}: wrote {written} of {len(data)} bytes")

    def exists(self, target: str) -> bool:
        return self.path(target).exists()

    def is_dir(self, target: str) -> bool:
        return self.path(target).is_dir()

    def writable(self, target: str) -> bool:
        return os.access(self.path(target), os.W_OK)

    def subdirs(self, target: str) -> list[str]:
        base = self.path(target)
        return sorted(str(PurePosixPath(target) / p.name) for p in base.iterdir() if p.is_dir())

    def make_dir(self, target: str) -> None:
        os.mkdir(self._write_path(target), 0o755)

    def remove_dir(self, target: str) -> None:
        os.rmdir(self._write_path(target))

    def replace_file(self, target: str, content: bytes, mode: int) -> None:
        """Create or replace a regular file atomically: a temporary file written whole and fsynced,
        renamed over the old one, then the directory fsynced so that the rename survives a crash."""
        path = self._write_path(target)
        tmp = path.with_name(f".{path.name}.tuned-rl-tmp")
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        try:
            os.fchmod(fd, mode)  # the umask must not narrow it
            write_whole(fd, content)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        os.close(fd)
        os.replace(tmp, path)
        fsync_directory(path.parent)

    def remove_file(self, target: str) -> None:
        path = self._write_path(target)
        if path.exists() or path.is_symlink():
            path.unlink()
            fsync_directory(path.parent)

    def file_mode(self, target: str) -> int:
        return self.path(target).lstat().st_mode & 0o7777

    def boot_id(self) -> str:
        # Read once: it cannot change while we run, and every journal record carries it.
        if self._boot_id is None:
            self._boot_id = self.read("/proc/sys/kernel/random/boot_id")
        return self._boot_id

    def online_cpus(self) -> set[int]:
        return parse_cpu_list(self.read("/sys/devices/system/cpu/online"))

    def run_action(self, name: str, target: str | None = None) -> None:
        """Run a follow-up action from ACTIONS (``target``: the changed file, for actions that
        act on its unit); raises OSError if it fails.

        Below a moved root the command would act on the real host, so it is refused
        (tests replace ``_run_command``: tests/fakes.py).
        """
        commands = [ACTIONS[name]]
        if name == "systemd-daemon-reload-and-restart":
            unit = UNIT_DROP_IN.match(target or "")
            if unit is None:
                raise OSError(f"{name}: {target!r} is not a drop-in of a service")
            commands.append(["systemctl", "restart", "--", unit.group(1)])
        for argv in commands:
            self._run_command(argv)

    def _run_command(self, argv: list[str]) -> None:
        self._refuse_below_a_moved_root(" ".join(argv))
        try:
            result = subprocess.run(argv, cwd="/", capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise OSError(f"{' '.join(argv)}: {err}") from err
        if result.returncode != 0:
            raise OSError(f"{' '.join(argv)} exited {result.returncode}: {result.stderr.strip()[:300]}")

    def _refuse_below_a_moved_root(self, what: str) -> None:
        """A command or a systemd call acts on the machine, whatever the root: never below a moved one."""
        if not self.is_live:
            raise OSError(f"{what}: not run, the host root is moved to {self.root}; tuned-rl runs commands and "
                          "starts or stops services only on the live host")

    def has_systemd(self) -> bool:
        """systemd is the init system (sd_booted(): /run/systemd/system exists)."""
        return self.is_dir("/run/systemd/system")

    def service_active(self, unit: str) -> bool:
        """Whether a systemd unit is active (False where there is no systemd)."""
        self._refuse_below_a_moved_root(f"systemctl is-active {unit}")
        try:
            result = subprocess.run(["systemctl", "is-active", "--quiet", "--", unit], cwd="/", timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return result.returncode == 0

    def set_service_active(self, unit: str, active: bool) -> None:
        """Start or stop a systemd unit; raises OSError if systemctl fails."""
        verb = "start" if active else "stop"
        self._refuse_below_a_moved_root(f"systemctl {verb} {unit}")
        try:
            result = subprocess.run(["systemctl", verb, "--", unit], cwd="/", capture_output=True, text=True,
                                    timeout=120)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise OSError(f"systemctl {verb} {unit}: {err}") from err
        if result.returncode != 0:
            raise OSError(f"systemctl {verb} {unit} exited {result.returncode}: {result.stderr.strip()[:300]}")

    def network_devices(self) -> list[str]:
        """Network interface names: from the kernel over netlink (pyroute2) on the live host,
        from ``<root>/sys/class/net`` on a test tree."""
        if not self.is_live:  # netlink answers for this kernel, whatever the root: a tree lists its own
            base = self.path("/sys/class/net")
            return sorted(p.name for p in base.iterdir()) if base.is_dir() else []
        from pyroute2 import IPRoute
        with IPRoute() as ipr:
            return sorted(link.get_attr("IFLA_IFNAME") for link in ipr.get_links())

    # -- cgroups -------------------------------------------------------------

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

    # -- tasks ---------------------------------------------------------------

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
            comm = _read_small(base + "comm", COMM_LIMIT).decode(errors="replace").strip()
            cmdline = _read_small(base + "cmdline", CMDLINE_LIMIT).replace(b"\0", b" ").decode(errors="replace").strip()
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
            text = _read_small(f"{self._proc}/{int(pid)}/cgroup", 65536).decode(errors="replace")
        except (FileNotFoundError, ProcessLookupError) as err:
            raise TaskGone(f"pid {pid} has exited") from err
        paths = dict(line.split(":", 2)[1:] for line in text.splitlines() if line.count(":") >= 2)
        return paths.get("", paths.get("name=systemd"))

    def process_uids(self, pid: int) -> tuple[int, ...]:
        """The real, effective, saved and filesystem user ids of a process (its status ``Uid:`` line).

        Not the owner of /proc/PID: a process that makes itself non-dumpable shows as root there.
        Raises TaskGone if it is gone."""
        try:
            status = _read_small(f"{self._proc}/{int(pid)}/status", 65536).decode(errors="replace")
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
        if self.is_live:  # NSS (LDAP, sssd, systemd-homed) knows accounts /etc/passwd lacks: the machine's own
            import pwd
            try:
                return pwd.getpwuid(uid).pw_name
            except KeyError:
                pass
        return str(uid)

    def user_id(self, name: str) -> int | None:
        """The uid of the account ``name``, or None if there is none."""
        try:
            for line in self.read("/etc/passwd").splitlines():
                fields = line.split(":")
                if len(fields) > 2 and fields[0] == name and fields[2].isdigit():
                    return int(fields[2])
        except FileNotFoundError:
            pass
        if self.is_live:  # as in user_name: NSS is the machine's, never a tree's
            import pwd
            try:
                return pwd.getpwnam(name).pw_uid
            except KeyError:
                pass
        return None

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
        pidfd = _open_pidfd(task) if self.is_live else None  # a tree's pids are no task of this kernel
        try:
            self.check_task(task)
            try:
                result = call(task.pid)
            except ProcessLookupError as err:
                raise TaskGone(f"{task.label()} has exited") from err
            if pidfd is not None and _has_exited(pidfd):
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
        from tuned_rl.host.numa import migrate_pages
        return self.on_task(task, lambda pid: migrate_pages(pid, old_nodes, new_nodes))

    # -- shared-memory segments (tuned_rl/host/shared_memory.py says how and why so) ------------

    def segment_names(self) -> list[str]:
        """The regular files right in /dev/shm, by name (below the root: a tree's own)."""
        base = self.path("/dev/shm")
        if not base.is_dir():
            return []
        return sorted(entry.name for entry in os.scandir(base) if entry.is_file(follow_symlinks=False))

    def segment_policy(self, path: str):
        """The shared memory policy of segment ``path`` (a SegmentPolicy); SegmentError or OSError if unreadable.
        A system call on the live kernel, whatever the root: tests give their tree host its own."""
        from tuned_rl.host.shared_memory import read_policy
        return read_policy(path)

    def set_segment_policy(self, path: str, policy: str, inode: int) -> None:
        """Give segment ``path`` (still the file ``inode``) the shared policy ``policy``, moving its pages on a bind."""
        from tuned_rl.host.shared_memory import set_policy
        set_policy(path, policy, inode)

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


IOPRIO_CLASSES = {"none": 0, "realtime": 1, "best-effort": 2, "idle": 3}  # include/uapi/linux/ioprio.h
_IOPRIO_NAMES = {number: name for name, number in IOPRIO_CLASSES.items()}
IOPRIO_CLASS_SHIFT = 13
IOPRIO_WHO_PROCESS = 1  # a thread id



PIDFD_THREAD = os.O_EXCL  # pidfd_open() of a thread, not only a process (Linux 6.9)


def _open_pidfd(task: Task) -> int | None:
    """A pidfd for the task (thread or process), or None where the kernel cannot give one."""
    for flags in (PIDFD_THREAD, 0):
        try:
            return os.pidfd_open(task.pid, flags)
        except ProcessLookupError as err:
            raise TaskGone(f"{task.label()} has exited") from err
        except (OSError, AttributeError):
            continue  # EINVAL: an older kernel without PIDFD_THREAD, or a thread; ENOSYS: no pidfds
    return None


def _has_exited(pidfd: int) -> bool:
    """A pidfd polls readable once its task has exited."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


_V1_CONTROLLERS = {
    "cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "net_cls", "blkio",
    "perf_event", "net_prio", "hugetlb", "pids", "rdma", "misc",
}


def _read_small(path: str, limit: int) -> bytes:
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


def write_whole(fd: int, data: bytes) -> None:
    """Write all of ``data`` to a regular file: os.write may write less (a nearly full filesystem);
    loop, and raise ENOSPC if a write makes no progress."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(errno.ENOSPC, "no space left: the write made no progress")
        view = view[written:]


def fsync_directory(path: str | os.PathLike) -> None:
    """fsync a directory, so that a rename or unlink in it is on disk (a crash cannot undo it)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
