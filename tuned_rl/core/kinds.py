"""Change kinds: how each kind of value is read, written, compared, shown, and checked when replayed.

A change's ``kind`` names one of the classes below. Each knows, for its own kind
of value, everything the core needs: the agent, the journal, status and the
report call these methods and nothing else. A plugin may add a kind of its own
(the ``tuned_rl_change_kinds`` hook); adding one touches no other module.

Values are text, ``None`` for "absent" (a file or cgroup that does not exist),
or, for kinds whose value has parts, a JSON-able dict.
"""

from __future__ import annotations

import base64
import binascii
import errno
import re
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, ClassVar, Union

from tuned_rl.host import SCHED_POLICIES, Host, TaskGone, parse_cpu_list, parse_cpu_mask
from tuned_rl.host.task_calls import IOPRIO_CLASSES

if TYPE_CHECKING:
    from tuned_rl.core.changes import Change

Value = Union[str, dict, None]


class UnknownKind(ValueError):
    """A change names a kind no loaded module registered."""


class Refused(Exception):
    """The kernel will not take this value for this target, by design (a managed IRQ's
    affinity): the change is left out of its step, which goes on, and the report says why.
    A kind raises it from ``write`` for refusals it knows to be permanent; any other error
    fails the step."""


class Kind:
    """One kind of change. Subclass it, set ``name`` (and ``task = True`` if the target
    is a task's attribute rather than a host object), and pass an instance to ``register_kind``."""

    name: ClassVar[str] = ""
    task: ClassVar[bool] = False  # the change carries a Task (pid and start time)
    # The report's "after" is the value read back once written, not the value asked for (where a
    # process's pages ended up, not where they were sent).
    shows_read_back: ClassVar[bool] = False
    # A child copies the value from its parent at fork (a process forked, or a thread started by one
    # of a process's threads): watch journals the child's undo too, and rollback looks for heirs.
    inherited_at_fork: ClassVar[bool] = False
    # Undoing it undoes it for the heirs too, with no record of theirs (the cgroup they were born in
    # is removed, and its members moved out, by the undo of its cgroup_dir).
    heirs_undone_with_it: ClassVar[bool] = False

    def survives_reboot(self, change: "Change") -> bool:
        """Whether what the change wrote is still there after a reboot. Kernel run-time state (a
        sysctl, an IRQ mask, a cgroup, a task's policy) is not: a reboot resets it, so its undo
        record is set aside. A file on disk is: its record is kept, and replayed after the reboot."""
        return False

    def read(self, host: Host, change: "Change") -> Value:
        """The value the host holds now; raises TaskGone for a task that is gone."""
        raise NotImplementedError

    def write(self, host: Host, change: "Change", value: Value) -> None:
        """Make the host hold ``value``; raises OSError if the kernel refuses, TaskGone if the task is gone,
        Refused if the kernel never takes such a value for this target."""
        raise NotImplementedError

    def same(self, a: Value, b: Value) -> bool:
        """Whether two values mean the same (the kernel may rewrite what it was given)."""
        return a == b

    def label(self, change: "Change") -> str:
        """What the report shows as the change's target."""
        return f"{change.task.label()} {self.name}" if change.task is not None else change.target

    def show(self, value: Value) -> str | None:
        """A value as the report shows it (None: absent)."""
        return value if value is None or isinstance(value, str) else str(value)

    def file(self, change: "Change") -> str | None:
        """The host file whose content is the value, if there is one (a dry run and the write check use it)."""
        return None

    def paths(self, change: "Change") -> list[str]:
        """Every host path a write of this change touches (checked against core/places.py)."""
        return [] if self.task else [change.target]

    def check(self, change: "Change") -> list[str]:
        """What is wrong with a change read back from the journal ([] if nothing)."""
        problems = []
        for side in ("before", "after"):
            if not self.valid_value(getattr(change, side)):
                problems.append(f"{side} {getattr(change, side)!r} is not a {self.name} value")
        return problems

    def valid_value(self, value: Value) -> bool:
        return isinstance(value, str)


KINDS: dict[str, Kind] = {}


