"""`tuned-rl diagnose`: measure the target with the attributing probe, read the host around it,
rank who the target waited behind, and check the seeds' causes. Changes nothing on the host.
"""

from __future__ import annotations

import os
import time
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Callable

from tuned_rl.diagnose import facts
from tuned_rl.measure import holder_lookup
from tuned_rl.diagnose.findings import Evidence, Finding, find_causes
from tuned_rl.measure.holders import HolderInfo, Ranking, rank
from tuned_rl.host import Host
from tuned_rl.measure.canary import CanarySpec
from tuned_rl.measure.measurement import attach_probe
from tuned_rl.measure.probes import ProbeError
from tuned_rl.measure.probes.attribution import Attribution, AttributingProbe
from tuned_rl.measure.probes.ioctl import DEFAULT_FUNCTION, NVIDIA_MODULE, attach_timer
from tuned_rl.measure.probes.migrations import MigrationProbe, ThreadMoves
from tuned_rl.measure.targets import Target, TargetError, resolve_tids

REFRESH_S = 1.0  # how often a name or cgroup target's threads are looked up again (a /proc scan each time)


@dataclass
class Diagnosis:
    target: Target
    canary: CanarySpec | None
    latency: dict
    notes: list[str]
    attribution: Attribution
    ranking: Ranking
    evidence: Evidence
    findings: list[Finding]
    recording: dict  # everything the ranking and findings were made from (JSON-ready)

    def to_dict(self) -> dict:
        """The report: the ranking and findings, and the facts they were made from as recorded."""
        recorded = self.recording
        return {
            "target": str(self.target),
            "latency": self.latency,
            "attribution": self.ranking.to_dict(),
            "findings": [f.to_dict() for f in self.findings],
            "machine": {**recorded["machine"],
                        "steal_ms": {c: round(ms, 1) for c, ms in sorted(recorded["steal_ms"].items())}},
            **{key: recorded[key] for key in ("interrupts", "target_threads", "rt_budgets", "memory")},
            "gpu": {"address": self.evidence.gpu[0], "node": self.evidence.gpu[1]} if self.evidence.gpu else None,
            "ioctl": recorded.get("ioctl"), "pcie": recorded.get("pcie"),
            "migrations": self.evidence.migration_rows(),
            "notes": self.notes,
        }


def diagnose(host: Host, target: Target, seconds: float, canary: CanarySpec | None = None,
             progress: Callable[[float], None] = lambda left: None, gpu: tuple[str, int] | None = None,
             ioctl: str | None = None) -> Diagnosis:
    """Measure and attribute ``seconds`` of the target's waiting; raises ProbeError or TargetError.

    ``gpu``: the GPU the target feeds and its node, to check its memory against. ``ioctl``: a
    driver function to time the target's calls of (default: nvidia_ioctl, where the nvidia module
    is loaded); the report says why when it cannot be timed.
    """
    if target.kind != "canary" and not resolve_tids(host, target):
        raise TargetError(f"{target} has no threads now: start the workload first (diagnose measures it as it runs)")
    interrupts_before, steal_before = holder_lookup.interrupt_counts(host), facts.steal_ms(host)
    with ExitStack() as stack:
        attached = attach_probe(stack, host, target, "bpf", canary, probe_class=AttributingProbe)
        timer, tid_source, ioctl_figures = _ioctl_timer(stack, host, target, ioctl, attached)
        movers = _migration_probe(stack, attached)
        started = time.monotonic()
        end = started + seconds
        seen = set(attached.initial_tids)
        while time.monotonic() < end:
            time.sleep(max(0.0, min(REFRESH_S, end - time.monotonic())))
            tids = tid_source()  # threads the probe did not see forked (a name or cgroup target)
            attached.probe.watch(tids)
            if movers is not None:
                movers.watch(tids)
            seen |= tids
            progress(end - time.monotonic())
        elapsed = time.monotonic() - started
        attribution = attached.probe.attribution()
        lost = attached.probe.lost
        moves = [m.to_dict() for m in movers.moves()] if movers is not None else None
        if movers is not None and movers.lost:
            attached.notes.append(f"migrations: {movers.lost} threads or program runs were not counted (no room, "
                                  "or the kernel skipped a run)")
        if timer is not None:
            ioctl_figures = timer.times().to_dict()
        steal_after, interrupts_after = facts.steal_ms(host), holder_lookup.interrupt_counts(host)
        # Who each holder and target thread is, read while they still run (a canary stops with the stack).
        threads = facts.target_threads(host, attached.tid_source() | seen)
        target_pids = {t.pid for t in threads}
        infos = _holder_infos(host, attribution, target_pids, {os.getpid()})
        rt_budgets = {t.cpu_cgroup: budget for t in threads if t.policy in ("SCHED_FIFO", "SCHED_RR")
                      for budget in [facts.rt_budget(host, t.cpu_cgroup)] if budget is not None}
        memory = facts.memory_placement(host, target_pids)
        pcie = facts.pcie_sharing(host, gpu[0]) if gpu else None
    waited_on = {r.cpu for r in attribution.held}
    recording = {
        "target": str(target), "attribution": attribution.to_dict(),
        "holders": {str(pid): vars(info) for pid, info in infos.items()},
        "irq_names": {str(k): v for k, v in holder_lookup.irq_names(interrupts_after).items()},
        "latency": {**attribution.latency_summary(), "lost": lost, "seconds": round(elapsed, 2)},
        "target_threads": [vars(t) for t in threads], "online_cpus": sorted(host.online_cpus()),
        "machine": facts.machine(host).to_dict(),
        "steal_ms": {str(c): steal_after.get(c, 0.0) - steal_before.get(c, 0.0) for c in steal_after},
        "interrupts": facts.interrupts_between(interrupts_before, interrupts_after, waited_on),
        "rt_budgets": {c: vars(b) for c, b in rt_budgets.items()},
        "memory": {str(pid): m for pid, m in memory.items()}, "gpu": list(gpu) if gpu else None,
        "ioctl": ioctl_figures, "pcie": pcie, "migrations": moves,
        "notes": list(attached.notes) + ([f"{lost} waits could not be attributed in full (no room in a map or a "
                                          "CPU's slots): their time is in \"not attributed\""] if lost else []),
    }
    return replay(recording, target, canary)


