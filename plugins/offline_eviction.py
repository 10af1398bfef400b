"""[offline_eviction]: move offline jobs out of the workload's way.

    [offline_eviction]
    cgroup = true                 # into tuned-rl-offline, minimal CPU weight (default)
    cpus = "0"                    # optional: the jobs' CPUs (a cpuset), e.g. the housekeeping CPUs
    policy = "SCHED_IDLE"         # optional, per thread: SCHED_IDLE or SCHED_BATCH
    nice = 19                     # optional, per thread
    io_class = "idle"             # optional, per thread: "idle" or "best-effort"

    [[offline_eviction.match]]    # a process matches if every key of one matcher does
    name = "^stress"              # its name (comm), a regular expression
    [[offline_eviction.match]]
    cmdline = "train\\.py"        # its command line
    user = "batch"                # and it runs as this user
    # also: cgroup = "/batch" (its cgroup, or one below it, in any hierarchy), unit = "backup.service"

Matches are resolved when the plan is made and listed in it (pid, name, and why each
matched). One step:

- a cgroup tuned-rl creates, ``tuned-rl-offline``: on cgroup v1 (the ``cpu`` hierarchy)
  ``cpu.idle`` 1 where the kernel has it (5.15 and later), else ``cpu.shares`` 2; ``cpu.weight``
  1 and ``cpu.idle`` 1 on v2. An idle group's tasks are preempted at once by a waking workload
  thread, which a low weight alone does not do; with ``cpus``, a cpuset
  (v1: ``cpuset/tuned-rl-offline``; v2: the same cgroup's ``cpuset.cpus``). Every matched
  process moves in whole, so children it forks later are evicted too;
- per thread, if asked: policy, nice, I/O class.

Never moved, and listed as spared with the reason: the [target], PID 1, kernel threads,
tuned-rl itself and its helpers. Undo restores each thread's policy, nice and I/O class,
moves each process back to its exact cgroups, and removes the cgroups tuned-rl created (a job
forked inside one meanwhile goes back to where its parent is by then).
"""

from __future__ import annotations

import functools
import re

from tuned_rl import (CgroupDir, Change, CpuList, Key, Problem, Step, Table, TargetError, ValueType, cgroup_settings,
                     family, format_cpu_list, hookimpl, in_family, is_target_process, parse_cgroup_file,
                     parse_cpu_list, target_from_table, target_processes, unit_cgroup)

OFFLINE = "tuned-rl-offline"
MATCH_KEYS = ("name", "cmdline", "user", "cgroup", "unit")
IO_CLASSES = {"idle": "idle:0", "best-effort": "best-effort:7"}


class Matchers(ValueType):
    """A list of tables, each with at least one of name, cmdline, user, cgroup, unit."""

    base = list
    description = "a list of matchers ([[offline_eviction.match]] tables)"

    def check(self, value, host):
        if not value:
            return "names no matcher"
        for index, matcher in enumerate(value):
            where = f"matcher {index + 1}"
            if not isinstance(matcher, dict) or not matcher:
                return f"{where}: a table with at least one of {', '.join(MATCH_KEYS)}"
            unknown = [k for k in matcher if k not in MATCH_KEYS]
            if unknown:
                return f"{where}: unknown key {unknown[0]!r} (known: {', '.join(MATCH_KEYS)})"
            for key, text in matcher.items():
                if not isinstance(text, str) or not text:
                    return f"{where}: {key} must be non-empty text, not {text!r}"
                if key in ("name", "cmdline"):
                    try:
                        re.compile(text)
                    except re.error as err:
                        return f"{where}: {key} {text!r} is not a regular expression: {err}"
        return None


TUNED_RL_PLUGIN_API = "0.2"

