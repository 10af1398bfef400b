"""Which threads a measurement watches: by pid, process name, cgroup, systemd unit, or a canary.

Who may be the target. A pid, a cgroup and a unit name their processes outright: only root
(or whoever root delegated the cgroup to) puts a process there. A name does not: any user can
start a process called ``infer_actor``. So a name target matches only processes whose user ids
(real, effective, saved and filesystem, as /proc/PID/status shows them) all belong to the
target's ``users`` (default: root). A process that matches the name but runs as another user
is never the target: not placed, pinned, bound or measured, and spared from nothing. The plan
names each such look-alike with its user.
"""

from __future__ import annotations

import re
import subprocess
import time
from dataclasses import dataclass

from tuned_rl.host import SCHED_POLICIES, Host, TaskGone, printable
from tuned_rl.measure.canary import CanarySpec
from tuned_rl.measure.tuned_rl_processes import is_this_process, runs_tuned_rl
from tuned_rl.profiles.schema import CpuList, Key, Problem, Regex, Table

KINDS = ("pid", "name", "cgroup", "unit", "canary")


class TargetError(ValueError):
    """The target cannot be named or found."""


@dataclass(frozen=True)
class Target:
    """``kind`` and its ``value``: pid "1234", name (a regex) "^ray::", cgroup "/sys/fs/cgroup/cpu/rl",
    unit "llm.service", or canary (no value: the canary's settings live elsewhere)."""

    kind: str
    value: str = ""
    users: tuple[str, ...] = ("root",)  # a name target: the accounts (names or uids) its processes run as
    containers: bool = False  # a name target: processes in another pid namespace (a container's) may be it
    within: str | None = None  # a name target: only processes in this cgroup (systemd's hierarchy) or below

    @classmethod
    def parse(cls, text: str) -> "Target":
        """"pid:1234", "name:REGEX", "cgroup:PATH", "unit:NAME" or "canary"."""
        kind, _, value = text.partition(":")
        if kind not in KINDS:
            raise TargetError(f"unknown target {text!r}: use pid:PID, name:REGEX, cgroup:PATH, unit:NAME or canary")
        if kind == "canary" and value or kind != "canary" and not value:
            raise TargetError(f"target {text!r}: " + ("canary takes no value" if value else f"{kind}: needs a value"))
        if kind == "pid" and not value.isdigit():
            raise TargetError(f"target {text!r}: a pid is a number")
        if kind == "name":
            try:
                re.compile(value)
            except re.error as err:
                raise TargetError(f"target {text!r}: not a regular expression: {err}") from err
        return cls(kind, value)

    def __str__(self) -> str:
        return self.kind if self.kind == "canary" else f"{self.kind}:{self.value}"

    def users_text(self) -> str:
        return ", ".join(self.users)


TARGET_TABLE = Table(
    "target",
    "The workload whose latency decides whether a step is kept: exactly one of pid, name, cgroup, unit, canary.",
    {
        "pid": Key(int, "A process (all its threads).", minimum=1),
        "name": Key(Regex(), "Processes whose name or command line (its first 4 KiB) match this regular "
                             "expression, run by one of users."),
        "users": Key(list, "With name: the accounts (names, or uids as text) whose processes may be the target; "
                           "default [\"root\"]. Another user's process of that name is never the target, and the "
                           "plan names it.", item_type=(str, int)),
        "containers": Key(bool, "With name: a process in another pid namespace than the host's (a container's) "
                                "may be the target too; default false: a container's root process named like the "
                                "workload is not it, and the plan names it."),
        "within": Key(str, "With name: only processes in this cgroup of systemd's hierarchy or below it, e.g. "
                           "\"/system.slice/llm.service\"."),
        "cgroup": Key(str, "A cgroupfs directory, e.g. /sys/fs/cgroup/cpu/rl."),
        "unit": Key(str, "A systemd unit (its cgroup)."),
        "canary": Key(bool, "A process tuned-rl starts, placed like the workload, for a node without it yet."),
        "canary_period_us": Key(int, "The canary wakes this often.", minimum=50, maximum=10_000_000),
        "canary_work_us": Key(int, "Busy work per wake, like an inference step.", minimum=0, maximum=10_000_000),
        "canary_threads": Key(int, "Waking threads.", minimum=1, maximum=64),
        "canary_cpus": Key(CpuList(), "CPU list to pin the canary to, e.g. \"0\" or \"2-3\"."),
        "canary_policy": Key(str, "Scheduling policy.", choices=tuple(sorted(SCHED_POLICIES))),
        "canary_priority": Key(int, "Priority for SCHED_FIFO / SCHED_RR.", minimum=0, maximum=99),
        "canary_cgroup": Key(str, "cgroupfs directory to start the canary in."),
    },
)


