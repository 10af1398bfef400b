"""[numa]: bind the workload's CPUs and memory to one NUMA node, as `numactl --cpunodebind --membind` does.

    [numa]
    node = 1                      # or gpu = "0000:3b:00.0" / gpu = "nvidia0": the GPU's node
    unit = "llm.service"          # optional: a systemd drop-in, so the service starts bound
    restart = false               # restart the unit after adding (and after removing) the drop-in
    running = true                # the [target]'s running processes too (default true)
    shm = ["/dev/shm/rl-*"]       # shared-memory segments (names or patterns) whose pages to bind

Two steps, each verified:

- **A systemd service** (``unit``): a drop-in ``/etc/systemd/system/UNIT.d/tuned-rl-numa.conf``
  with ``NUMAPolicy=bind``, ``NUMAMask=`` and ``CPUAffinity=`` (systemd 243+), then
  ``systemctl daemon-reload``. It takes effect when the service next starts, or at once with
  ``restart = true`` (then the unit is restarted after the drop-in is added and again after it is
  removed). Undo removes the drop-in (and the directory, if tuned-rl made it) and reloads.
- **Running processes** (the ``[target]``): each thread's CPU affinity set to the node's CPUs,
  and each process's pages moved to the node (migrate_pages(2)). Undo restores each thread's
  affinity exactly. Pages cannot be put back page by page: undo moves them back only where the
  node they are on now held none of them before (all on node 0, bound to node 1: back to node
  0). Pages that were spread over both nodes stay on the bound node, which they were allowed
  on; the kernel's NUMA balancing may move them later. The plan lists each process's share of
  resident pages on the node before.

- **Shared-memory segments** (``shm``): each file in /dev/shm that a name or pattern matches gets
  the shared memory policy ``bind:NODE`` (mbind(2) with ``MPOL_MF_MOVE_ALL`` on a mapping of it:
  the policy is the file's, for every process that maps it, and its pages move to the node).
  The plan, the report and ``status`` show the share of its pages on the node, as the process
  that maps most of it counts them in its numa_maps. Undo gives the segment its previous policy
  back. A segment that was removed or replaced since is left alone ("gone").

`tuned-rl watch` binds each workload process that starts later the same way (its threads'
affinity and its pages), while the running-processes step is in force, and each segment a
workload process maps once it runs (1 s and 5 s after it starts, then at each rescan).

On a host with one NUMA node, or a virtual machine whose topology shows one (it may hide the
real host's), the process and service steps are skipped and say why: binding would change
nothing. A segment is bound there too (its policy then reads ``bind:0``, which a check of the
node can rely on), and the plan says that no page moves.
"""

from __future__ import annotations

import fnmatch
import re

from tuned_rl import (Change, Key, Kind, NumaError, Problem, SEGMENT_NAME, SHM_DIRECTORY, SegmentGone, Step, Table,
                     format_cpu_list, hookimpl, is_target_process, mapped_segments, node_of, page_shares,
                     parse_cpu_list, parse_policy, printable, resident_pages, target_from_table, topology, user_id,
                     workload_for_step)

UNIT = re.compile(r"^[A-Za-z0-9@_.:\-]+\.service$")
DROP_IN = "tuned-rl-numa.conf"
SEGMENT_PATTERN = re.compile(r"^/dev/shm/[A-Za-z0-9_.@:+,=\-*?\[\]!]{1,255}$")
MIN_SHARE = 0.01  # a node holding less of a process's pages than this does not count as holding them

TUNED_RL_PLUGIN_API = "0.2"

TABLE = Table(
    "numa",
    "Bind the workload's CPUs and memory to one NUMA node (or its GPU's).",
    {
        "node": Key(int, "The NUMA node.", minimum=0, maximum=1023),
        "gpu": Key(str, 'A GPU whose node to use: a PCI address ("0000:3b:00.0") or "nvidia0".'),
        "unit": Key(str, "A systemd service to bind from its next start (a drop-in)."),
        "running": Key(bool, "Bind the [target]'s running processes too (default true)."),
        "restart": Key(bool, "Restart the unit after the drop-in is added, and again after it is removed "
                             "(default false: it takes effect at the unit's next start)."),
        "shm": Key(list, 'Shared-memory segments to bind: "/dev/shm/NAME", or a pattern ("/dev/shm/rl-*"). Only '
                         "segments owned by root or by one of the [target]'s users are bound (/dev/shm is "
                         "every user's: another user's rl-evil is left alone, and the plan says so)."),
        "owners": Key(list, "With shm: more accounts (names, or uids as text) whose segments may be bound.",
                      item_type=(str, int)),
    },
    phase="placement",
)