TABLE = Table(
    "offline_eviction",
    "Move offline jobs out of the workload's way: a cgroup with minimal CPU weight, and per-thread options.",
    {
        "match": Key(Matchers(), "Which processes are offline jobs.", required=True),
        "cgroup": Key(bool, "Move them into the tuned-rl-offline cgroup, minimal CPU weight (default true)."),
        "cpus": Key(CpuList(), "CPUs the jobs may use (a cpuset), e.g. the housekeeping CPUs."),
        "policy": Key(str, "Scheduling policy for each of their threads.", choices=("SCHED_IDLE", "SCHED_BATCH")),
        "nice": Key(int, "Nice for each of their threads.", minimum=-20, maximum=19),
        "io_class": Key(str, "I/O class for each of their threads.", choices=tuple(IO_CLASSES)),
    },
    phase="placement",
)


INHERITED = "inherited "  # the offline cgroup's value keys that name what its jobs were set to, not files
DEFAULTS = {"sched": "SCHED_OTHER:0", "nice": "0", "io": "none:0"}  # a task whose ancestors are all evicted


class OfflineCgroup(CgroupDir):
    """tuned-rl-offline: a ``cgroup_dir`` whose value also says what its jobs' threads were set to
    (``"inherited sched": "SCHED_IDLE:0"``, ``"inherited nice"``, ``"inherited io"``: never files).

    A job forked after its eviction has children born inside, at its policy, nice and I/O class;
    `tuned-rl watch` journals their undo when it reads the fork, but a watch killed before that
    leaves them in no record. So undo first gives each thread still inside that holds an evicted
    value the value of the process it goes back to (its nearest ancestor outside; the kernel's
    defaults if there is none), then moves it out and removes the cgroup as ``cgroup_dir`` does."""

    name = "offline_cgroup"

    def read(self, host, change):
        if not host.is_dir(change.target):
            return None
        keys = {k for v in (change.before, change.after) if isinstance(v, dict) for k in v if not k.startswith(INHERITED)}
        value = {k: host.read(f"{change.target}/{k}") for k in sorted(keys)}
        value.update(_inherited(change.after))
        return value

    def write(self, host, change, value):
        if value is None and host.is_dir(change.target):
            _reset_inherited(host, change.target, _inherited(change.after))
        super().write(host, change, None if value is None else {k: v for k, v in value.items()
                                                                if not k.startswith(INHERITED)})

    def show(self, value):
        return super().show(None if value is None else {k: v for k, v in value.items() if not k.startswith(INHERITED)})


def _inherited(value) -> dict:
    return {k: v for k, v in value.items() if k.startswith(INHERITED)} if isinstance(value, dict) else {}


def _reset_inherited(host, directory: str, inherited: dict) -> None:
    """Give each thread in ``directory`` that holds an evicted value its ancestor's (see OfflineCgroup)."""
    if not inherited:
        return
    mount = host.cgroup_mount(directory)
    leaving = "/" + directory[len(mount.mount_point):].strip("/")
    access = {"sched": (host.get_sched, host.set_sched), "nice": (host.get_nice, host.set_nice),
              "io": (host.get_io_priority, host.set_io_priority)}
    for tid in host.cgroup_tasks(directory, threads=True):
        try:
            task = host.task(tid)
            ancestor = _ancestor_outside(host, tid, mount.key, leaving)
            for key, evicted in inherited.items():
                get, put = access[key[len(INHERITED):]]
                if get(task) == evicted:
                    put(task, get(ancestor.task) if ancestor is not None else DEFAULTS[key[len(INHERITED):]])
        except (LookupError, OSError):
            continue  # exited meanwhile (or refused): it still leaves the cgroup below


def _ancestor_outside(host, tid: int, key: str, leaving: str):
    """The nearest ancestor process of ``tid`` whose cgroup (of hierarchy ``key``) is not ``leaving``; None if none but PID 1."""
    pid = tid
    for _ in range(64):
        ppid = host.process(pid).ppid
        if ppid <= 1:
            return None
        parent = host.process(ppid)
        if parent.cgroups.get(key) != leaving:
            return parent
        pid = ppid
    return None


