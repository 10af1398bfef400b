"""The seeds' causes, checked against what diagnose measured: each finding names its evidence and
the profile table that addresses it (or says that no table in the guest can).

Pure: every input is in an Evidence; the rules and their thresholds are here, in one place.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tuned_rl.diagnose.facts import Machine, RtBudget, TargetThread
from tuned_rl.measure.holders import Holder, Ranking
from tuned_rl.host import printable
from tuned_rl.host.cpus import format_cpu_list, parse_cpu_list
from tuned_rl.host.tasks import CMDLINE_LIMIT
from tuned_rl.measure.probes.migrations import ThreadMoves

REAL_TIME = ("SCHED_FIFO", "SCHED_RR")
OFFLINE_SHARE = 0.20      # other processes' share of the worst-1% wait that makes them the cause
OFFLINE_HOLDER_SHARE = 0.02  # a process below this share is not named in the matchers
THROTTLED_SHARE = 0.20    # of an RT target's worst-1% wait, spent while idle or a lower policy ran
IRQ_SHARE = 0.05          # interrupts' share of the wait (or of its worst 1%)
KTHREAD_SHARE = 0.10      # kernel threads' share of the worst-1% wait
LOCAL_PAGES = 0.90        # a process with less of its memory on its CPUs' nodes is "remote"
STEAL_SHARE = 0.005       # steal above this share of the measurement is worth saying
MIGRATIONS_PER_S = 5.0    # a thread moving this often is one that moves
MIGRATED_SHARE = 0.10     # of the worst waits, those that followed a migration, that make migrations a cause
NAMED_MOVERS = 5          # the threads named (and pinned) at most


@dataclass
class Evidence:
    """Everything the rules look at."""

    target: str
    target_threads: list[TargetThread]
    ranking: Ranking
    latency: dict                        # n, p50_us, p99_us, p999_us, max_us
    seconds: float
    online_cpus: set[int]
    machine: Machine
    steal_ms: dict[int, float]           # per CPU, during the measurement
    interrupts: list[dict]               # interrupts_between rows for the CPUs the target waited on
    rt_budgets: dict[str, RtBudget] = field(default_factory=dict)  # cpu cgroup -> budget
    memory: dict[int, dict] = field(default_factory=dict)           # memory_placement
    named_target: bool = True            # the target is a workload (not a canary): [sched_fifo] needs one
    gpu: tuple[str, int] | None = None   # the GPU the target feeds, and its node (diagnose --gpu)
    pcie: dict | None = None             # facts.pcie_sharing of that GPU
    migrations: list[ThreadMoves] | None = None  # each target thread's migrations and waits (None: not counted)

    def tail_doubling(self) -> int:
        """The doubling of ns (2^k) the worst-1% waits begin in."""
        return max(self.ranking.tail_from_ns, 1).bit_length() - 1

    def migration_rows(self) -> list[dict] | None:
        """Each counted thread, most migrations first: its name, migrations, waits, and the worst waits
        that followed one (those of the doubling the worst 1% begins in, and longer)."""
        if self.migrations is None:
            return None
        names = {t.tid: t.comm for t in self.target_threads}
        k = self.tail_doubling()
        tail = sum(sum(m.waits[k:]) for m in self.migrations)
        rows = []
        for moves in sorted(self.migrations, key=lambda m: (-m.migrations, m.tid)):
            after = sum(moves.after_move[k:])
            rows.append({"tid": moves.tid, "comm": names.get(moves.tid, "?"), "migrations": moves.migrations,
                         "waits": sum(moves.waits), "waits_after_migration": sum(moves.after_move),
                         "worst_waits": sum(moves.waits[k:]), "worst_after_migration": after,
                         "share_of_worst": round(after / tail, 4) if tail else 0.0})
        return rows


@dataclass
class Finding:
    cause: str                           # offline-jobs, rt-throttling, interrupts, numa, virtual-machine
    summary: str
    evidence: list[str]
    table: str | None = None             # the profile table that addresses it
    settings: dict | None = None         # that table's keys, for --write-profile
    advice: str = ""

    def to_dict(self) -> dict:
        return {"cause": self.cause, "summary": self.summary, "evidence": self.evidence, "table": self.table,
                "settings": self.settings, "advice": self.advice}


def find_causes(evidence: Evidence) -> list[Finding]:
    found = []
    for rule in (offline_jobs, rt_throttling, kernel_threads, interrupts, remote_memory, pcie_sharing, migrations):
        finding = rule(evidence)
        if finding is not None:
            found.append(finding)
    throttled = any(f.cause == "rt-throttling" for f in found)
    vm = virtual_machine(evidence, throttled)
    return found + ([vm] if vm is not None else [])


def _pct(share: float) -> str:
    return f"{share * 100:.0f}%"


def _holder_line(holder: Holder, about: str) -> str:
    """One holder as evidence: who, its shares of the wait, and where."""
    return (f"{holder.key} ({about}): {_pct(holder.share_of_tail)} of the worst-1% wait, "
            f"{_pct(holder.share_of_wait)} of all wait, on CPU {format_cpu_list(holder.cpus)}")


def _share(holder: Holder, ranking: Ranking) -> float:
    """The share that decides: of the worst 1% when there is a tail, else of all waiting."""
    return holder.share_of_tail if ranking.tail_ns else holder.share_of_wait


def offline_jobs(evidence: Evidence) -> Finding | None:
    ranking = evidence.ranking
    others = [h for h in ranking.holders if h.kind == "task" and h.info is not None and not h.info.is_target
              and not h.info.kernel_thread and not h.info.is_tuned_rl and h.info.pid != 1
              and h.info.policy.split(":")[0] not in REAL_TIME]
    total = sum(_share(h, ranking) for h in others)
    if total < OFFLINE_SHARE:
        return None
    named = [h for h in others if _share(h, ranking) >= OFFLINE_HOLDER_SHARE]
    lines = [_holder_line(h, f"{h.name}, user {h.info.user}, cgroup {h.info.cgroup or '/'}, {h.info.policy}")
             for h in named]
    target_comms = {t.comm for t in evidence.target_threads}
    matchers = _matchers(named, target_comms)
    return Finding(
        "offline-jobs",
        f"other processes held the target's CPUs for {_pct(total)} of its worst-1% wait time",
        lines, "offline_eviction", {"policy": "SCHED_IDLE", "match": matchers},
        "move them out of the way: a cgroup with minimal CPU weight, at SCHED_IDLE so that the target preempts "
        "them at once when it wakes (with [cpu_isolation], also off the target's CPUs)")


def _matchers(holders: list[Holder], target_comms: set[str]) -> list[dict]:
    """One matcher per distinct job: its user, its exact name and its exact command line, so that
    a CPU hog named like a system daemon (``sshd``) yields a matcher that does not evict the daemon.
    A command line read only in part (CMDLINE_LIMIT) is matched on that part."""
    matchers = []
    for holder in holders:
        info = holder.info
        if info.comm in target_comms and not info.cmdline:
            continue  # nothing would tell it from the target
        matcher = {"user": info.user, "name": f"^{re.escape(info.comm)}$"}
        if info.cmdline:
            whole = len(info.cmdline.encode()) < CMDLINE_LIMIT - 1
            matcher["cmdline"] = f"^{re.escape(info.cmdline)}" + ("$" if whole else "")
        if matcher not in matchers:
            matchers.append(matcher)
    return matchers


def rt_throttling(evidence: Evidence) -> Finding | None:
    real_time = [t for t in evidence.target_threads if t.policy in REAL_TIME]
    if not real_time:
        return None
    ranking = evidence.ranking
    lower = [h for h in ranking.holders if h.kind == "idle" or
             (h.kind == "task" and h.info is not None and h.info.policy.split(":")[0] not in REAL_TIME)]
    share = sum(_share(h, ranking) for h in lower)
    if share < THROTTLED_SHARE:
        return None
    lines = [f"{len(real_time)} of the target's threads are {real_time[0].policy}; for {_pct(share)} of their "
             f"worst-1% wait the CPU ran the idle task or a task of a lower policy: "
             + ", ".join(f"{h.key} {_pct(_share(h, ranking))}" for h in lower[:4])]
    throttled = sorted({t.cpu_cgroup for t in real_time})
    budgets = [evidence.rt_budgets[c] for c in throttled if c in evidence.rt_budgets]
    for budget in budgets:
        lines.append(f"cgroup {budget.cgroup} ({budget.directory}): cpu.rt_runtime_us {budget.runtime_us} of "
                     f"cpu.rt_period_us {budget.period_us}; the host's kernel.sched_rt_runtime_us is "
                     f"{budget.global_runtime_us} of {budget.global_period_us}")
    small = [b for b in budgets if b.cgroup != "/" and 0 <= b.runtime_us < b.global_runtime_us]
    if small:
        budget = min(small, key=lambda b: b.runtime_us)
        return Finding(
            "rt-throttling",
            f"RT throttling: the {real_time[0].policy} threads wait while their cgroup {budget.cgroup} is out of "
            f"RT budget ({budget.runtime_us} us per {budget.period_us} us)",
            lines, "rt_runtime", {"cgroup": budget.cgroup, "cgroup_runtime_us": budget.global_runtime_us},
            "raise the cgroup's budget to the host's; or take the threads off SCHED_FIFO with [sched_fifo], which "
            "the verification keeps only if FIFO was not what kept them ahead of other work")
    return Finding(
        "rt-throttling",
        f"RT throttling: the {real_time[0].policy} threads wait while the idle task or lower-policy tasks run",
        lines, "sched_fifo" if evidence.named_target else None, {"nice": -20} if evidence.named_target else None,
        "their budget is the host's own (kernel.sched_rt_runtime_us): run them SCHED_OTHER at nice -20 with "
        "[sched_fifo] (the verification reverts it if FIFO was what kept them ahead)"
        + ("" if evidence.named_target else "; [sched_fifo] needs a [target] naming the workload, not a canary"))


def kernel_threads(evidence: Evidence) -> Finding | None:
    """Kernel threads on the target's CPUs: [cpu_isolation] moves those that may move; per-CPU ones
    leave only with boot parameters, which its plan recommends."""
    ranking = evidence.ranking
    threads = [h for h in ranking.holders if h.kind == "task" and h.info is not None and h.info.kernel_thread]
    share = sum(_share(h, ranking) for h in threads)
    if share < KTHREAD_SHARE:
        return None
    lines = [_holder_line(h, h.name + (", bound to its CPU" if h.info.bound else ""))
             for h in threads if _share(h, ranking) >= OFFLINE_HOLDER_SHARE]
    latency = _latency_cpus(evidence)
    summary = f"kernel threads held the target's CPUs for {_pct(share)} of its worst-1% wait time"
    advice = ("give the workload CPUs of its own: kernel threads that may move go to the housekeeping CPUs at once; "
              "per-CPU ones (kworker/N, ksoftirqd/N) leave only with isolcpus and nohz_full at boot, which the "
              "plan recommends")
    if latency is None or not evidence.named_target:
        why = "this host has one CPU" if latency is None else "[cpu_isolation] needs a [target] naming the workload"
        return Finding("kernel-threads", summary, lines, None, None, f"{advice} ({why})")
    return Finding("kernel-threads", summary, lines, "cpu_isolation", {"latency_cpus": format_cpu_list(latency)},
                   advice)


def interrupts(evidence: Evidence) -> Finding | None:
    ranking = evidence.ranking
    irq = [h for h in ranking.holders if h.kind in ("irq", "softirq")]
    share = max(sum(h.share_of_tail for h in irq), sum(h.share_of_wait for h in irq))
    if share < IRQ_SHARE:
        return None
    lines = [f"interrupt and softirq handlers held the target's CPUs for {_pct(sum(h.share_of_wait for h in irq))} "
             f"of its wait ({_pct(sum(h.share_of_tail for h in irq))} of the worst 1%): "
             + ", ".join(f"{h.key}{' (' + h.name + ')' if h.name and h.kind == 'irq' else ''} "
                         f"{h.wait_ns / 1e6:.1f} ms" for h in irq[:5])]
    lines += [f"IRQ {row['irq']} ({row['name']}): {row['count']} on CPUs "
              f"{', '.join(f'{c}: {n}' for c, n in row['per_cpu'].items())} during the measurement"
              for row in evidence.interrupts[:5]]
    latency = _latency_cpus(evidence)
    if latency is None:
        return Finding("interrupts", "interrupts on the target's CPUs", lines, None, None,
                       "this host has one CPU: there is no other CPU to move interrupts to")
    return Finding("interrupts", f"interrupts ran on the target's CPUs ({_pct(share)} of its wait)", lines,
                   "irq_isolation", {"latency_cpus": format_cpu_list(latency)},
                   "keep interrupts (and network queue work) on the other CPUs")


def _latency_cpus(evidence: Evidence) -> set[int] | None:
    """The target's CPUs, leaving at least one CPU for everything else."""
    online = evidence.online_cpus
    allowed = set()
    for thread in evidence.target_threads:
        allowed |= parse_cpu_list(thread.affinity) if thread.affinity else set(online)
    allowed &= online
    if not allowed or allowed == online:
        allowed = online - {min(online)}
    return allowed or None