def register_kind(kind: Kind) -> Kind:
    """Make ``kind`` available under its name; registering the same class again is harmless."""
    if not kind.name:
        raise ValueError(f"{type(kind).__name__} has no name")
    existing = KINDS.get(kind.name)
    if existing is not None and type(existing) is not type(kind):
        raise ValueError(f"change kind {kind.name!r} is already registered by {type(existing).__module__}")
    KINDS[kind.name] = kind
    return kind


def inherited_at_fork(change: "Change") -> bool:
    """Whether a task's child copies what ``change`` set on the task (the one place this is read)."""
    return change.task is not None and change.handler.inherited_at_fork


def heirs_keep_it_after_undo(change: "Change") -> bool:
    """Whether a child that inherited ``change`` keeps it after the task's own record is undone."""
    return inherited_at_fork(change) and not change.handler.heirs_undone_with_it


def kind_named(name: str) -> Kind:
    try:
        return KINDS[name]
    except KeyError:
        raise UnknownKind(f"unknown change kind {name!r} (is the plugin that adds it installed?)") from None


# -- host files -----------------------------------------------------------------


class FileValue(Kind):
    """A procfs, sysfs or cgroupfs file holding one value; compared word by word
    (the kernel tab-separates some sysctls, such as net.ipv4.tcp_rmem)."""

    name = "file"

    def read(self, host, change):
        return host.read(change.target)

    def write(self, host, change, value):
        host.write(change.target, value)

    def same(self, a, b):
        if isinstance(a, str) and isinstance(b, str):
            return a.split() == b.split()
        return a == b

    def file(self, change):
        return change.target

    def check(self, change):
        return _absolute_path_problems(change.target) + super().check(change)


class CpuListFile(FileValue):
    """A file holding a CPU list (smp_affinity_list, cpuset.cpus): "0-1" and "0,1" are the same."""

    name = "cpulist"

    def same(self, a, b):
        return _cpu_sets_equal(a, b, lambda text: parse_cpu_list(text) if text.strip() else set())


class CpuMaskFile(FileValue):
    """A file holding a hex CPU mask (smp_affinity, rps_cpus): "3", "00000003" and "0,00000003" are the same."""

    name = "cpumask"

    def same(self, a, b):
        return _cpu_sets_equal(a, b, parse_cpu_mask)


class ConfigFile(Kind):
    """A regular file tuned-rl creates or replaces (a systemd drop-in, a daemon's settings).

    The value is None when the file does not exist, else its exact bytes and mode:
    ``{"mode": 420, "text": "..."}`` (``"base64"`` instead of ``"text"`` for bytes
    that are not UTF-8). Undo deletes a file that did not exist or puts back the
    exact bytes and mode; the parent directory must exist (plan a ``directory``
    change before it if it may not).
    """

    name = "config_file"

    def survives_reboot(self, change):
        return _on_disk(change.target)

    def read(self, host, change):
        path = host.path(change.target)
        if not path.exists() and not path.is_symlink():
            return None
        if path.is_symlink() or not path.is_file():
            raise OSError(f"{change.target} is not a regular file; tuned-rl replaces only regular files")
        return {"mode": host.file_mode(change.target), **_encode(host.read_bytes(change.target))}

    def write(self, host, change, value):
        if value is None:
            host.remove_file(change.target)
        else:
            host.replace_file(change.target, _decode(value), value["mode"])

    def file(self, change):
        return change.target

    def show(self, value):
        if value is None:
            return None
        return value["text"] if "text" in value else f"{len(_decode(value))} bytes (not text)"

    def check(self, change):
        return _absolute_path_problems(change.target) + super().check(change)

    def valid_value(self, value):
        if value is None:
            return True
        if not isinstance(value, dict) or not isinstance(value.get("mode"), int) or not 0 <= value["mode"] <= 0o7777:
            return False
        try:
            _decode(value)
        except (KeyError, TypeError, ValueError):
            return False
        return set(value) in ({"mode", "text"}, {"mode", "base64"})


