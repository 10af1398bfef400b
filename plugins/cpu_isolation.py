"""[cpu_isolation]: give the workload CPUs of its own, through cpusets, at run time.

    [target]
    name = "^ray::"               # the workload: pid, name, cgroup or unit (not a canary)

    [cpu_isolation]
    latency_cpus = "2-7"          # housekeeping_cpus: every other online CPU unless given
    kernel_threads = true         # move kernel threads that allow it (default)
    workqueues = true             # unbound workqueues on housekeeping CPUs (default)

    [cpu_isolation.pin]           # optional: one CPU per thread, by thread name
    "^actor" = "2-5"              # each matching thread gets the next CPU of the list
    "^io" = "6"
    "^shm" = "7"

One step. Membership of a cpuset, not a thread's own affinity, keeps a task off the latency
CPUs, so children a moved process forks later stay where it is (per-thread affinity, as TuneD
sets it, lets them escape: its issue #564).

- cgroup v1 (a ``cpuset`` hierarchy): two cpusets are created, ``tuned-rl-workload`` (the
  latency CPUs) and ``tuned-rl-housekeeping``. The workload's processes move into the first;
  every other process in the root cpuset, kernel threads that allow it included, into the
  second. A cpuset someone else made that reaches a latency CPU is narrowed to the
  housekeeping CPUs, deepest first. Per-CPU kernel threads (bound by the kernel) stay.
- cgroup v2 (the ``cpuset`` controller enabled at the root): ``tuned-rl-workload`` is created
  as an ``isolated`` partition, which takes its CPUs away from every other cgroup (and the
  root's kernel threads) and out of load balancing; other cgroups that name a latency CPU in
  their ``cpuset.cpus`` are narrowed first, since a partition's CPUs must be exclusive.
- Pins (``[cpu_isolation.pin]``) set each matching thread's affinity before it moves, so the
  undo can give its affinity back once it has left the workload's cpuset.
- The unbound workqueues' cpumask is set to the housekeeping CPUs.

Undo moves every process back to its exact cpuset, restores each narrowed cpuset, each
pinned affinity and the workqueue mask, and removes the cpusets tuned-rl created (a process
forked into one meanwhile goes where its parent is by then). What only a reboot gives
(``isolcpus``, ``nohz_full``, ``rcu_nocbs``) is recommended in the plan, never applied.
"""

from __future__ import annotations

import re

from tuned_rl import (Change, CpuList, Key, Map, Problem, Step, Table, cgroup_settings, format_cpu_list,
                     format_cpu_mask, hookimpl, is_target_process, named_workload_problem, parse_cpu_list,
                     parse_cpu_mask, target_from_table, workload_for_step)
from tuned_rl_plugins import cpu_split as split_cpus

WORKLOAD = "tuned-rl-workload"
HOUSEKEEPING = "tuned-rl-housekeeping"
WORKQUEUE_MASK = "/sys/devices/virtual/workqueue/cpumask"
BOOT_ARGUMENTS = ("isolcpus", "nohz_full", "rcu_nocbs")
CPUSET_KEYS = ("cpuset.cpus", "cpuset.mems")

TUNED_RL_PLUGIN_API = "0.2"

TABLE = Table(
    "cpu_isolation",
    "Give the workload ([target]) the latency CPUs; every other task goes to the housekeeping CPUs.",
    {
        **split_cpus.shared_keys("cpu_isolation"),
        "kernel_threads": Key(bool, "Move kernel threads that allow it to the housekeeping CPUs (default true)."),
        "workqueues": Key(bool, "Run unbound workqueues on the housekeeping CPUs (default true)."),
        "pin": Key(Map(Key(CpuList(), "CPUs for the threads whose name matches: one each, in turn."),
                       names=None),
                   'Thread-name patterns to CPU lists: "^actor" = "2-5" gives each matching thread its own CPU.'),
    },
    phase="placement",
)


@hookimpl
def tuned_rl_tables():
    return [TABLE]