def remote_memory(evidence: Evidence) -> Finding | None:
    """Memory away from the nodes of the target's CPUs, or from its GPU's node when --gpu names one."""
    if evidence.gpu is None and evidence.machine.nodes < 2:
        return None
    lines, nodes = [], {}
    for pid, placed in evidence.memory.items():
        pages = placed["pages"]
        total = sum(pages.values())
        if not total:
            continue
        wanted = [evidence.gpu[1]] if evidence.gpu else placed["cpu_nodes"]
        local = sum(n for node, n in pages.items() if node in wanted) / total
        main = max(pages, key=pages.get)
        where = f"node {evidence.gpu[1]}, the GPU's" if evidence.gpu else \
            f"the nodes of its CPUs ({', '.join(map(str, placed['cpu_nodes']))})"
        if local < LOCAL_PAGES or (evidence.gpu is None and len(placed["cpu_nodes"]) > 1):
            lines.append(f"pid {pid}: {_pct(local)} of its {total} resident pages on {where}; most on node {main}")
            nodes[main] = nodes.get(main, 0) + total
    if not lines:
        return None
    if evidence.gpu:
        return Finding("numa", f"the target's memory is away from its GPU's node ({evidence.gpu[0]}: node "
                       f"{evidence.gpu[1]})", lines, "numa", {"gpu": evidence.gpu[0]},
                       "bind its CPUs and memory to the GPU's node: every copy to the GPU then stays on one node")
    node = max(nodes, key=nodes.get)
    return Finding("numa", "the target's memory is not on the node of its CPUs", lines, "numa", {"node": node},
                   "bind its CPUs and memory to one node (the node of the GPU it feeds, where it feeds one: "
                   "diagnose --gpu ADDR checks against it, and gpu = \"ADDR\" in the table binds to it)")