class Directory(Kind):
    """A directory tuned-rl creates for a file it adds; undo removes it if it is empty."""

    name = "directory"

    def survives_reboot(self, change):
        return _on_disk(change.target)

    def read(self, host, change):
        if host.is_dir(change.target):
            return "present"
        if host.exists(change.target):
            raise OSError(f"{change.target} exists and is not a directory")
        return None

    def write(self, host, change, value):
        if value == "present":
            host.make_dir(change.target)
        else:
            host.remove_dir(change.target)

    def check(self, change):
        return _absolute_path_problems(change.target) + super().check(change)

    def valid_value(self, value):
        return value in (None, "present")


def _on_disk(path: str) -> bool:
    """A path outside the file systems a boot starts empty (/run, /proc, /sys, /dev, /tmp)."""
    return not str(path).startswith(("/run/", "/proc/", "/sys/", "/dev/", "/tmp/"))


class CgroupDir(Kind):
    """A cgroup tuned-rl creates, with its settings: ``{"cpu.shares": "2"}``, or None (absent).

    Writing a dict creates the cgroup if it is missing, then writes each setting in
    order. Undo of a cgroup that did not exist moves out every task still in it (each
    to the cgroup its parent process is in now: a job forked after the apply follows
    its parent back) and removes it; of one that existed, it puts the settings back.
    """

    name = "cgroup_dir"

    def read(self, host, change):
        if not host.is_dir(change.target):
            return None
        keys = {k for v in (change.before, change.after) if isinstance(v, dict) for k in v}
        return {k: host.read(f"{change.target}/{k}") for k in sorted(keys)}

    def write(self, host, change, value):
        if value is None:
            if host.is_dir(change.target):
                _evacuate(host, change.target)
                host.remove_dir(change.target)
            return
        if not host.is_dir(change.target):
            host.make_dir(change.target)
        for key, setting in value.items():
            host.write(f"{change.target}/{key}", setting)

    def same(self, a, b):
        if isinstance(a, dict) and isinstance(b, dict):
            return all(k in a and a[k].split() == v.split() for k, v in b.items())
        return a == b

    def show(self, value):
        if value is None:
            return None
        return "present" + "".join(f", {k}={v}" for k, v in value.items())

    def check(self, change):
        return _absolute_path_problems(change.target) + super().check(change)

    def valid_value(self, value):
        return value is None or (isinstance(value, dict) and all(
            isinstance(k, str) and "/" not in k and k not in ("", ".", "..") and isinstance(v, str)
            for k, v in value.items()))


def cgroup_settings(host: Host, directory: str, keys) -> dict | None:
    """A cgroup's current ``keys`` as a ``cgroup_dir`` value (None: it does not exist), for a plan's ``before``."""
    if not host.is_dir(directory):
        return None
    return {key: host.read(f"{directory}/{key}") for key in keys}


def _evacuate(host: Host, directory: str) -> None:
    """Move every task out of ``directory`` to where its parent process is now (else the parent cgroup)."""
    mount = host.cgroup_mount(directory)
    relative = "/" + directory[len(mount.mount_point):].strip("/")
    fallback = str(PurePosixPath(relative).parent)
    for tid in host.cgroup_tasks(directory, threads=mount.version == 1):
        destination = _parents_cgroup(host, tid, mount.key, relative) or fallback
        name = "tasks" if mount.version == 1 else "cgroup.procs"
        try:
            host.write(f"{mount.mount_point.rstrip('/')}{destination.rstrip('/')}/{name}", str(tid))
        except ProcessLookupError:
            continue  # exited meanwhile


def _parents_cgroup(host: Host, tid: int, key: str, leaving: str) -> str | None:
    """The cgroup of the nearest ancestor of ``tid`` that is not in ``leaving`` (or below it)."""
    pid = tid
    for _ in range(64):
        try:
            ppid = host.process(pid).ppid
            if ppid <= 1:
                return None
            path = host.process(ppid).cgroups.get(key)
        except TaskGone:
            return None
        if path is not None and path != leaving and not path.startswith(leaving.rstrip("/") + "/"):
            return path
        pid = ppid
    return None


