"""Latency probes, and choosing the one that can run here."""

from __future__ import annotations

from tuned_rl.host import Host
from tuned_rl.measure.probes.base import LatencyProbe, Obstacle, ProbeError, Waits
from tuned_rl.measure.probes.bpf import BpfProbe
from tuned_rl.measure.probes.schedstat import SchedstatProbe
from tuned_rl.measure.probes.tracefs import TracefsProbe

# In order of preference for probe = "auto".
PROBES: dict[str, type[LatencyProbe]] = {"bpf": BpfProbe, "tracefs": TracefsProbe, "schedstat": SchedstatProbe}
PROBE_CHOICES = ("auto", *PROBES)


def choose_probe(name: str, host: Host, canary: bool) -> tuple[type[LatencyProbe], list[str]]:
    """The probe to use, and why each one preferred to it cannot run.

    Raises ProbeError when the named probe (or, for "auto", every probe) cannot run.
    """
    candidates = PROBES if name == "auto" else {name: PROBES[name]}
    passed_over = []
    for candidate_name, probe in candidates.items():
        obstacles = probe.obstacles(host, canary)
        if not obstacles:
            return probe, passed_over
        passed_over.append(f"{candidate_name}: " + Obstacle.describe(obstacles))
    raise ProbeError("no latency probe can run here: " + " | ".join(passed_over))


__all__ = ["PROBES", "PROBE_CHOICES", "BpfProbe", "LatencyProbe", "Obstacle", "ProbeError", "SchedstatProbe",
           "TracefsProbe", "Waits", "choose_probe"]
