"""How long do apply and rollback take for one step over 2,000 threads? (Target: under 2 s each.)

Starts 500 sleeping processes of 4 threads each, and a throw-away plugin (installed as
its own distribution, like any third-party plugin) whose one step pins every thread
to CPU 0 and makes it SCHED_BATCH: 4,000 changes, journaled in one durable write.
Times `tuned-rl apply --no-verify` and `tuned-rl rollback` as a user runs them (a new
process each, start-up included) and a `--dry-run` of the same profile (start-up and
planning alone), checks that every thread was changed and then restored, and prints
the medians.

    sudo .venv/bin/python bench/many_tasks.py [--runs 5] [--processes 500] [--threads 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

MARKER = "tuned-rl-bench-sleeper"
PLUGIN = '''
from tuned_rl import Change, Key, Step, Table, hookimpl

@hookimpl
def tuned_rl_tables():
    return [Table("bench_pin", "Pin the bench's sleepers (bench only).", {"marker": Key(str, "cmdline marker")},
                  phase="placement")]

@hookimpl
def tuned_rl_plan(profile, host):
    table = profile.get("bench_pin")
    if table is None:
        return []
    changes = []
    for process in host.processes():
        if table["marker"] in process.cmdline:
            for thread in host.threads(process.pid):
                changes.append(Change("affinity", "", thread.affinity, "0", thread.task))
                changes.append(Change("sched", "", thread.sched, "SCHED_BATCH:0", thread.task))
    return [Step("bench_pin", f"pin {len(changes) // 2} threads", changes)]
'''


def install_plugin(work: Path) -> str:
    source = work / "src"
    source.mkdir()
    (source / "tuned_rl_bench_pin.py").write_text(PLUGIN)
    (source / "pyproject.toml").write_text(textwrap.dedent("""\
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "tuned-rl-bench-pin"
        version = "0"
        [tool.setuptools]
        py-modules = ["tuned_rl_bench_pin"]
        [project.entry-points.tuned_rl]
        bench_pin = "tuned_rl_bench_pin"
        """))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-build-isolation",
                    "--target", str(work / "site"), str(source)], check=True)
    return str(work / "site")


def start_sleepers(count: int, threads: int) -> list[subprocess.Popen]:
    code = (f"import threading, time  # {MARKER}\n"
            f"for _ in range({threads - 1}): threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n"
            "print('ready', flush=True)\ntime.sleep(3600)\n")
    sleepers = [subprocess.Popen([sys.executable, "-I", "-S", "-c", code], stdout=subprocess.PIPE, text=True)
                for _ in range(count)]
    for sleeper in sleepers:
        sleeper.stdout.readline()
    return sleepers


def thread_states(sleepers) -> dict[int, tuple]:
    states = {}
    for sleeper in sleepers:
        for tid in map(int, os.listdir(f"/proc/{sleeper.pid}/task")):
            states[tid] = (frozenset(os.sched_getaffinity(tid)), os.sched_getscheduler(tid))
    return states


def timed(command: list[str], env: dict) -> tuple[float, dict]:
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    seconds = time.monotonic() - started
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command[2:])} exited {result.returncode}: {result.stderr[-1000:]}")
    return seconds, json.loads(result.stdout)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--processes", type=int, default=500)
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        env = {**os.environ, "PYTHONPATH": install_plugin(Path(work)), "TUNED_RL_STATE_DIR": f"{work}/state"}
        env.pop("TUNED_RL_HOST_ROOT", None)
        profile = Path(work) / "bench.toml"
        profile.write_text(f'[bench_pin]\nmarker = "{MARKER}"\n')
        cli = [sys.executable, "-m", "tuned_rl.cli"]
        sleepers = start_sleepers(args.processes, args.threads)
        try:
            original = thread_states(sleepers)
            print(f"{len(original)} threads in {args.processes} processes", flush=True)
            plans, applies, rollbacks = [], [], []
            for run in range(args.runs):
                plans.append(timed(cli + ["apply", str(profile), "--dry-run", "--json"], env)[0])
                seconds, report = timed(cli + ["apply", str(profile), "--no-verify", "--json"], env)
                applies.append(seconds)
                changed = thread_states(sleepers)
                assert all(state == (frozenset({0}), os.SCHED_BATCH) for state in changed.values()), "not all pinned"
                seconds, undone = timed(cli + ["rollback", "--json"], env)
                rollbacks.append(seconds)
                assert thread_states(sleepers) == original, "rollback did not restore every thread"
                step = report["steps"][0]
                print(f"run {run + 1}: dry run {plans[-1]:.2f} s, apply {applies[-1]:.2f} s "
                      f"({len(step['changes'])} changes, {step['outcome']}), rollback {rollbacks[-1]:.2f} s "
                      f"({len(undone['changes'])} restored)", flush=True)
        finally:
            for sleeper in sleepers:
                sleeper.kill()
            for sleeper in sleepers:
                sleeper.wait()
    print(f"median of {args.runs}: dry run {statistics.median(plans):.2f} s, apply {statistics.median(applies):.2f} s, "
          f"rollback {statistics.median(rollbacks):.2f} s (target: under 2 s each)")


if __name__ == "__main__":
    main()
