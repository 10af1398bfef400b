"""Rare stalls: a step that makes a helper SCHED_FIFO on the target's CPU must be reverted.

A helper (stall_helper.py) pinned to the target's CPU sleeps, then spins --spin-ms, every
--every-s seconds. As SCHED_IDLE its spin is preempted whenever the target wakes; the step,
made by the lab's own third-party plugin ([lab_stall], lab_plugin/), makes it SCHED_FIFO:10,
and each spin then holds the CPU to its end: the target's waits that fall into it last
milliseconds. The p99 hardly moves, the p999 does: the field reports' very problem (a step
that takes 800-2,500 ms once in a thousand). tuned-rl must see it and revert the step.

Targets: "canary" (the default canary, four threads waking every 500 us, pinned to the CPU)
or "workload" (the lab's request/response workload, workload.py, pinned to the CPU and named
by `[target] name`).

    sudo .venv/bin/python bench/scenarios/rare_stalls.py [--target canary|workload] [--spin-ms 5]
        [--every-s 0.5] [--cpu 1] [--runs 20] [--show-effect] [--verify harm=4]

--show-effect first measures the target by hand (`tuned-rl measure`, 10 s each) with the
helper SCHED_IDLE, then SCHED_FIFO: the effect the step has, without any judge.
The bars: reverted in at least 19 of 20 runs (5 ms every 0.5 s, either target) and 18 of 20
(3 ms every 1 s on the canary).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from lab import (HEADER, Outcome, apply_profile, canary_shape, outcome_of, processes, rollback,  # noqa: E402
                 tuned_rl_json, add_verify_option, verify_table)
from workload import MARKER  # noqa: E402

HELPER = Path(__file__).parent / "stall_helper.py"
PROFILE = """\
[profile]
name = "lab-rare-stalls"

[target]
{target}

[lab_stall]
pid = {pid}
policy = "SCHED_FIFO:10"
"""
TARGETS = {"canary": 'canary = true\ncanary_cpus = "{cpu}"', "workload": f'name = "{MARKER}"'}


def helper_command(spin_ms: float, every_s: float, cpu: int) -> list[str]:
    """The helper, SCHED_IDLE: its spin gives way at once to every wake-up of the target. (As SCHED_OTHER,
    even at nice 19, the scheduler lets it run on for 1.2-1.7 ms of each spin first: stalls of its own.)"""
    return ["taskset", "-c", str(cpu), "chrt", "--idle", "0", sys.executable, str(HELPER), "--spin-ms", str(spin_ms),
            "--every-s", str(every_s)]


def workload_command(cpu: int) -> list[str]:
    return ["taskset", "-c", str(cpu), sys.executable, str(Path(__file__).parent / "workload.py"),
            "--marker", MARKER, "--clients", "4", "--period-us", "1000"]


def policy_of(pid: int) -> int:
    return os.sched_getscheduler(pid)


def run(state_dir: Path, target: str = "canary", spin_ms: float = 5.0, every_s: float = 0.5, cpu: int = 1,
        show_effect: bool = False, canary: str = "", verify: Sequence[str] = ()) -> Outcome:
    commands = [helper_command(spin_ms, every_s, cpu)] + ([workload_command(cpu)] if target == "workload" else [])
    with processes(commands) as (helper, *_):
        time.sleep(2 if target == "workload" else 0.5)  # past the workload's start-up
        effect = measure_effect(helper.pid, target, cpu, state_dir) if show_effect else None
        table = TARGETS[target].format(cpu=cpu) + (f"\n{canary}" if canary and target == "canary" else "")
        text = PROFILE.format(target=table, pid=helper.pid) + verify_table(verify)
        report, seconds = apply_profile(text, state_dir, lab_plugin=True)
        policy_after_apply = policy_of(helper.pid)  # a reverted step put SCHED_IDLE back
        rollback(state_dir)
        restored = policy_of(helper.pid) == os.SCHED_IDLE
    result = outcome_of(f"stalls {target} {spin_ms:g}/{every_s:g}", report, seconds, restored)
    result.value_after_apply = "SCHED_IDLE" if policy_after_apply == os.SCHED_IDLE else str(policy_after_apply)
    if effect:
        result.differences = [effect]
    return result


def measure_effect(helper: int, target: str, cpu: int, state_dir: Path) -> str:
    """The target's figures with the helper SCHED_IDLE, then SCHED_FIFO:10, by `tuned-rl measure`."""
    args = ["measure", "--seconds", "10", "--window-seconds", "0.5", "--target",
            "canary" if target == "canary" else f"name:{MARKER}"] + (["--canary-cpus", str(cpu)] if target == "canary" else [])
    figures = []
    for policy in (os.SCHED_IDLE, os.SCHED_FIFO):
        os.sched_setscheduler(helper, policy, os.sched_param(10 if policy == os.SCHED_FIFO else 0))
        try:
            figures.append(tuned_rl_json(args, state_dir, 120))
        finally:
            os.sched_setscheduler(helper, os.SCHED_IDLE, os.sched_param(0))
    (idle, fifo) = figures
    return (f"measured by hand: p99 {idle['p99_us']:.0f} -> {fifo['p99_us']:.0f} us, p999 {idle['p999_us']:.0f} -> "
            f"{fifo['p999_us']:.0f} us (x{fifo['p999_us'] / idle['p999_us']:.1f})")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", choices=sorted(TARGETS), default="canary")
    parser.add_argument("--spin-ms", type=float, default=5.0)
    parser.add_argument("--every-s", type=float, default=0.5)
    parser.add_argument("--cpu", type=int, default=1)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--show-effect", action="store_true")
    parser.add_argument("--canary", type=canary_shape, default=None, metavar="PERIODxTHREADS", help="the canary's wake period (us) and threads, "
                        "e.g. 500x8 (default: the canary's defaults)")
    add_verify_option(parser)
    args = parser.parse_args()
    print(HEADER, flush=True)
    decisions, seconds = [], []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as state:
            result = run(Path(state), args.target, args.spin_ms, args.every_s, args.cpu, args.show_effect,
                         args.canary or "", args.verify)  # no --canary: the canary's defaults
        decisions.append(result.decision)
        seconds.append(result.seconds)
        print(result.row(), flush=True)
        step = result.report["steps"][-1]
        print(f"  {step['reason']}", flush=True)
        for line in result.differences or []:
            print(f"  {line}", flush=True)
        if result.value_after_apply != "SCHED_IDLE" and result.decision == "reverted":
            print(f"  NOT PUT BACK when apply returned: policy {result.value_after_apply}", flush=True)
    print(", ".join(f"{d} {decisions.count(d)}" for d in sorted(set(decisions))) + f" of {args.runs}; median "
          f"{statistics.median(seconds):.1f} s an apply")


if __name__ == "__main__":
    main()