class ServiceState(Kind):
    """Whether a systemd service runs: "active" or "inactive"; ``target`` is the unit ("irqbalance.service")."""

    name = "service"

    def read(self, host, change):
        return "active" if host.service_active(change.target) else "inactive"

    def write(self, host, change, value):
        host.set_service_active(change.target, value == "active")

    def label(self, change):
        return f"service {change.target}"

    def paths(self, change):
        return []  # systemctl, not a file

    def check(self, change):
        problems = super().check(change)
        if not isinstance(change.target, str) or not UNIT_NAME.match(change.target):
            problems.insert(0, f"{change.target!r} is not a systemd service name")
        return problems

    def valid_value(self, value):
        return value in ("active", "inactive")


UNIT_NAME = re.compile(r"^[A-Za-z0-9@_.:\-]+\.service$")


# -- task attributes --------------------------------------------------------------


class Sched(Kind):
    """A thread's scheduling policy and priority: "SCHED_FIFO:50"."""

    name = "sched"
    task = True
    inherited_at_fork = True

    def read(self, host, change):
        return host.get_sched(change.task)

    def write(self, host, change, value):
        host.set_sched(change.task, value)

    def valid_value(self, value):
        policy, _, priority = value.partition(":") if isinstance(value, str) else ("", "", "")
        # A policy tuned-rl cannot set (SCHED_DEADLINE reads as "6") is still a record to report.
        return (policy in SCHED_POLICIES or policy.isdigit()) and priority.isdigit()


class Nice(Kind):
    """A thread's nice value, "-20" to "19" (kept for a SCHED_FIFO thread too, in effect once it is not)."""

    name = "nice"
    task = True
    inherited_at_fork = True

    def read(self, host, change):
        return host.get_nice(change.task)

    def write(self, host, change, value):
        host.set_nice(change.task, value)

    def valid_value(self, value):
        return isinstance(value, str) and value.lstrip("-").isdigit() and -20 <= int(value) <= 19


class IoPriority(Kind):
    """A thread's I/O class and level: "none:0", "best-effort:4", "idle:0" (ioprio_set(2))."""

    name = "io_priority"
    task = True
    inherited_at_fork = True

    def read(self, host, change):
        return host.get_io_priority(change.task)

    def write(self, host, change, value):
        host.set_io_priority(change.task, value)

    def valid_value(self, value):
        name, _, level = value.partition(":") if isinstance(value, str) else ("", "", "")
        return name in IOPRIO_CLASSES and level.isdigit() and int(level) <= 7


class Affinity(Kind):
    """A thread's CPU affinity, as a CPU list."""

    name = "affinity"
    task = True

    def read(self, host, change):
        return host.get_affinity(change.task)

    def write(self, host, change, value):
        host.set_affinity(change.task, value)

    def same(self, a, b):
        return _cpu_sets_equal(a, b, parse_cpu_list)

    def valid_value(self, value):
        try:
            return isinstance(value, str) and bool(parse_cpu_list(value))
        except ValueError:
            return False


class ThreadCgroup(Kind):
    """Which cgroup one thread is in; ``target`` is the hierarchy's mount point, values are
    paths in it ("/rl"). v1 moves it through ``tasks``, v2 through ``cgroup.threads``."""

    name = "cgroup"
    task = True
    whole_process = False

    def read(self, host, change):
        return host.get_cgroup(change.task, change.target)

    def write(self, host, change, value):
        try:
            host.set_cgroup(change.task, change.target, value, whole_process=self.whole_process)
        except OSError as err:
            # The kernel keeps some kernel threads where they are (kthreadd, workers that opted
            # out of migration) whatever their flags say: that is its design, not a failure.
            if err.errno == errno.EINVAL and _is_kernel_thread(host, change.task):
                raise Refused("the kernel keeps this kernel thread in its cgroup (Invalid argument)") from err
            raise

    def label(self, change):
        return f"{change.task.label()} {self.name} in {change.target}"

    def paths(self, change):
        return [change.target]  # the hierarchy's mount point: the cgroup files written are below it

    def check(self, change):
        problems = _absolute_path_problems(change.target) + super().check(change)
        for value in (change.before, change.after):
            if isinstance(value, str) and (not value.startswith("/") or ".." in PurePosixPath(value).parts):
                problems.append(f"{value!r} is not a cgroup path (\"/\" or \"/rl\")")
        return problems


