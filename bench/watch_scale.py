"""tuned-rl at a busy node's scale: thousands of sleeping processes. Plan time, watch's rescan, its idle cost.

Starts ``--processes`` sleeping processes (default 8,000) and a workload (a sleeper with a marker
of its own), then, with an isolation and eviction profile (the workload on CPU 1, everything
else off it, jobs matched by a marker that no sleeper has):

1. **plan**: `tuned-rl apply --dry-run` as a user runs it (a new process: start-up included),
   wall time and peak memory, ``--runs`` times;
2. **apply** and **rollback**: `apply --no-verify` (every sleeper moved to the housekeeping
   cpuset, journaled) and `rollback`, wall time;
3. **rescan**: watch's rescan of /proc, in this process (as watch runs it) against the applied
   profile: the first (every process planned), then ``--runs`` more (each process's signature
   compared, only the changed ones planned: the rescan after lost events, and the periodic one);
4. **watch idle**: `tuned-rl watch --json` after the apply; its start rescan, when its next
   periodic rescan is due (spaced so that rescans cost at most 0.2% of a CPU), and its CPU time
   over ``--idle-seconds`` with nothing starting, as a share of one CPU.

Then rollback; every sleeper is back where it was (its cpuset compared with the start).

    sudo .venv/bin/python bench/watch_scale.py [--processes 8000] [--runs 3] [--idle-seconds 300]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from watch_cost import cpu_seconds, rss_mib  # noqa: E402

WORKLOAD = "tuned-rl-bench-scale-workload"
PROFILE = f"""\
[profile]
name = "bench-scale"

[target]
name = "{WORKLOAD}"

[cpu_isolation]
latency_cpus = "1"

[offline_eviction]
policy = "SCHED_IDLE"