class NumaPages(Kind):
    """Where a process's pages are: ``{"nodes": "0-1", "share": "25% of 400 pages on node 1"}``.

    ``nodes`` lists the nodes holding at least 1% of its resident pages; ``share`` (read, never
    written) says how much is on the node the step binds to. Writing moves the pages on other
    nodes to the wanted ones (migrate_pages(2)); a value holds when no node outside it has 1%
    of the pages (a few shared pages may not move). The report shows where the pages ended up."""

    name = "numa_pages"
    task = True
    shows_read_back = True

    def read(self, host, change):
        pages = page_shares(host, change.task.pid)
        total = sum(pages.values())
        wanted = parse_cpu_list(change.after["nodes"])
        share = sum(pages.get(n, 0) for n in wanted) / total if total else 0.0
        return {"nodes": format_cpu_list(_holding(pages)) or change.after["nodes"],
                "share": f"{share:.0%} of {total} pages on node {change.after['nodes']}"}

    def write(self, host, change, value):
        wanted = parse_cpu_list(value["nodes"])
        current = _holding(page_shares(host, change.task.pid))
        if current - wanted:
            host.migrate_pages(change.task, current - wanted, wanted)

    def same(self, a, b):
        try:
            return parse_cpu_list(a["nodes"]) <= parse_cpu_list(b["nodes"])
        except (ValueError, TypeError, KeyError):
            return a == b

    def show(self, value):
        return f"nodes {value['nodes']}" + (f" ({value['share']})" if value.get("share") else "")

    def valid_value(self, value):
        try:
            return (isinstance(value, dict) and set(value) <= {"nodes", "share"} and isinstance(value.get("nodes"), str)
                    and bool(parse_cpu_list(value["nodes"])) and isinstance(value.get("share", ""), str))
        except ValueError:
            return False


class ShmPolicy(Kind):
    """A shared-memory segment's memory policy: ``{"policy": "bind:0", "inode": 1234, "share": "..."}``.

    The target is the segment's path; ``inode`` is the file planned, which a write and a read
    check (a segment removed or replaced since is "gone"). ``share`` (read, never written) says
    how much of its pages are on the node the change binds to."""

    name = "shm_policy"
    shows_read_back = True

    def read(self, host, change):
        found = host.segment_policy(change.target)
        if found.inode != change.after["inode"]:
            raise SegmentGone(f"{change.target} is another file now (inode {found.inode}, tuned-rl's was "
                              f"{change.after['inode']})")
        return {"policy": found.policy, "inode": found.inode,
                "share": segment_share(host, change.target, _policy_nodes(change.after["policy"]))}

    def write(self, host, change, value):
        host.set_segment_policy(change.target, value["policy"], value["inode"])

    def same(self, a, b):
        return (a or {}).get("policy") == (b or {}).get("policy") and (a or {}).get("inode") == (b or {}).get("inode")

    def show(self, value):
        return value["policy"] + (f" ({value['share']})" if value.get("share") else "")

    def valid_value(self, value):
        return (isinstance(value, dict) and set(value) <= {"policy", "inode", "share"}
                and isinstance(value.get("policy"), str) and _policy_nodes(value["policy"]) is not None
                and isinstance(value.get("inode"), int) and value["inode"] > 0
                and isinstance(value.get("share", ""), str))


def _policy_nodes(policy: str) -> set[int] | None:
    """The nodes a policy names ("bind:0-1" -> {0, 1}; "default" -> set()), None if it is not one."""
    try:
        return parse_policy(policy)[1]
    except ValueError:
        return None


def segment_share(host, path: str, nodes: set[int], mappers: list[int] | None = None) -> str:
    """"100% of 1024 pages on node 0", as the process mapping most of the segment counts them."""
    if mappers is None:
        mappers = mapped_segments(host).get(path, [])
    if not mappers:
        return "no process maps it now"
    pages = resident_pages(host, path, mappers)
    total = sum(pages.values())
    on = sum(pages.get(n, 0) for n in nodes)
    where = f"node {format_cpu_list(nodes)}" if nodes else "no node named"
    return f"{on / total:.0%} of {total} pages on {where}" if total else f"no page resident ({where})"


def _holding(pages: dict[int, int]) -> set[int]:
    """The nodes holding at least MIN_SHARE of these pages."""
    total = sum(pages.values())
    return {node for node, count in pages.items() if total and count / total >= MIN_SHARE}


@hookimpl
def tuned_rl_tables():
    return [TABLE]


@hookimpl
def tuned_rl_change_kinds():
    return [NumaPages(), ShmPolicy()]


