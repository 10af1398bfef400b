"""[lab_stall]: the lab's harmful step, a third-party plugin: make one helper process SCHED_FIFO.

    [lab_stall]
    pid = 1234                 # the helper (bench/scenarios/stall_helper.py), by pid
    policy = "SCHED_FIFO:10"   # what the step sets

The helper sleeps, then spins a few milliseconds, on the target's CPU. As SCHED_IDLE the
target's wake-ups preempt its spin; as SCHED_FIFO the spin holds the CPU to the end, and the
target's waits that fall into it last milliseconds: rare stalls (p999 up, p99 not). The lab
loads this plugin as any third-party plugin is loaded, through the ``tuned_rl`` entry-point
group: this folder is put on PYTHONPATH, and its dist-info declares the entry point.
"""

from __future__ import annotations

from tuned_rl import Change, Key, Problem, Step, Table, hookimpl

TUNED_RL_PLUGIN_API = "0.2"

TABLE = Table("lab_stall", "Lab only: set one helper process's scheduling policy (a harmful step).",
              {"pid": Key(int, "The helper's pid.", required=True, minimum=1),
               "policy": Key(str, "POLICY:PRIORITY, e.g. SCHED_FIFO:10.", required=True)},
              phase="policies")


@hookimpl
def tuned_rl_tables():
    return [TABLE]


@hookimpl
def tuned_rl_validate(profile, host):
    table = profile.get("lab_stall")
    if table is None:
        return None
    try:
        host.process(table["pid"])
    except LookupError:
        return [Problem("lab_stall.pid", f"no process has pid {table['pid']}")]
    return []


@hookimpl
def tuned_rl_plan(profile, host):
    table = profile.get("lab_stall")
    if table is None:
        return None
    threads = host.threads(table["pid"])
    step = Step("lab_stall", f"make the helper {table['pid']} {table['policy']}")
    step.changes = [Change("sched", "", t.sched, table["policy"], task=t.task) for t in threads]
    return [step]