@hookimpl
def tuned_rl_validate(profile, host):
    table = profile.get("cpu_isolation")
    if table is None:
        return None
    problems = split_cpus.problems(profile, "cpu_isolation", host)
    if (problem := named_workload_problem(profile, "cpu_isolation")) is not None:
        problems.append(problem)
    latency, _ = split_cpus.split(table, host)
    for pattern, cpus in (table.get("pin") or {}).items():
        try:
            re.compile(pattern)
        except re.error as err:
            problems.append(Problem(f"cpu_isolation.pin.{pattern}", f"not a regular expression: {err}"))
        outside = parse_cpu_list(cpus) - latency
        if outside:
            problems.append(Problem(f"cpu_isolation.pin.{pattern}", f"CPUs {format_cpu_list(outside)} are not "
                                                                    "latency CPUs: the workload's cpuset excludes them"))
    return problems


@hookimpl
def tuned_rl_plan(profile, host):
    table = profile.get("cpu_isolation")
    if table is None:
        return None
    latency, housekeeping = split_cpus.split(table, host)
    step = Step("cpu_isolation", f"isolate CPUs {format_cpu_list(latency)} for the workload")
    workload = workload_for_step(host, profile.get("target"), step)
    if not workload:
        return [step]
    v1 = host.cgroup_v1_mount("cpuset")
    v2 = None if v1 else _v2_cpuset_mount(host)
    if v1 is None and v2 is None:
        step.skip_reason = "no cpuset cgroups on this host (neither a v1 cpuset hierarchy nor the v2 cpuset controller)"
        return [step]
    if v2 is not None and "cpuset" not in host.read(f"{v2}/cgroup.subtree_control").split():
        step.skip_reason = (f"the cpuset controller is not enabled below the root cgroup ({v2}/cgroup.subtree_control "
                            "lacks cpuset); systemd enables it for a unit with AllowedCPUs=")
        return [step]
    pins = pin_changes(host, workload, table.get("pin") or {}, step.notes)
    if v1 is not None:
        step.changes += _v1_changes(host, v1, latency, housekeeping, workload, pins, table.get("kernel_threads", True),
                                    step.notes)
    else:
        step.changes += _v2_changes(host, v2, latency, housekeeping, workload, pins, step.notes)
    if table.get("workqueues", True) and host.exists(WORKQUEUE_MASK):
        current = host.read(WORKQUEUE_MASK)
        if parse_cpu_mask(current) & latency:
            step.changes.append(Change("cpumask", WORKQUEUE_MASK, current,
                                       format_cpu_mask((parse_cpu_mask(current) & housekeeping) or housekeeping)))
    step.notes += boot_recommendation(host, latency)
    return [step]


@hookimpl
def tuned_rl_plan_process(profile, host, process):
    """A process that started after the isolation was applied: one of the workload's goes into
    the workload's cpuset with its pins (one placed already: the pins of threads it started or
    renamed since); any other left in the root cpuset (v1) goes to the
    housekeeping one (most inherit it from their parent and need nothing). Nothing while the
    isolation is not in place (deferred until the workload runs, or reverted)."""
    table = profile.get("cpu_isolation")
    if table is None or process.kernel_thread or process.pid == 1:
        return None
    v1 = host.cgroup_v1_mount("cpuset")
    mount = v1 or _v2_cpuset_mount(host)
    if mount is None or not host.is_dir(f"{mount}/{WORKLOAD}"):
        return None
    key = host.cgroup_mount(mount).key
    where = process.cgroups.get(key, "/")
    target = profile.get("target")
    if target and not target.get("canary") and _is_workload(host, target, process):
        if where == f"/{WORKLOAD}":  # placed: a thread it started (or renamed) since may want its pin
            step = Step("cpu_isolation", f"pin the threads of the workload's pid {process.pid} ({process.comm})")
        else:
            step = Step("cpu_isolation", f"place the workload's new process pid {process.pid} ({process.comm})")
        step.changes += pin_changes(host, [process], table.get("pin") or {}, step.notes)
        if where != f"/{WORKLOAD}":
            step.changes.append(Change("process_cgroup", mount, where, f"/{WORKLOAD}", task=process.task))
        return [step] if step.changes else None
    if v1 is None or where != "/" or process.fixed_affinity:
        return None
    step = Step("cpu_isolation", f"keep pid {process.pid} ({process.comm}) off the latency CPUs")
    step.changes.append(Change("process_cgroup", mount, "/", f"/{HOUSEKEEPING}", task=process.task))
    return [step]


