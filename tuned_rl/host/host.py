"""The one object through which tuned-rl reads and changes the host.

A Host is its root: the live host's ("/") or a tree standing in for it, told apart once, when it
is made (:mod:`tuned_rl.host.roots`). Its calls are grouped by what they reach: files and commands
here, cgroups (:mod:`~tuned_rl.host.cgroup_access`), the process table
(:mod:`~tuned_rl.host.process_table`) and calls on one task (:mod:`~tuned_rl.host.task_calls`).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path, PurePosixPath

from tuned_rl.host.cgroup_access import CgroupAccess
from tuned_rl.host.cpus import parse_cpu_list
from tuned_rl.host.durable import fsync_directory, replace_durably
from tuned_rl.host.process_table import ProcessTable
from tuned_rl.host.roots import root_for
from tuned_rl.host.shared_memory import read_policy, set_policy
from tuned_rl.host.task_calls import TaskCalls

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


class Host(ProcessTable, CgroupAccess, TaskCalls):
    """Reads and writes /proc, /sys and cgroupfs below ``root``.

    Tests point ``root`` at a temporary tree; every path a caller passes is
    host-absolute ("/proc/sys/kernel/...") and is resolved below the root.
    Scheduling calls (policy, affinity) act on the live kernel whatever the
    root, but task identity is still read from ``<root>/proc``.
    """

    def __init__(self, root: str | os.PathLike = "/"):
        self.root = Path(root)
        self.root_access = root_for(self.root)  # what differs between the live host and a tree
        self._boot_id: str | None = None
        self._proc = os.path.join(str(self.root), "proc")  # process_names builds paths below it as strings

    def path(self, target: str) -> Path:
        pure = PurePosixPath(target)
        if not pure.is_absolute() or ".." in pure.parts:
            raise ValueError(f"not a host-absolute path: {target!r}")
        return self.root.joinpath(*pure.parts[1:])

    def _write_path(self, target: str) -> Path:
        """``path(target)`` for a change: below a moved root, no part of it may be a symbolic link."""
        return self.root_access.write_path(self, target)

    @property
    def moved_root(self) -> Path | None:
        """Where the tree standing in for the host is; None on the live host."""
        return self.root_access.moved_to

    def own_pid(self) -> int | None:
        """This process's pid in the host's /proc: None below a moved root, whose pids are no task of this kernel."""
        return self.root_access.own_pid()

    # -- files ---------------------------------------------------------------

    def read(self, target: str) -> str:
        return self.path(target).read_text().strip()

    def read_bytes(self, target: str) -> bytes:
        return self.path(target).read_bytes()

    def read_proc(self, relative: str, limit: int = 1 << 20) -> str:
        """``/proc/<relative>`` as text, through a bare file descriptor (no pathlib) on the live host:
        planning reads three such files for each of a workload's threads, which may be tens of thousands."""
        return self.root_access.read_proc(self, relative, limit).decode(errors="replace").strip()

    def read_prefix(self, target: str, limit: int) -> bytes:
        """The first ``limit`` bytes of a file, never more (a /proc/PID/cmdline can be megabytes)."""
        return self.root_access.read_prefix(self, target, limit)

    def read_once(self, target: str, limit: int) -> bytes:
        """One read() of at most ``limit`` bytes of a file (a short read is not retried)."""
        return self.root_access.read_once(self, target, limit)

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
        """Create or replace a regular file atomically, the rename on disk before this returns."""
        replace_durably(self._write_path(target), content, mode, ".tuned-rl-tmp")

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
        self.root_access.refuse_commands(what)

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
        return self.root_access.network_devices(self)

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
        return read_policy(path)

    def set_segment_policy(self, path: str, policy: str, inode: int) -> None:
        """Give segment ``path`` (still the file ``inode``) the shared policy ``policy``, moving its pages on a bind."""
        set_policy(path, policy, inode)


