"""The phases a profile's steps run in, whatever the order of its tables; each table declares one.

Within a phase, steps run in the order their tables appear in the profile, and a
table's steps in the order its plugin gives them.
"""

from __future__ import annotations

# name -> what runs in it, and why it comes where it does
PHASES: dict[str, str] = {
    "kernel": "host-wide kernel settings and budgets (sysctls, RT budgets). First: later writes depend on "
              "them; the kernel refuses a SCHED_FIFO task in a cgroup whose RT budget is 0.",
    "cgroups": "cgroups and partitions tuned-rl creates or configures (an isolated cpuset, the offline-jobs "
               "cgroup). Before placement: a task can only join a cgroup that exists and has CPUs and memory "
               "nodes (cgroup v1 refuses it with ENOSPC otherwise).",
    "placement": "where tasks run: cgroup membership, CPU affinity, NUMA binding. Before policies: a policy is "
                 "then judged on the CPUs the workload will keep.",
    "policies": "scheduling policy, priority, nice and I/O class of tasks. After placement, so that a task made "
                "SCHED_FIFO is already in the cgroup whose RT budget it uses.",
    "interrupts": "IRQ affinity, RPS/XPS queue masks, irqbalance. Last: they depend on no task, and their "
                  "effect on run-queue latency is the smallest, so it is judged once the larger ones are settled.",
}
PHASE_ORDER = tuple(PHASES)


def phase_rank(phase: str | None) -> int:
    """Position of ``phase`` in the run order (unknown phases last)."""
    return PHASE_ORDER.index(phase) if phase in PHASES else len(PHASE_ORDER)