def _is_workload(host, target_table: dict, process) -> bool:
    return is_target_process(host, target_from_table(target_table)[0], process)


def pin_changes(host, workload: list, pins: dict[str, str], notes: list[str]) -> list[Change]:
    """Affinity changes giving each thread that matches a pattern the next CPU of its list."""
    if not pins:
        return []
    patterns = [(re.compile(p), sorted(parse_cpu_list(c)), p) for p, c in pins.items()]
    matched: dict[str, list] = {p: [] for _, _, p in patterns}
    for process in workload:
        for thread in host.threads(process.pid):
            for regex, _, name in patterns:
                if regex.search(thread.comm):
                    matched[name].append(thread)
                    break
    changes: list[Change] = []
    patterns_on: dict[int, dict[str, None]] = {}  # each CPU's patterns, in the profile's order
    for _, cpus, name in patterns:
        threads = sorted(matched[name], key=lambda t: t.pid)
        if not threads:
            notes.append(f"pin {name!r}: no thread of the workload matches")
        elif len(threads) > len(cpus):
            notes.append(f"pin {name!r}: {len(threads)} threads for {len(cpus)} CPUs: some share a CPU")
        for index, thread in enumerate(threads):
            cpu = cpus[index % len(cpus)]
            changes.append(Change("affinity", "", thread.affinity, str(cpu), task=thread.task))
            patterns_on.setdefault(cpu, {})[name] = None
    # Each pattern deals its own list from its first CPU: patterns given the same list share its CPUs.
    for cpu, names in sorted(patterns_on.items()):
        if len(names) > 1:
            notes.append(f"pin: CPU {cpu} is given threads of {len(names)} patterns "
                         f"({', '.join(repr(n) for n in names)}): they share it; give each pattern CPUs of its own")
    return changes


def _v1_changes(host, mount: str, latency, housekeeping, workload, pins, kernel_threads: bool,
                notes: list[str]) -> list[Change]:
    mems = host.read(f"{mount}/cpuset.mems")
    changes = [
        Change("cgroup_dir", f"{mount}/{HOUSEKEEPING}", cgroup_settings(host, f"{mount}/{HOUSEKEEPING}", CPUSET_KEYS),
               {"cpuset.cpus": format_cpu_list(housekeeping), "cpuset.mems": mems}),
        Change("cgroup_dir", f"{mount}/{WORKLOAD}", cgroup_settings(host, f"{mount}/{WORKLOAD}", CPUSET_KEYS),
               {"cpuset.cpus": format_cpu_list(latency), "cpuset.mems": mems}),
    ]
    changes += pins  # before the move: see the module's docstring
    workload_pids, key = {p.pid for p in workload}, host.cgroup_mount(mount).key
    changes += [Change("process_cgroup", mount, p.cgroups.get(key, "/"), f"/{WORKLOAD}", task=p.task)
                for p in workload]
    changes += _narrowed_cpusets(host, mount, latency, housekeeping, notes, ours=(HOUSEKEEPING, WORKLOAD))
    bound, moved_kernel = 0, 0
    for process in host.processes():
        if process.pid in workload_pids or process.cgroups.get(key, "/") != "/":
            continue
        if process.kernel_thread and (process.fixed_affinity or not kernel_threads):
            bound += process.fixed_affinity
            continue
        if process.kernel_thread and process.comm == "kthreadd" and process.ppid == 0:
            notes.append("kthreadd cannot leave the root cpuset: kernel threads started later may run on the "
                         "latency CPUs (isolcpus=domain at boot prevents it)")
            continue
        moved_kernel += process.kernel_thread
        changes.append(Change("process_cgroup", mount, "/", f"/{HOUSEKEEPING}", task=process.task))
    if bound:
        notes.append(f"{bound} per-CPU kernel threads stay: the kernel binds them to their CPU")
    return changes


