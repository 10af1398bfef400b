"""`tuned-rl doctor`: can this host measure latency, and if not, what to fix."""

from __future__ import annotations

import os
import platform

from tuned_rl.host import Host
from tuned_rl.measure.probes import PROBES, ProbeError


def examine(host: Host) -> dict:
    """Each probe with what stops it (after a real start for those that look able), and the facts."""
    probes = []
    for name, probe_class in PROBES.items():
        obstacles = [{"problem": o.problem, "fix": o.fix} for o in probe_class.obstacles(host, canary=name == "schedstat")]
        if not obstacles and name != "schedstat":
            failure = _try_start(probe_class)
            if failure:
                obstacles.append({"problem": failure, "fix": "see the problem; `tuned-rl doctor` after fixing"})
        probes.append({"name": name, "can_run": not obstacles, "problems": obstacles,
                       "targets": "canary only" if name == "schedstat" else "any"})
    usable = [p["name"] for p in probes if p["can_run"]]
    return {"probes": probes,
            "auto": next((n for n in usable if n != "schedstat"), None),
            "auto_canary": usable[0] if usable else None,
            "facts": _facts(host)}


def _try_start(probe_class) -> str | None:
    probe = probe_class()
    try:
        probe.start([])
        probe.drain()
    except ProbeError as err:
        return str(err)
    finally:
        probe.stop()
    return None


def _facts(host: Host) -> dict:
    release = platform.release()
    return {"kernel": release, "root": os.geteuid() == 0,
            "btf": host.exists("/sys/kernel/btf/vmlinux"),
            "tracefs_mounted": host.exists("/sys/kernel/tracing/events/sched"),
            "kernel_headers": host.exists(f"/lib/modules/{release}/build/include"),
            "schedstat": host.exists("/proc/self/schedstat")}


def format_examination(report: dict) -> str:
    """``examine``'s report for people: each probe, what stops it and the fix, the facts."""
    lines = []
    for probe in report["probes"]:
        lines.append(f"{probe['name']:<10} {'ok' if probe['can_run'] else 'cannot run'}"
                     f"{' (canary targets only)' if probe['targets'] != 'any' else ''}")
        lines += [f"    {problem['problem']}\n      fix: {problem['fix']}" for problem in probe["problems"]]
    lines.append(f"probe = \"auto\" uses: {report['auto'] or 'nothing: no probe can measure a workload here'}")
    lines.append("facts: " + ", ".join(f"{k}={v}" for k, v in report["facts"].items()))
    return "\n".join(lines)
