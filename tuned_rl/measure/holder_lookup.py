"""What the host says of a holder of the CPU, looked up while it still runs, and the IRQ lines'
names: what `tuned-rl diagnose` and watch's telemetry both need to name who the target waited behind."""

from __future__ import annotations

from tuned_rl.host import Host, TaskGone
from tuned_rl.measure.holders import HolderInfo


def interrupt_counts(host: Host) -> dict[str, tuple[str, list[int]]]:
    """/proc/interrupts: per line ("36", "NMI", ...), its name and its count per CPU column."""
    lines = host.read("/proc/interrupts").splitlines()
    columns = len(lines[0].split()) if lines else 0
    found = {}
    for line in lines[1:]:
        label, _, rest = line.partition(":")
        fields = rest.split()
        counts = [int(f) for f in fields[:columns] if f.isdigit()]
        found[label.strip()] = (" ".join(fields[len(counts):]), counts)
    return found


def irq_names(counts: dict[str, tuple[str, list[int]]]) -> dict[int, str]:
    """IRQ number -> its device name (the last word of its /proc/interrupts line)."""
    return {int(label): (name.split()[-1] if name else "") for label, (name, _) in counts.items() if label.isdigit()}


def holder_info(host: Host, pid: int, target_pids: set[int], own_pids: set[int]) -> HolderInfo | None:
    try:
        process = host.process(pid)
    except TaskGone:
        return None
    cgroup = cpu_cgroup(process.cgroups) or process.cgroups.get("", "")
    return HolderInfo(pid, process.comm, process.cmdline, host.user_name(process.uid), cgroup, process.sched,
                      process.kernel_thread, pid in target_pids, pid in own_pids, process.fixed_affinity)


def cpu_cgroup(cgroups: dict[str, str]) -> str:
    """A task's cgroup in the v1 hierarchy holding the cpu controller ("" without one)."""
    return next((path for key, path in cgroups.items() if "cpu" in key.split(",")), "")