@hookimpl
def tuned_rl_tables():
    return [TABLE]


@hookimpl
def tuned_rl_change_kinds():
    return [OfflineCgroup()]


@hookimpl
def tuned_rl_validate(profile, host):
    table = profile.get("offline_eviction")
    if table is None:
        return None
    problems = []
    if not table.get("cgroup", True) and not any(k in table for k in ("cpus", "policy", "nice", "io_class")):
        problems.append(Problem("offline_eviction", "cgroup = false and no per-thread option: nothing to do"))
    if "cpus" in table and not table.get("cgroup", True):
        problems.append(Problem("offline_eviction.cpus", "cpus is the jobs' cpuset: it needs cgroup = true"))
    if "cpus" in table and profile.get("cpu_isolation") is not None:
        problems.append(Problem("offline_eviction.cpus", "[cpu_isolation] already puts the jobs on the housekeeping "
                                                         "CPUs: drop cpus here"))
    for index, matcher in enumerate(table.get("match") or []):
        if "unit" in matcher:
            try:
                unit_cgroup(host, matcher["unit"])
            except TargetError as err:
                problems.append(Problem(f"offline_eviction.match.{index + 1}.unit", str(err)))
    return problems


@hookimpl
def tuned_rl_plan(profile, host):
    table = profile.get("offline_eviction")
    if table is None:
        return None
    step = Step("offline_eviction", "evict offline jobs", verb="evicted")
    jobs, spared = match_jobs(host, table["match"], profile.get("target"))
    step.notes += [f"spared pid {p.pid} ({p.comm}): {why}" for p, why in spared]
    if not jobs:
        step.skip_reason = "no running process matches" + (" (but some were spared: see the notes)" if spared else "")
        return [step]
    step.notes += [f"matched pid {p.pid} ({p.comm}): {why}" for p, why in jobs]
    _plan_jobs(host, table, step, [p for p, _ in jobs])
    return [step]


@hookimpl
def tuned_rl_plan_process(profile, host, process):
    """A job that started after the apply: evicted as the apply would have, with its descendants
    (children it forked before this move stay where it was, and would otherwise escape)."""
    table = profile.get("offline_eviction")
    if table is None or process.kernel_thread or process.pid == 1:
        return None
    user_name = functools.lru_cache(maxsize=None)(host.user_name)
    units = {m["unit"]: _unit_relative(host, m["unit"]) for m in table["match"] if "unit" in m}
    why = next((w for w in (_matches(user_name, process, m, units) for m in table["match"]) if w), None)
    if why is None:
        why = _forked_by_evicted_job(host, process)  # forked during its parent's move, then exec'd
    if why is None:
        return None
    target = profile.get("target")
    if in_family(host, process) or target and not target.get("canary") and is_target_process(
            host, target_from_table(target)[0], process):
        return None
    jobs = [process] + [p for p in _descendants(host, process.pid) if not p.kernel_thread]
    step = Step("offline_eviction", f"evict offline job pid {process.pid} ({process.comm})", verb="evicted")
    step.notes.append(f"matched pid {process.pid} ({process.comm}): {why}")
    _plan_jobs(host, table, step, jobs)
    return [step]


def _plan_jobs(host, table: dict, step: Step, processes: list) -> None:
    """Add to ``step`` the changes that evict ``processes`` (or set its skip reason)."""
    if table.get("cgroup", True):
        inherited = {f"{INHERITED}sched": f"{table['policy']}:0"} if "policy" in table else {}
        if "nice" in table:
            inherited[f"{INHERITED}nice"] = str(table["nice"])
        if "io_class" in table:
            inherited[f"{INHERITED}io"] = IO_CLASSES[table["io_class"]]
        changes, reason = cgroup_changes(host, processes, table.get("cpus"), inherited)
        if reason:
            step.skip_reason = reason
            return
        step.changes += changes
    for process in processes:
        for thread in host.threads(process.pid):
            if "policy" in table and thread.sched != f"{table['policy']}:0":
                step.changes.append(Change("sched", "", thread.sched, f"{table['policy']}:0", task=thread.task))
            if "nice" in table:
                step.changes.append(Change("nice", "", str(thread.nice), str(table["nice"]), task=thread.task))
            if "io_class" in table:
                try:
                    before = host.get_io_priority(thread.task)
                except LookupError:
                    continue  # exited since it was listed
                step.changes.append(Change("io_priority", "", before, IO_CLASSES[table["io_class"]], task=thread.task))