def target_from_table(table: dict) -> tuple[Target, CanarySpec | None]:
    """The [target] table as a Target (and the canary's spec); assumes TARGET_TABLE checked it."""
    if table.get("canary"):
        spec = CanarySpec(**{key[len("canary_"):]: value for key, value in table.items()
                             if key.startswith("canary_")})
        return Target("canary"), spec
    kind = next(k for k in ("pid", "name", "cgroup", "unit") if k in table)
    users = tuple(str(u) for u in table.get("users", ["root"]))
    return Target(kind, str(table[kind]), users, bool(table.get("containers", False)), table.get("within")), None


def target_problems(table: dict, host: Host) -> list[Problem]:
    """What a key-by-key check cannot see: one target, a canary's settings only with a canary."""
    chosen = [k for k in ("pid", "name", "cgroup", "unit") if k in table] + (["canary"] if table.get("canary") else [])
    if len(chosen) != 1:
        return [Problem("target", f"name exactly one of pid, name, cgroup, unit, canary = true (found: "
                                  f"{', '.join(chosen) or 'none'})")]
    canary_keys = [k for k in table if k.startswith("canary_")]
    if canary_keys and chosen != ["canary"]:
        return [Problem(f"target.{canary_keys[0]}", "canary settings need canary = true")]
    problems = []
    for key in ("containers", "within"):
        if key in table and chosen != ["name"]:
            problems.append(Problem(f"target.{key}", f"{key} goes with a name target: a pid, cgroup or unit names "
                                                     "its processes outright"))
    if "within" in table and not str(table["within"]).startswith("/"):
        problems.append(Problem("target.within", "a cgroup path in systemd's hierarchy starts with /, e.g. "
                                                 "/system.slice/llm.service"))
    if "users" in table:
        if chosen != ["name"]:
            problems.append(Problem("target.users", "users goes with a name target: a pid, cgroup or unit names its "
                                                    "processes outright"))
        elif not table["users"]:
            problems.append(Problem("target.users", "names no user: the target could match nothing"))
        for user in table["users"]:
            if user_id(host, str(user)) is None:
                problems.append(Problem("target.users", f"no account {str(user)!r} on this host"))
    if "pid" in table:
        try:
            host.task(table["pid"])
        except LookupError:
            problems.append(Problem("target.pid", f"no process has pid {table['pid']} on this host"))
    if "unit" in table:
        try:
            unit_cgroup(host, table["unit"])
        except TargetError as err:
            problems.append(Problem("target.unit", str(err)))
    for key in ("cgroup", "canary_cgroup"):
        if key not in table:
            continue
        try:
            host.cgroup_mount(table[key])
        except (LookupError, OSError):
            problems.append(Problem(f"target.{key}", f"{table[key]} is not in a mounted cgroup hierarchy"))
            continue
        if not host.is_dir(table[key]):
            problems.append(Problem(f"target.{key}", f"cgroup directory {table[key]} does not exist"))
    return problems


def resolve_tids(host: Host, target: Target) -> set[int]:
    """The thread ids the target has now (may be empty: a cgroup with nothing in it)."""
    if target.kind == "pid":
        return host.thread_ids(int(target.value))
    if target.kind == "name":
        pids, _ = name_matches(host, target)
        return {t for pid in pids for t in host.thread_ids(pid)}
    if target.kind == "cgroup":
        return _cgroup_threads(host, target.value)
    if target.kind == "unit":
        return _cgroup_threads(host, unit_cgroup(host, target.value))
    raise TargetError("a canary's threads come from the canary itself")


def resolve_pids(host: Host, target: Target) -> set[int]:
    """The process ids the target has now. Never through each thread: /proc/TID/stat of a thread
    sums over its whole process, so reading it for each of 20,000 threads is quadratic."""
    if target.kind == "pid":
        return {int(target.value)} if host.thread_ids(int(target.value)) else set()
    if target.kind == "name":
        return set(name_matches(host, target)[0])
    directory = target.value if target.kind == "cgroup" else unit_cgroup(host, target.value)
    return _cgroup_members(host, directory, threads=False)