class ProcessCgroup(ThreadCgroup):
    """Which cgroup a whole process (every thread) is in, through ``cgroup.procs`` (v1 and v2).

    A move through ``cgroup.procs`` takes every thread along, but in a v1 hierarchy (or a v2
    threaded subtree) a thread may sit apart from its main thread: a runtime that put its I/O
    thread in a cpuset of its own. So the value read is the main thread's cgroup ("/rl") when
    every thread is there, else ``{"cgroup": "/rl", "threads": {"TID:START_TIME": "/io"}}``;
    writing that moves the process, then each thread apart back where it was (a thread that has
    exited since is skipped).
    """

    name = "process_cgroup"
    whole_process = True
    inherited_at_fork = True
    heirs_undone_with_it = True

    def read(self, host, change):
        main = host.get_cgroup(change.task, change.target)
        apart = {f"{task.pid}:{task.start_time}": path
                 for task, path in host.thread_cgroups(change.task, change.target).items()
                 if task.pid != change.task.pid and path != main}
        return {"cgroup": main, "threads": apart} if apart else main

    def write(self, host, change, value):
        super().write(host, change, value if isinstance(value, str) else value["cgroup"])
        if isinstance(value, str):
            return
        from tuned_rl.host import Task
        for identity, path in sorted(value["threads"].items()):
            tid, start_time = (int(x) for x in identity.split(":"))
            try:
                host.set_cgroup(Task(tid, start_time), change.target, path)
            except TaskGone:
                continue

    def show(self, value):
        if isinstance(value, dict):
            apart = ", ".join(f"thread {k.split(':')[0]} in {v}" for k, v in sorted(value["threads"].items()))
            return f"{value['cgroup']} ({apart})"
        return super().show(value)

    def check(self, change):
        problems = _absolute_path_problems(change.target) + Kind.check(self, change)
        for value in (change.before, change.after):
            paths = [value] if isinstance(value, str) else [value["cgroup"], *value["threads"].values()] \
                if isinstance(value, dict) else []
            problems += [f"{path!r} is not a cgroup path (\"/\" or \"/rl\")" for path in paths
                         if not isinstance(path, str) or not path.startswith("/") or ".." in PurePosixPath(path).parts]
        return problems

    def valid_value(self, value):
        if isinstance(value, str):
            return True
        return (isinstance(value, dict) and set(value) == {"cgroup", "threads"} and isinstance(value["cgroup"], str)
                and isinstance(value["threads"], dict)
                and all(isinstance(k, str) and re.fullmatch(r"\d+:\d+", k) and isinstance(v, str)
                        for k, v in value["threads"].items()))


for _kind in (FileValue(), CpuListFile(), CpuMaskFile(), ConfigFile(), Directory(), CgroupDir(), Sched(), Nice(),
              IoPriority(), Affinity(),
              ThreadCgroup(), ProcessCgroup(), ServiceState()):
    register_kind(_kind)


# -- helpers ----------------------------------------------------------------------


def _is_kernel_thread(host: Host, task) -> bool:
    try:
        return host.process(task.pid).kernel_thread
    except TaskGone:
        return False


def _cpu_sets_equal(a: Value, b: Value, parse) -> bool:
    if not (isinstance(a, str) and isinstance(b, str)):
        return a == b
    try:
        return parse(a) == parse(b)
    except ValueError:
        return a.split() == b.split()


def _absolute_path_problems(target) -> list[str]:
    if not isinstance(target, str) or not target.startswith("/") or ".." in PurePosixPath(target).parts:
        return [f"target {target!r} is not an absolute path without '..'"]
    return []


def _encode(content: bytes) -> dict:
    try:
        return {"text": content.decode("utf-8")}
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(content).decode("ascii")}


def _decode(value: dict) -> bytes:
    if "text" in value:
        return value["text"].encode("utf-8")
    try:
        return base64.b64decode(value["base64"], validate=True)
    except binascii.Error as err:
        raise ValueError(str(err)) from err