@hookimpl
def tuned_rl_validate(profile, host):
    table = profile.get("numa")
    if table is None:
        return None
    problems = []
    if ("node" in table) == ("gpu" in table):
        problems.append(Problem("numa", "name exactly one of node and gpu"))
    if "unit" in table and not UNIT.match(table["unit"]):
        problems.append(Problem("numa.unit", f"{table['unit']!r} is not a systemd service name (\"llm.service\")"))
    running = table.get("running", True)
    target = profile.get("target")
    for pattern in table.get("shm", []):
        if not isinstance(pattern, str) or not SEGMENT_PATTERN.match(pattern):
            problems.append(Problem("numa.shm", f"{printable(str(pattern))!r} is not a segment in {SHM_DIRECTORY} "
                                                "(\"/dev/shm/NAME\", or a pattern such as \"/dev/shm/rl-*\")"))
    if "owners" in table and "shm" not in table:
        problems.append(Problem("numa.owners", "owners goes with shm: the users whose segments may be bound"))
    for owner in table.get("owners", []):
        if user_id(host, str(owner)) is None:
            problems.append(Problem("numa.owners", f"no account {printable(str(owner))!r} on this host"))
    if running and (target is None or target.get("canary")) and "unit" not in table \
            and ("shm" not in table or "running" in table):
        problems.append(Problem("numa", "bind what? name the workload in [target] (pid, name, cgroup or unit), "
                                        "or a unit here"))
    if problems:
        return problems
    try:
        node = node_of(host, table)
        nodes = topology(host)
        if len(nodes.nodes) > 1 or node != 0:  # node 0 of a one-node host (or one without NUMA): skipped in plan
            nodes.node_cpus(node)
    except NumaError as err:
        problems.append(Problem("numa.gpu" if "gpu" in table else "numa.node", str(err)))
    return problems


@hookimpl
def tuned_rl_plan(profile, host):
    table = profile.get("numa")
    if table is None:
        return None
    node = node_of(host, table)
    nodes = topology(host)
    steps = []
    if "unit" in table:
        steps.append(Step("numa", f"bind {table['unit']} to node {node} from its next start"))
    target = profile.get("target")
    if table.get("running", True) and target is not None and not target.get("canary"):
        steps.append(Step("numa", f"bind the workload's running processes to node {node}"))
    if len(nodes.nodes) < 2:
        reason = "this host has one NUMA node: binding to it changes nothing"
        if _is_virtual_machine(host):
            reason += (" (a virtual machine: its one node may hide the host's topology; ask for the guest's vCPUs "
                       "and memory on one host node, or for virtual NUMA)")
        for step in steps:
            step.skip_reason = reason
        if table.get("shm"):
            steps.append(_plan_segments(host, table, node, target))
            steps[-1].notes.append("this host has one NUMA node: no page moves; the segments' policy says bind:"
                                   f"{node} for a check of the node to read")
        return steps
    cpus = format_cpu_list(nodes.node_cpus(node))
    for step in steps:
        if step.title.startswith("bind the workload"):
            _plan_running(host, step, profile.get("target"), node, cpus)
        else:
            step.changes += drop_in_changes(host, table["unit"], node, cpus, table.get("restart", False))
    if table.get("shm"):
        steps.append(_plan_segments(host, table, node, target))
    return steps


@hookimpl
def tuned_rl_plan_process(profile, host, process):
    """A workload process that started after the apply: bound to the node as the running-processes
    step binds the others (each thread's affinity, its pages). Nothing on a one-node host."""
    table, target = profile.get("numa"), profile.get("target")
    if table is None or not target or target.get("canary") or process.kernel_thread:
        return None
    if not is_target_process(host, target_from_table(target)[0], process):
        return None
    nodes, node, steps = topology(host), node_of(host, table), []
    if table.get("running", True) and len(nodes.nodes) > 1:
        step = Step("numa", f"bind the workload's new process pid {process.pid} ({printable(process.comm)}) "
                            f"to node {node}")
        _plan_processes(host, step, [process], node, format_cpu_list(nodes.node_cpus(node)))
        steps.append(step)
    if table.get("shm"):
        mapped = mapped_segments(host, [process.pid])
        step = Step("numa", f"bind the shared-memory segments pid {process.pid} ({printable(process.comm)}) maps "
                            f"to node {node}")
        _plan_segment_changes(host, step, _matching(table["shm"], [p[len(SHM_DIRECTORY) + 1:] for p in mapped]),
                              node, mapped, segment_owners(host, table, target))
        steps.append(step)
    return steps


def _matching(patterns: list[str], names: list[str]) -> list[str]:
    """The segment paths among ``names`` (files in /dev/shm) that a pattern matches, in order."""
    wanted = [p[len(SHM_DIRECTORY) + 1:] for p in patterns]
    return [f"{SHM_DIRECTORY}/{name}" for name in sorted(set(names))
            if any(fnmatch.fnmatchcase(name, pattern) for pattern in wanted)]