def _offline_cgroup(host, directory: str, settings: dict, inherited: dict | None) -> Change:
    before = cgroup_settings(host, directory, list(settings))
    if before is not None:  # it is there already (an earlier record made it): its settings alone
        return Change("cgroup_dir", directory, before, settings)
    return Change("offline_cgroup", directory, None, {**settings, **(inherited or {})})


def _forked_by_evicted_job(host, process) -> str | None:
    """Why a process that no matcher names is a job all the same: its parent is in the offline
    cgroup. A child forked while its parent was being moved can miss the move, and may have exec'd
    another program by the time it is seen."""
    if not any(path != f"/{OFFLINE}" for path in process.cgroups.values()) or process.ppid <= 1:
        return None
    try:  # the parent's cgroups alone: asked of every process on each rescan of /proc
        parent_cgroups = parse_cgroup_file(host.read_proc(f"{int(process.ppid)}/cgroup"))
    except OSError:
        return None
    if any(path == f"/{OFFLINE}" for path in parent_cgroups.values()):
        return f"forked by pid {process.ppid}, an evicted job"
    return None


def _target_tgids(host, target_table: dict | None) -> set[int]:
    if target_table is None or target_table.get("canary"):
        return set()
    try:
        return {p.tgid for p in target_processes(host, target_table)}
    except TargetError:
        return set()


def _descendants(host, pid: int) -> list:
    """The processes below ``pid`` (children, their children, ...), read now."""
    found, seen, below = [], {pid}, [pid]
    while below:
        for child in host.children(below.pop()):
            if child in seen:
                continue
            seen.add(child)
            try:
                found.append(host.process(child))
            except LookupError:
                continue
            below.append(child)
    return found


def match_jobs(host, matchers: list[dict], target_table: dict | None) -> tuple[list, list]:
    """(matched processes with why, spared processes with why), each a list of (ProcessInfo, str)."""
    target = _target_tgids(host, target_table)
    processes = host.processes()
    ours = family(host, processes)
    units = {m["unit"]: _unit_relative(host, m["unit"]) for m in matchers if "unit" in m}
    user_name = functools.lru_cache(maxsize=None)(host.user_name)  # /etc/passwd once, not per process
    matched, spared = [], []
    for process in processes:
        why = next((w for w in (_matches(user_name, process, m, units) for m in matchers) if w), None)
        if why is None:
            continue
        reason = ("it is the [target]" if process.tgid in target else "PID 1" if process.pid == 1
                  else "a kernel thread" if process.kernel_thread else "tuned-rl itself or its helper"
                  if process.pid in ours else None)
        (spared if reason else matched).append((process, f"{why}; {reason}" if reason else why))
    return matched, spared


def _matches(user_name, process, matcher: dict, units: dict) -> str | None:
    reasons = []
    for key, wanted in matcher.items():
        if key == "name" and re.search(wanted, process.comm):
            reasons.append(f"name {process.comm!r} matches {wanted!r}")
        elif key == "cmdline" and re.search(wanted, process.cmdline):
            reasons.append(f"command line matches {wanted!r}")
        elif key == "user" and user_name(process.uid) == wanted:
            reasons.append(f"runs as {wanted}")
        elif key == "cgroup" and any(_below(path, wanted) for path in process.cgroups.values()):
            reasons.append(f"in cgroup {wanted}")
        elif key == "unit" and units.get(wanted) and any(_below(p, units[wanted]) for p in process.cgroups.values()):
            reasons.append(f"in unit {wanted}")
        else:
            return None
    return ", ".join(reasons)