[[offline_eviction.match]]
cmdline = "tuned-rl-bench-scale-job"
"""


def tuned_rl(args: list[str], state: Path) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "TUNED_RL_STATE_DIR": str(state)}
    env.pop("TUNED_RL_HOST_ROOT", None)
    began = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "tuned_rl.cli", *args], capture_output=True, text=True, env=env,
                            timeout=1800)
    if result.returncode != 0:
        raise RuntimeError(f"tuned-rl {args[0]} exited {result.returncode}: {result.stderr[-1500:]}")
    return result, time.monotonic() - began


def cpusets(pids: list[int]) -> dict[int, str]:
    found = {}
    for pid in pids:
        try:
            found[pid] = next(line.rsplit(":", 1)[1].strip() for line in open(f"/proc/{pid}/cgroup")
                              if line.split(":")[1] == "cpuset")
        except (OSError, StopIteration):
            found[pid] = "gone"
    return found


def start_sleepers(count: int) -> list[subprocess.Popen]:
    sleepers = []
    for _ in range(count):
        sleepers.append(subprocess.Popen(["sleep", "7200"], stdin=subprocess.DEVNULL, close_fds=True))
    return sleepers


def time_rescans(state: Path, runs: int) -> list[dict]:
    """watch's rescan, run here against the applied profile: the first, then ``runs`` more."""
    from tuned_rl.core.agent import Agent
    from tuned_rl.core.journal import Journal
    from tuned_rl.core.plugin_host import load_plugins
    from tuned_rl.host import Host
    from tuned_rl.watch.watcher import Watcher
    events: list[dict] = []
    watcher = Watcher(Agent(load_plugins(), Host(), Journal(state)), events.append)
    watcher.load_applied()
    for _ in range(runs + 1):
        watcher.rescan("bench")
    return [e for e in events if e["event"] == "rescanned"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=8000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--idle-seconds", type=float, default=300.0)
    parser.add_argument("--rescan-seconds", type=float, default=30.0)
    args = parser.parse_args()
    began = time.monotonic()
    sleepers = start_sleepers(args.processes)
    workload = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(7200)", WORKLOAD])
    print(f"{args.processes} sleepers and the workload started in {time.monotonic() - began:.1f} s; "
          f"{len([p for p in os.listdir('/proc') if p.isdigit()])} processes on the host", flush=True)
    pids = [p.pid for p in sleepers]
    original = cpusets(pids)
    try:
        with tempfile.TemporaryDirectory() as work:
            state = Path(work) / "state"
            profile = Path(work) / "profile.toml"
            profile.write_text(PROFILE)
            plans, peaks = [], []
            for _ in range(args.runs):
                before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
                result, seconds = tuned_rl(["apply", "--dry-run", "--json", str(profile)], state)
                plans.append(seconds)
                peaks.append(max(before, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024)
                changes = sum(len(s["changes"]) for s in json.loads(result.stdout)["steps"])
            print(f"plan (apply --dry-run): median {statistics.median(plans):.2f} s over {args.runs} runs "
                  f"({', '.join(f'{s:.2f}' for s in plans)}), {changes} changes planned, peak memory "
                  f"{max(peaks):.0f} MiB", flush=True)
            _, applied = tuned_rl(["apply", "--no-verify", "--json", str(profile)], state)
            moved = sum(1 for v in cpusets(pids).values() if v == "/tuned-rl-housekeeping")
            print(f"apply --no-verify: {applied:.2f} s, {moved} of {len(pids)} sleepers in the housekeeping cpuset",
                  flush=True)
            rescans = time_rescans(state, args.runs)
            warm = ", ".join(f"{r['seconds']:.3f}" for r in rescans[1:])
            print(f"rescan in process: first {rescans[0]['seconds']:.3f} s (every process planned), then median "
                  f"{statistics.median(r['seconds'] for r in rescans[1:]):.3f} s over {args.runs} "
                  f"({warm}; "
                  f"{rescans[-1]['unchanged']} of {rescans[-1]['processes']} unchanged)", flush=True)
            events: list[dict] = []
            env = {**os.environ, "TUNED_RL_STATE_DIR": str(state)}
            env.pop("TUNED_RL_HOST_ROOT", None)
            watch = subprocess.Popen([sys.executable, "-m", "tuned_rl.cli", "watch", "--json", "--rescan-seconds",
                                      str(args.rescan_seconds)], stdout=subprocess.PIPE, text=True, env=env)
            threading.Thread(target=lambda: events.extend(json.loads(line) for line in watch.stdout),
                             daemon=True).start()
            deadline = time.monotonic() + 120
            while not any(e["event"] == "rescanned" for e in events) and time.monotonic() < deadline:
                time.sleep(0.05)
            start = next(e for e in events if e["event"] == "rescanned")
            print(f"watch: rescan at start {start['seconds']:.3f} s over {start['processes']} processes "
                  f"(acted on {start['acted']}), next periodic one in {start['next_periodic_s']:.0f} s; memory "
                  f"{rss_mib(watch.pid):.0f} MiB", flush=True)
            cpu_before, idle_began = cpu_seconds(watch.pid), time.monotonic()
            time.sleep(args.idle_seconds)
            idle = (cpu_seconds(watch.pid) - cpu_before) / (time.monotonic() - idle_began)
            periodic = [e["seconds"] for e in events if e["event"] == "rescanned" and e["why"] == "periodic"]
            print(f"watch idle over {args.idle_seconds:.0f} s: {idle:.2%} of one CPU, {len(periodic)} periodic "
                  f"rescans ({', '.join(f'{s:.3f}' for s in periodic)} s); memory {rss_mib(watch.pid):.0f} MiB",
                  flush=True)
            watch.send_signal(signal.SIGTERM)
            watch.wait(timeout=30)
            _, rolled = tuned_rl(["rollback"], state)
            back = cpusets(pids)
            differences = [pid for pid in pids if back[pid] != original[pid]]
            print(f"rollback: {rolled:.2f} s; sleepers back where they were: "
                  f"{len(pids) - len(differences)} of {len(pids)}", flush=True)
    finally:
        for process in [*sleepers, workload]:
            process.kill()
        for process in [*sleepers, workload]:
            process.wait()


if __name__ == "__main__":
    main()