def migrations(evidence: Evidence) -> Finding | None:
    """The target's threads moving between CPUs, with the worst waits that followed their moves:
    pin the threads that move most, by name ([cpu_isolation.pin])."""
    rows = evidence.migration_rows()
    if not rows or not evidence.seconds:
        return None
    share = sum(r["share_of_worst"] for r in rows)
    movers = [r for r in rows if r["migrations"] / evidence.seconds >= MIGRATIONS_PER_S and r["comm"] != "?"]
    movers = movers[:NAMED_MOVERS]
    if share < MIGRATED_SHARE or not movers:
        return None
    tail_us = (1 << evidence.tail_doubling()) / 1000
    lines = [f"{printable(r['comm'])} (tid {r['tid']}): {r['migrations']} migrations in {evidence.seconds:.0f} s; "
             f"{r['waits_after_migration']} of its {r['waits']} waits followed one, {r['worst_after_migration']} of "
             f"them among the worst (from {tail_us:.0f} µs): {_pct(r['share_of_worst'])} of the target's worst waits"
             for r in movers]
    summary = (f"the target's threads moved between CPUs: {_pct(share)} of its worst waits followed a migration")
    latency = _latency_cpus(evidence)
    advice = "pin the threads that move, each to a CPU of its own (taskset -c, as the report did; by thread name)"
    if latency is None or not evidence.named_target:
        why = "this host has one CPU" if latency is None else "[cpu_isolation] needs a [target] naming the workload"
        return Finding("migrations", summary, lines, None, None, f"{advice} ({why})")
    # One pattern a thread, each with a CPU of its own: [cpu_isolation.pin] deals a pattern's CPUs
    # out to the threads that pattern matches, so patterns given the same list all start at its first.
    ordered = sorted(latency)
    pins = {f"^{re.escape(r['comm'])}$": str(ordered[i % len(ordered)]) for i, r in enumerate(movers)}
    placed = f"[cpu_isolation.pin] gives each one of the latency CPUs ({format_cpu_list(latency)}), in turn"
    if len(movers) > len(ordered):
        placed += (f"; {len(movers)} threads for {len(ordered)} latency CPU{'s' if len(ordered) > 1 else ''}: "
                   "some share one, and wait behind each other (the verdict says whether it helps)")
    return Finding("migrations", summary, lines, "cpu_isolation",
                   {"latency_cpus": format_cpu_list(latency), "pin": pins}, f"{advice}: {placed}")