def is_target_process(host: Host, target: Target, process) -> bool:
    """Whether one process (a ProcessInfo of its main thread) is part of the target now, without
    reading every other process: what watch asks of each process that starts."""
    if target.kind == "pid":
        return process.tgid == int(target.value)
    if target.kind == "name":
        if is_this_process(host, process.pid):
            return False
        pattern = re.compile(target.value)
        if not (pattern.search(process.comm) or pattern.search(process.cmdline)) or runs_tuned_rl(process.cmdline):
            return False
        try:
            return _why_not(host, target, process.pid, process.uids, _allowed_uids(host, target)) is None
        except TaskGone:
            return False
    if target.kind == "unit":  # the process's own cgroup against the unit's: no read of the unit's members
        try:
            control_group = unit_control_group(target.value)
        except TargetError:
            return False
        path = process.cgroups.get("", process.cgroups.get("name=systemd"))
        return path is not None and (path == control_group or path.startswith(control_group.rstrip("/") + "/"))
    try:
        return process.tgid in resolve_pids(host, target)
    except TargetError:
        return False


# What `systemctl show` said of a unit's cgroup (or that it runs none), and until when (monotonic):
# watch asks for each process any user starts, and a fork of systemctl each time was that user's
# load on it (2-4 per process event).
_CONTROL_GROUPS: dict[str, tuple[float, str | None, str]] = {}
UNIT_CACHE_S = 5.0


def unit_control_group(unit: str) -> str:
    """The unit's cgroup path in systemd's hierarchy (``/system.slice/llm.service``), as `systemctl show`
    said it at most UNIT_CACHE_S ago; TargetError if the unit runs none (said as long, too)."""
    now = time.monotonic()
    cached = _CONTROL_GROUPS.get(unit)
    if cached is None or cached[0] <= now:
        try:
            result = subprocess.run(["systemctl", "show", "-p", "ControlGroup", "--value", "--", unit],
                                    capture_output=True, text=True, timeout=10, cwd="/")
        except FileNotFoundError as err:
            raise TargetError("systemctl is not installed: name the unit's cgroup with cgroup:PATH") from err
        path = result.stdout.strip()
        why = "" if result.returncode == 0 and path else (
            f"systemd knows no running unit {unit!r}{': ' + result.stderr.strip() if result.stderr else ''}")
        if len(_CONTROL_GROUPS) > 64:
            _CONTROL_GROUPS.clear()
        cached = _CONTROL_GROUPS[unit] = (now + UNIT_CACHE_S, None if why else path, why)
    if cached[1] is None:
        raise TargetError(cached[2])
    return cached[1]


def unit_cgroup(host: Host, unit: str) -> str:
    """The cgroupfs directory of a systemd unit."""
    path = unit_control_group(unit)
    for mount_point, fstype, options in host.mounts():
        if fstype == "cgroup2" or "name=systemd" in options:
            candidate = f"{mount_point}{path}"
            if host.is_dir(candidate):
                return candidate
    raise TargetError(f"unit {unit!r} is in cgroup {path}, which no mounted hierarchy holds")


def _cgroup_threads(host: Host, directory: str) -> set[int]:
    return _cgroup_members(host, directory, threads=True)


def _cgroup_members(host: Host, directory: str, threads: bool) -> set[int]:
    """The thread ids (or process ids) in a cgroup directory; TargetError if it is none."""
    if not host.is_dir(directory):
        raise TargetError(f"cgroup {directory} does not exist")
    try:
        return set(host.cgroup_tasks(directory, threads=threads))
    except LookupError as err:
        raise TargetError(str(err)) from err


def _allowed_uids(host: Host, target: Target) -> set[int]:
    return {uid for uid in (user_id(host, u) for u in target.users) if uid is not None}


def _runs_as(uids: tuple[int, ...], allowed: set[int]) -> bool:
    """Every user id of a process (real, effective, saved, filesystem) is one of ``allowed``."""
    return bool(uids) and all(uid in allowed for uid in uids)


def user_id(host: Host, user: str) -> int | None:
    """The uid of an account named ``user`` (or written as a number), or None if there is none."""
    if user.isdigit():
        return int(user)
    return 0 if user == "root" else host.user_id(user)