def cgroup_changes(host, processes: list, cpus: str | None, inherited: dict | None = None
                   ) -> tuple[list[Change], str | None]:
    """Changes creating tuned-rl-offline (and its cpuset) and moving ``processes`` in; or a skip reason.
    ``inherited``: what the jobs' threads are set to (OfflineCgroup), kept in the cpu cgroup's value."""
    changes, moves = [], []
    cpu_v1 = host.cgroup_v1_mount("cpu")
    v2 = next((m.mount_point for m in host.cgroup_mounts() if m.version == 2
               and "cpu" in _read_words(host, f"{m.mount_point}/cgroup.subtree_control")), None)
    if cpu_v1 is not None:
        directory = f"{cpu_v1}/{OFFLINE}"
        # cpu.idle (Linux 5.15, v1 too): the group counts as SCHED_IDLE, so a waking workload thread
        # preempts its tasks at once, and its weight becomes the kernel's minimum (3; cpu.shares then
        # reads 3 and refuses writes). Without it, cpu.shares 2: a low weight, but no such preemption.
        settings = {"cpu.idle": "1"} if host.exists(f"{cpu_v1}/cpu.idle") else {"cpu.shares": "2"}
        changes.append(_offline_cgroup(host, directory, settings, inherited))
        moves.append((cpu_v1, host.cgroup_mount(cpu_v1).key))
        if cpus is not None:
            cpuset = host.cgroup_v1_mount("cpuset")
            if cpuset is None:
                return [], "cpus needs a cpuset hierarchy, and this host mounts none"
            settings = {"cpuset.cpus": format_cpu_list(parse_cpu_list(cpus)), "cpuset.mems": host.read(
                f"{cpuset}/cpuset.mems")}
            changes.append(Change("cgroup_dir", f"{cpuset}/{OFFLINE}", cgroup_settings(host, f"{cpuset}/{OFFLINE}",
                                                                              list(settings)), settings))
            moves.append((cpuset, host.cgroup_mount(cpuset).key))
    elif v2 is not None:
        settings = {"cpu.weight": "1"}
        if _kernel_at_least(host, (5, 15)):  # cpu.idle: the group as SCHED_IDLE
            settings["cpu.idle"] = "1"
        if cpus is not None:
            if "cpuset" not in _read_words(host, f"{v2}/cgroup.subtree_control"):
                return [], f"cpus needs the cpuset controller enabled below the root ({v2}/cgroup.subtree_control)"
            settings["cpuset.cpus"] = format_cpu_list(parse_cpu_list(cpus))
        changes.append(_offline_cgroup(host, f"{v2}/{OFFLINE}", settings, inherited))
        moves.append((v2, ""))
    else:
        return [], "no cpu cgroup controller on this host (neither v1 cpu nor v2 with cpu enabled)"
    for mount, key in moves:
        changes += [Change("process_cgroup", mount, p.cgroups.get(key, "/"), f"/{OFFLINE}", task=p.task)
                    for p in processes]
    return changes, None


def _kernel_at_least(host, version: tuple[int, int]) -> bool:
    try:
        release = host.read("/proc/sys/kernel/osrelease")
        return tuple(int(x) for x in re.findall(r"\d+", release)[:2]) >= version
    except (OSError, ValueError):
        return False


def _unit_relative(host, unit: str) -> str | None:
    try:
        directory = unit_cgroup(host, unit)
        mount = host.cgroup_mount(directory)
        return "/" + directory[len(mount.mount_point):].strip("/")
    except (TargetError, LookupError):
        return None


def _below(path: str, wanted: str) -> bool:
    wanted = "/" + wanted.strip("/")
    return path == wanted or path.startswith(wanted.rstrip("/") + "/")


def _read_words(host, path: str) -> list[str]:
    return host.read(path).split() if host.exists(path) else []