def segment_owners(host, table: dict, target: dict | None) -> set[int]:
    """The users whose segments [numa] shm may bind: root, the [target]'s users, and ``owners``."""
    names = [*(target or {}).get("users", ["root"]), *table.get("owners", [])]
    return {0} | {uid for uid in (user_id(host, str(name)) for name in names) if uid is not None}


def _plan_segments(host, table: dict, node: int, target: dict | None) -> Step:
    """The step that binds every segment the patterns match now."""
    patterns = table["shm"]
    step = Step("numa", f"bind shared-memory segments {', '.join(patterns)} to node {node}")
    paths = _matching(patterns, host.segment_names())
    if not paths:
        later = ("`tuned-rl watch` binds each one a workload process maps" if target and not target.get("canary")
                 else "apply again once they exist")
        step.skip_reason = f"no segment in {SHM_DIRECTORY} matches now: {later}"
        return step
    _plan_segment_changes(host, step, paths, node, mapped_segments(host), segment_owners(host, table, target))
    return step


def _plan_segment_changes(host, step: Step, paths: list[str], node: int, mapped: dict[str, list[int]],
                          owners: set[int]) -> None:
    """Add to ``step`` each segment's policy ``bind:node``; a segment tuned-rl will not touch (another
    user's: not one of ``owners``) is a note."""
    for path in paths:
        name = path[len(SHM_DIRECTORY) + 1:]
        if not SEGMENT_NAME.match(name):
            step.notes.append(f"left alone: {printable(path)!r} is not a segment name tuned-rl touches "
                              "(letters, digits and _.@:+,=- only)")
            continue
        try:
            found = host.segment_policy(path)
        except (OSError, LookupError) as err:
            step.notes.append(f"left alone: {path}: {err}")
            continue
        if found.owner not in owners:
            step.notes.append(f"left alone: {printable(path)} belongs to {printable(host.user_name(found.owner))}, "
                              "not root or a [target] user (add it to [numa] owners to bind it)")
            continue
        mappers = mapped.get(path, [])
        share = segment_share(host, path, {node}, mappers)
        step.notes.append(f"placement before: {path} ({found.size} bytes, policy {found.policy}, mapped by "
                          f"{_pids(mappers)}): {share}")
        step.changes.append(Change("shm_policy", path, {"policy": found.policy, "inode": found.inode, "share": share},
                                   {"policy": f"bind:{node}", "inode": found.inode}))


def _pids(pids: list[int]) -> str:
    if not pids:
        return "no process"
    shown = ", ".join(map(str, pids[:5]))
    return f"pid {shown}" + (f" and {len(pids) - 5} more" if len(pids) > 5 else "")


def drop_in_changes(host, unit: str, node: int, cpus: str, restart: bool = False) -> list[Change]:
    directory = f"/etc/systemd/system/{unit}.d"
    path = f"{directory}/{DROP_IN}"
    text = (f"# tuned-rl [numa]: bind {unit} to NUMA node {node} (undone by `tuned-rl rollback`)\n"
            f"[Service]\nNUMAPolicy=bind\nNUMAMask={node}\nCPUAffinity={cpus}\n")
    before = None
    if host.exists(path):
        before = {"mode": host.file_mode(path), "text": host.read_bytes(path).decode("utf-8", "replace")}
    return [Change("directory", directory, "present" if host.is_dir(directory) else None, "present"),
            Change("config_file", path, before, {"mode": 0o644, "text": text},
                   follow_up="systemd-daemon-reload-and-restart" if restart else "systemd-daemon-reload")]


def _plan_running(host, step: Step, target_table: dict, node: int, cpus: str) -> None:
    _plan_processes(host, step, workload_for_step(host, target_table, step), node, cpus)


def _plan_processes(host, step: Step, workload: list, node: int, cpus: str) -> None:
    """Add to ``step`` each process's threads' affinity to ``cpus`` and its pages' move to ``node``."""
    for process in workload:
        for thread in host.threads(process.pid):
            step.changes.append(Change("affinity", "", thread.affinity, cpus, task=thread.task))
        try:
            pages = page_shares(host, process.pid)
        except OSError:
            continue
        total = sum(pages.values())
        share = pages.get(node, 0) / total if total else 0.0
        step.notes.append(f"placement before: pid {process.pid} ({process.comm}) has {share:.0%} of its {total} "
                          f"resident pages on node {node}")
        before = {"nodes": format_cpu_list(_holding(pages)) or str(node),
                  "share": f"{share:.0%} of {total} pages on node {node}"}
        step.changes.append(Change("numa_pages", "", before, {"nodes": str(node)}, task=process.task))


def _is_virtual_machine(host) -> bool:
    try:
        return any("hypervisor" in line.split() for line in host.read("/proc/cpuinfo").splitlines()
                   if line.startswith("flags"))
    except OSError:
        return False