def _v2_changes(host, mount: str, latency, housekeeping, workload, pins, notes: list[str]) -> list[Change]:
    changes = _narrowed_cpusets(host, mount, latency, housekeeping, notes, ours=(WORKLOAD,))
    directory = f"{mount}/{WORKLOAD}"
    changes.append(Change("cgroup_dir", directory, cgroup_settings(host, directory, ("cpuset.cpus",
                                                                                   "cpuset.cpus.partition")),
                          {"cpuset.cpus": format_cpu_list(latency), "cpuset.cpus.partition": "isolated"}))
    changes += pins
    changes += [Change("process_cgroup", mount, p.cgroups.get("", "/"), f"/{WORKLOAD}", task=p.task) for p in workload]
    notes.append("other cgroups and the root's kernel threads lose the latency CPUs to the isolated partition")
    return changes


def _narrowed_cpusets(host, mount: str, latency, housekeeping, notes: list[str], ours: tuple) -> list[Change]:
    """Changes narrowing every cpuset below ``mount`` (but ours) that names a latency CPU, deepest first."""
    found = []
    for child in _below_deepest_first(host, mount, ours):
        if not host.exists(f"{child}/cpuset.cpus"):
            continue
        current = host.read(f"{child}/cpuset.cpus")
        cpus = parse_cpu_list(current) if current.strip() else set()
        if not cpus & latency:
            continue
        if not cpus - latency:
            notes.append(f"{child} has only latency CPUs ({current}): left as it is, and its tasks with them")
            continue
        found.append(Change("cgroup_dir", child, {"cpuset.cpus": current},
                            {"cpuset.cpus": format_cpu_list(cpus & housekeeping or cpus - latency)}))
    return found


def _below_deepest_first(host, mount: str, ours: tuple) -> list[str]:
    """Every directory below ``mount`` but ours, each after all of its own (children before parents).
    A loop, not recursion: a delegated subtree can nest cgroups deeper than Python's recursion limit
    (about 950 levels raised RecursionError)."""
    order: list[str] = []
    stack: list[tuple[str, bool]] = [(mount, False)]
    while stack:
        directory, expanded = stack.pop()
        if expanded:
            if directory != mount:
                order.append(directory)
            continue
        stack.append((directory, True))
        children = [c for c in host.subdirs(directory) if not (directory == mount and c.rsplit("/", 1)[1] in ours)]
        stack += [(child, False) for child in reversed(children)]
    return order


def _v2_cpuset_mount(host) -> str | None:
    for mount in host.cgroup_mounts():
        if mount.version == 2 and host.exists(f"{mount.mount_point}/cgroup.controllers") \
                and "cpuset" in host.read(f"{mount.mount_point}/cgroup.controllers").split():
            return mount.mount_point
    return None


def boot_recommendation(host, latency: set[int]) -> list[str]:
    """What only a reboot gives, if the kernel was not booted with it."""
    try:
        arguments = host.read("/proc/cmdline").split()
    except OSError:
        return []
    missing = [name for name in BOOT_ARGUMENTS if not any(a.startswith(name + "=") for a in arguments)]
    if not missing:
        return []
    cpus = format_cpu_list(latency)
    values = {"isolcpus": f"isolcpus=managed_irq,domain,{cpus}", "nohz_full": f"nohz_full={cpus}",
              "rcu_nocbs": f"rcu_nocbs={cpus}"}
    return ["recommended, needs a reboot (tuned-rl never changes the kernel command line): "
            + " ".join(values[m] for m in missing)]
