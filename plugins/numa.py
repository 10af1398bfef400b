"""[numa]: bind the workload's CPUs and memory to one NUMA node, as `numactl --cpunodebind --membind` does.

    [numa]
    node = 1                      # or gpu = "0000:3b:00.0" / gpu = "nvidia0": the GPU's node
    unit = "llm.service"          # optional: a systemd drop-in, so the service starts bound
    restart = false               # restart the unit after adding (and after removing) the drop-in
    running = true                # the [target]'s running processes too (default true)

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

`tuned-rl watch` binds each workload process that starts later the same way (its threads'
affinity and its pages), while the running-processes step is in force.

On a host with one NUMA node, or a virtual machine whose topology shows one (it may hide the
real host's), the steps are skipped and say why: binding would change nothing.
"""

from __future__ import annotations

import re

from tuned_rl import Change, Key, Kind, Problem, Step, Table, hookimpl
from tuned_rl.host import format_cpu_list, parse_cpu_list
from tuned_rl.host.numa import NumaError, node_of, page_shares, topology
from tuned_rl.measure.targets import is_target_process, target_from_table, workload_for_step

UNIT = re.compile(r"^[A-Za-z0-9@_.:\-]+\.service$")
DROP_IN = "tuned-rl-numa.conf"
MIN_SHARE = 0.01  # a node holding less of a process's pages than this does not count as holding them

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


def _holding(pages: dict[int, int]) -> set[int]:
    """The nodes holding at least MIN_SHARE of these pages."""
    total = sum(pages.values())
    return {node for node, count in pages.items() if total and count / total >= MIN_SHARE}


@hookimpl
def tuned_rl_tables():
    return [TABLE]


@hookimpl
def tuned_rl_change_kinds():
    return [NumaPages()]


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
    if running and (target is None or target.get("canary")) and "unit" not in table:
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
        return steps
    cpus = format_cpu_list(nodes.node_cpus(node))
    for step in steps:
        if step.title.startswith("bind the workload"):
            _plan_running(host, step, profile.get("target"), node, cpus)
        else:
            step.changes += drop_in_changes(host, table["unit"], node, cpus, table.get("restart", False))
    return steps


@hookimpl
def tuned_rl_plan_process(profile, host, process):
    """A workload process that started after the apply: bound to the node as the running-processes
    step binds the others (each thread's affinity, its pages). Nothing on a one-node host."""
    table, target = profile.get("numa"), profile.get("target")
    if table is None or not table.get("running", True) or not target or target.get("canary") \
            or process.kernel_thread:
        return None
    nodes = topology(host)
    if len(nodes.nodes) < 2 or not is_target_process(host, target_from_table(target)[0], process):
        return None
    node = node_of(host, table)
    step = Step("numa", f"bind the workload's new process pid {process.pid} ({process.comm}) to node {node}")
    _plan_processes(host, step, [process], node, format_cpu_list(nodes.node_cpus(node)))
    return [step]


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