def replay(recording: dict, target: Target | None = None, canary: CanarySpec | None = None) -> Diagnosis:
    """The ranking and findings of a recording (what `--save-raw` writes): pure, for tests and reruns."""
    attribution = Attribution.from_dict(recording["attribution"])
    infos = {int(pid): HolderInfo(**info) for pid, info in recording["holders"].items()}
    ranking = rank(attribution, infos, {int(k): v for k, v in recording["irq_names"].items()})
    target = target or Target.parse(recording["target"])
    evidence = Evidence(
        target=recording["target"], target_threads=[facts.TargetThread(**t) for t in recording["target_threads"]],
        ranking=ranking, latency=recording["latency"], seconds=recording["latency"]["seconds"],
        online_cpus=set(recording["online_cpus"]), machine=facts.Machine(**recording["machine"]),
        steal_ms={int(c): ms for c, ms in recording["steal_ms"].items()}, interrupts=recording["interrupts"],
        rt_budgets={c: facts.RtBudget(**b) for c, b in recording["rt_budgets"].items()},
        memory={int(pid): {"pages": {int(n): p for n, p in m["pages"].items()}, "cpu_nodes": m["cpu_nodes"]}
                for pid, m in recording["memory"].items()},
        named_target=target.kind != "canary", gpu=tuple(recording["gpu"]) if recording.get("gpu") else None,
        pcie=recording.get("pcie"),
        migrations=[ThreadMoves.from_dict(m) for m in recording["migrations"]] if recording.get("migrations") else None)
    return Diagnosis(target, canary, recording["latency"], recording["notes"], attribution, ranking, evidence,
                     find_causes(evidence), recording)


def _ioctl_timer(stack: ExitStack, host: Host, target: Target, function: str | None, attached):
    """The ioctl timer on the target's threads (``function``, or nvidia_ioctl where the nvidia module
    is loaded), the tid source that keeps it watching, and, when it is not timed, why (the report's figures)."""
    name = function or DEFAULT_FUNCTION
    if target.kind == "canary":
        return None, attached.tid_source, {"function": name, "absent": "the target is tuned-rl's canary, which "
                                                                       "makes no driver calls"}
    if function is None and not host.exists(NVIDIA_MODULE):
        return None, attached.tid_source, {"function": name, "absent": "the nvidia module is not loaded (name "
                                                                       "another function with --ioctl)"}
    try:
        timer, tid_source = attach_timer(stack, host, name, attached.initial_tids, attached.tid_source)
    except ProbeError as err:  # IoctlAbsent included: the rest of the diagnosis goes on
        return None, attached.tid_source, {"function": name, "absent": str(err)}
    return timer, tid_source, None


def _migration_probe(stack: ExitStack, attached) -> MigrationProbe | None:
    """The migration counter on the target's threads (None, with a note, where it cannot load)."""
    movers = MigrationProbe()
    try:
        movers.start(attached.initial_tids)
    except ProbeError as err:
        attached.notes.append(f"migrations are not counted: {err}")
        return None
    stack.callback(movers.stop)
    return movers


def _holder_infos(host: Host, attribution: Attribution, target_pids: set[int], own: set[int]) -> dict[int, HolderInfo]:
    infos = {}
    for record in attribution.held:
        if record.kind != "task":
            continue
        pid = int(attribution.names.get(record.id, {}).get("tgid") or record.id)
        if pid not in infos:
            info = holder_lookup.holder_info(host, pid, target_pids, own)
            if info is not None:
                infos[pid] = info
    return infos
