"""[sched_fifo]: run the workload's SCHED_FIFO and SCHED_RR threads as SCHED_OTHER at a high priority.

    [target]
    name = "^actor"               # the workload: pid, name, cgroup or unit (not a canary)

    [sched_fifo]
    nice = -20                    # the nice they run at once they are SCHED_OTHER (default -20)

A real-time thread in a cgroup whose RT budget runs out is throttled for the rest of the
period (the first field report: hundreds of milliseconds); as SCHED_OTHER at nice -20 it is
never throttled, only shares its CPU by weight. Removing FIFO also hurts where FIFO was what
kept the threads ahead of CPU hogs: the verification loop decides, and reverts the step then.

One step: each such thread's nice is set first (Linux stores it for an RT thread; it takes
effect once the thread is SCHED_OTHER), then its policy. Undo, in reverse, gives each thread
back its policy and priority, then its nice. A thread that exits meanwhile is counted as gone.

`tuned-rl watch` does the same for each workload process that starts later, and plans the
workload again a moment after its start: threads that turn real-time during start-up are seen.
"""

from __future__ import annotations

from tuned_rl import (Change, Key, Step, Table, hookimpl, is_target_process, named_workload_problem,
                     target_from_table, workload_for_step)

REAL_TIME = ("SCHED_FIFO", "SCHED_RR")

TUNED_RL_PLUGIN_API = "0.2"

TABLE = Table(
    "sched_fifo",
    "Move the workload's SCHED_FIFO / SCHED_RR threads to SCHED_OTHER at a high priority (nice).",
    {"nice": Key(int, "Their nice as SCHED_OTHER threads (default -20, the highest).", minimum=-20, maximum=19)},
    phase="policies",
)


@hookimpl
def tuned_rl_tables():
    return [TABLE]


@hookimpl
def tuned_rl_validate(profile, host):
    if profile.get("sched_fifo") is None:
        return None
    problem = named_workload_problem(profile, "sched_fifo")
    return [problem] if problem else []


@hookimpl
def tuned_rl_plan(profile, host):
    table = profile.get("sched_fifo")
    if table is None:
        return None
    nice = str(table.get("nice", -20))
    step = Step("sched_fifo", f"run the workload's real-time threads as SCHED_OTHER at nice {nice}")
    workload = workload_for_step(host, profile.get("target"), step)
    if not workload:
        return [step]
    threads = [t for p in workload for t in host.threads(p.pid) if t.policy in REAL_TIME]
    if not threads:
        step.skip_reason = "the workload has no SCHED_FIFO or SCHED_RR thread"
        return [step]
    step.changes += _changes(threads, nice)
    return [step]


@hookimpl
def tuned_rl_plan_process(profile, host, process):
    """A workload process that started (or turned real-time) after the apply: its SCHED_FIFO and
    SCHED_RR threads as the apply's step sets them. Nothing for any other process."""
    table, target = profile.get("sched_fifo"), profile.get("target")
    if table is None or not target or target.get("canary") or process.kernel_thread:
        return None
    if not is_target_process(host, target_from_table(target)[0], process):
        return None
    threads = [t for t in host.threads(process.pid) if t.policy in REAL_TIME]
    if not threads:
        return None
    nice = str(table.get("nice", -20))
    step = Step("sched_fifo", f"run the real-time threads of the workload's pid {process.pid} ({process.comm}) as "
                              f"SCHED_OTHER at nice {nice}")
    step.changes += _changes(threads, nice)
    return [step]


def _changes(threads: list, nice: str) -> list[Change]:
    """Each thread's nice first (kept by Linux for an RT thread, in effect once it is SCHED_OTHER), then its policy."""
    changes = []
    for thread in threads:
        changes.append(Change("nice", "", str(thread.nice), nice, task=thread.task))
        changes.append(Change("sched", "", thread.sched, "SCHED_OTHER:0", task=thread.task))
    return changes