def pcie_sharing(evidence: Evidence) -> Finding | None:
    """NVMe drives or network adapters behind a PCIe bridge above the target's GPU (diagnose --gpu)."""
    pcie = evidence.pcie
    if not pcie or not pcie["shared"]:
        return None
    path = " -> ".join(pcie["path"])
    lines = [f"the GPU {pcie['gpu']}: {path} (root port first)"]
    for shared in pcie["shared"]:
        where = (f"PCIe switch port {shared['bridge']}" if shared["switch"] else f"root port {shared['bridge']}")
        lines.append(f"{shared['kind']} {shared['address']}" + (f" ({shared['driver']})" if shared["driver"] else "")
                     + f" shares {where}: {' -> '.join(shared['path'])}")
    kinds = sorted({s["kind"] for s in pcie["shared"]})
    return Finding("pcie-sharing", f"the GPU {pcie['gpu']} shares its PCIe uplink with {', '.join(kinds)} "
                   f"({len(pcie['shared'])} device(s))", lines, None, None,
                   "the GPU's transfers and these devices' DMA contend for the shared link: move the NVMe and NIC "
                   "traffic that runs beside inference (checkpoints, dataset reads, other jobs' network) to devices "
                   "under another switch or root port, or give the workload a GPU that shares none; or accept the "
                   "contention where that traffic is rare (a NIC paired with the GPU for GPUDirect RDMA is there "
                   "by design)")