def name_matches(host: Host, target: Target) -> tuple[list[int], list[tuple[int, str, str]]]:
    """(the pids a name target matches, its look-alikes): processes whose comm or command line
    match, split by whether they are the target (_why_not: the target's users, the host's pid
    namespace unless ``containers``, ``within``). A look-alike is (pid, comm, why not). tuned-rl itself is neither (its command line holds the pattern), nor is
    any tuned-rl command (runs_tuned_rl)."""
    pattern = re.compile(target.value)
    allowed = _allowed_uids(host, target)
    matched, lookalikes = [], []
    for pid in host.pids():
        if is_this_process(host, pid):
            continue
        try:
            comm, cmdline = host.process_names(pid)  # not host.process(): this runs for every pid, every rescan
            if not (pattern.search(comm) or pattern.search(cmdline)) or runs_tuned_rl(cmdline):
                continue
            uids = host.process_uids(pid)
            why = _why_not(host, target, pid, uids, allowed)
        except TaskGone:
            continue
        if why is None:
            matched.append(pid)
        else:
            lookalikes.append((pid, comm, why))
    return matched, lookalikes


def _why_not(host: Host, target: Target, pid: int, uids: tuple[int, ...], allowed: set[int]) -> str | None:
    """Why a process whose name matches is not the target (None: it is): another user, another pid
    namespace (a container's root is root there too), or outside ``within``. Raises TaskGone."""
    if not _runs_as(uids, allowed):
        return (f"runs as {printable(host.user_name(uids[0] if uids else -1))}, not one of [target] users "
                f"({target.users_text()})")
    if not target.containers:
        own, theirs = host.pid_namespace(1), host.pid_namespace(pid)
        if own is not None and theirs is not None and own != theirs:
            return f"is in another pid namespace ({printable(theirs)}: a container's), and [target] containers is false"
    if target.within is not None:
        path = host.process_cgroup_path(pid)
        prefix = target.within.rstrip("/")
        if path is None or not (path == target.within or path.startswith(prefix + "/")):
            return f"is in cgroup {printable(str(path))}, not within {printable(target.within)}"
    return None


def lookalike_notes(host: Host, table: dict | None) -> list[str]:
    """The plan's notes on processes a [target] name matches but that run as another user."""
    if not table or "name" not in table:
        return []
    return describe_lookalikes(host, target_from_table(table)[0])


def describe_lookalikes(host: Host, target: Target) -> list[str]:
    """A note per process a name target matches but that runs as another user ([] for other kinds)."""
    if target.kind != "name":
        return []
    _, lookalikes = name_matches(host, target)
    return [f"not the target: pid {pid} ({printable(comm)}) matches [target] name {printable(repr(target.value))} but "
            f"{why}" for pid, comm, why in lookalikes]


def target_processes(host: Host, table: dict) -> list:
    """The processes (main threads, as ProcessInfo) of a [target] naming pid, name, cgroup or unit, now.

    Raises TargetError for a canary (it starts after planning) or a target that cannot be found.
    """
    target, _ = target_from_table(table)
    found = []
    for pid in sorted(resolve_pids(host, target)):
        try:
            found.append(host.process(pid))
        except TaskGone:
            continue
    return found


def named_workload_problem(profile, table: str) -> Problem | None:
    """The problem with a profile whose ``[table]`` acts on the workload's processes but whose
    [target] does not name them: a canary starts only after the plan is made."""
    target = profile.get("target")
    if target is None or target.get("canary"):
        return Problem(table, "needs a [target] naming the workload (pid, name, cgroup or unit): a canary starts "
                              "after the plan is made, so its threads cannot be planned")
    return None


def workload_for_step(host: Host, target_table: dict, step) -> list:
    """The workload's processes now, or [] with ``step.skip_reason`` saying why there are none."""
    try:
        workload = target_processes(host, target_table)
    except TargetError as err:
        step.skip_reason = f"cannot find the workload: {err}"
        return []
    if not workload:
        step.waits_for_workload = True
        step.skip_reason = ("the workload has no processes now: `tuned-rl watch` applies and verifies this step when "
                            "it starts")
        if target_table and "name" in target_table and name_matches(host, target_from_table(target_table)[0])[1]:
            step.skip_reason = ("no process of [target] users matches the name now (another user's do: see the "
                                "plan's notes)")
    return workload