def virtual_machine(evidence: Evidence, throttled: bool = False) -> Finding | None:
    machine = evidence.machine
    if not machine.virtual:
        return None
    ranking = evidence.ranking
    what = " ".join(x for x in (machine.hypervisor, f"({machine.product})" if machine.product else "") if x)
    lines = [f"a virtual machine{': ' + what if what else ''}: " + "; ".join(machine.evidence)]
    stolen = sum(evidence.steal_ms.values())
    capacity = evidence.seconds * 1000 * max(len(evidence.steal_ms), 1)
    lines.append(f"steal time during the {evidence.seconds:.0f} s measurement: "
                 + ", ".join(f"CPU {c} {ms:.0f} ms" for c, ms in sorted(evidence.steal_ms.items()))
                 + f" ({stolen / capacity:.1%} of the CPUs' time)"
                 + ("" if stolen else ": 0 does not prove the host gave every CPU back at once; "
                                      "the hypervisor may not report steal"))
    if ranking.waits:
        idle = next((h for h in ranking.holders if h.kind == "idle"), None)
        held = f", which held {_pct(idle.share_of_tail)} of the worst waits' time" if idle else ""
        lines.append(f"{ranking.idle_only_long_waits} waits of 1 ms or more ({ranking.idle_only_tail_waits} of the "
                     f"{ranking.tail_waits} worst waits) passed with no guest task on the CPU, only the idle task"
                     f"{held}: "
                     + ("the RT throttling found above explains them (a throttled CPU runs the idle task)"
                        if throttled else "the guest's own evidence that the host (waking or scheduling the "
                                          "virtual CPU), not a guest task, made them wait"
                        if ranking.idle_only_tail_waits or ranking.idle_only_long_waits
                        else "no sign of the host in the worst waits")
                     + f" ({ranking.idle_only_waits} of all {ranking.waits} waits were on an idle CPU: most are "
                       "its wake-up, microseconds)")
    lines.append(f"the guest sees {machine.nodes} NUMA node(s), {machine.sockets} socket(s) of "
                 f"{machine.cores_per_socket} core(s), {machine.threads_per_core} thread(s) per core"
                 + (": which host node, socket and core each virtual CPU and the guest's memory are on is "
                    "hidden from it" if machine.nodes == 1 else ""))
    return Finding(
        "virtual-machine", "a virtual machine: part of the latency is the host's, which no guest setting reaches",
        lines, None, None,
        "tuning inside the guest cannot remove steal, host-side scheduling of virtual CPUs, or a remote node the "
        "guest cannot see: ask the host's operator for dedicated (pinned) cores for this guest, the hypervisor's "
        "latency-sensitivity setting, co-scheduling (SMT siblings shared with other guests) off, and a topology "
        "passed through as it is (NUMA nodes, cores); then measure again")
