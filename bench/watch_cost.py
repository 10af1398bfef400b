"""What does `tuned-rl watch` cost, and how fast does it act? Reaction time and CPU, in one run.

Applies an eviction profile (processes whose command line holds a marker, to SCHED_IDLE in the
offline cgroup) while none runs, starts `tuned-rl watch --json`, then:

1. **reaction**: starts ``--starts`` matching processes one after another (``sh -c 'sleep 0.3'
   MARKER``, ``--rate`` a second) and reads, from watch's events, each one's time from the
   kernel's exec event to evicted (p50, p99, max);
2. **idle**: watch's CPU time (utime + stime of its process) over ``--idle-seconds`` with nothing
   starting, as a share of one CPU;
3. **busy**: the same while 50 non-matching processes start a second (``/bin/true``);
4. **storm**: 2,000 short processes started as fast as this machine can: the events watch
   counted as lost (each an overflow of its socket, followed by a rescan), how long until it had
   read them all, and its resident memory before and after.

Then rollback, and every evicted process is gone (they were short).

    sudo .venv/bin/python bench/watch_cost.py [--starts 200] [--rate 10] [--idle-seconds 30]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

MARKER = "tuned-rl-bench-late-job"
PROFILE = f'[offline_eviction]\npolicy = "SCHED_IDLE"\n\n[[offline_eviction.match]]\ncmdline = "{MARKER}"\n'
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def tuned_rl(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuned_rl.cli", *args], env=env, capture_output=True, text=True,
                          check=True)


def share(pid: int, seconds: float, during=lambda: None) -> float:
    """watch's CPU over ``seconds`` (running ``during`` meanwhile), as a share of one CPU."""
    before, began = cpu_seconds(pid), time.monotonic()
    during()
    time.sleep(max(0.0, seconds - (time.monotonic() - began)))
    return (cpu_seconds(pid) - before) / (time.monotonic() - began)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=200)
    parser.add_argument("--rate", type=float, default=10.0)
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    parser.add_argument("--storm", type=int, default=2000)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: watch subscribes to the kernel's process events")
    with tempfile.TemporaryDirectory() as work:
        env = {**os.environ, "TUNED_RL_STATE_DIR": str(Path(work) / "state")}
        env.pop("TUNED_RL_HOST_ROOT", None)
        (Path(work) / "p.toml").write_text(PROFILE)
        tuned_rl(["apply", str(Path(work) / "p.toml"), "--no-verify"], env)
        watch = subprocess.Popen([sys.executable, "-m", "tuned_rl.cli", "watch", "--json"], stdout=subprocess.PIPE,
                                 text=True, env=env)
        events: list[dict] = []
        threading.Thread(target=lambda: events.extend(json.loads(line) for line in watch.stdout), daemon=True).start()
        try:
            while not any(e["event"] == "rescanned" for e in events):
                time.sleep(0.05)
            started = []
            for _ in range(args.starts):
                started.append(subprocess.Popen(["sh", "-c", "sleep 0.3", MARKER]).pid)
                time.sleep(1 / args.rate)
            time.sleep(1.0)
            reactions = sorted(e["reaction_ms"] for e in events if e["event"] == "evicted" and e["pid"] in started)
            print(f"reaction, exec to evicted: {len(reactions)} of {args.starts} starts evicted; p50 "
                  f"{statistics.median(reactions):.1f} ms, p99 {reactions[int(0.99 * (len(reactions) - 1))]:.1f} ms, "
                  f"max {reactions[-1]:.1f} ms", flush=True)
            idle = share(watch.pid, args.idle_seconds)
            print(f"idle: {idle:.2%} of one CPU over {args.idle_seconds:.0f} s", flush=True)

            def fifty_a_second():
                for _ in range(int(50 * args.idle_seconds)):
                    subprocess.Popen(["/bin/true"]).wait()
                    time.sleep(max(0.0, 1 / 50 - 0.002))
            busy = share(watch.pid, args.idle_seconds, fifty_a_second)
            print(f"50 starts a second: {busy:.2%} of one CPU", flush=True)
            rss_before, lost_before = rss_mib(watch.pid), sum(e.get("overflows", 0) for e in events if e["event"] == "lost")
            began = time.monotonic()
            storm = [subprocess.Popen(["/bin/true"]) for _ in range(args.storm)]
            for process in storm:
                process.wait()
            spawned = time.monotonic() - began
            marker = subprocess.Popen(["sh", "-c", "sleep 0.3", MARKER])  # acted on once watch has caught up
            while not any(e["event"] == "evicted" and e["pid"] == marker.pid for e in events):
                time.sleep(0.01)
            caught_up = time.monotonic() - began
            lost = sum(e.get("overflows", 0) for e in events if e["event"] == "lost") - lost_before
            print(f"storm: {args.storm} processes in {spawned:.1f} s; watch acted on the next start "
                  f"{caught_up:.1f} s after the storm began; {lost} overflows (each followed by a rescan); memory "
                  f"{rss_before:.0f} -> {rss_mib(watch.pid):.0f} MiB", flush=True)
            rescans = [e["seconds"] for e in events if e["event"] == "rescanned"]
            print(f"rescans: {len(rescans)}, median {statistics.median(rescans) * 1000:.0f} ms, "
                  f"max {max(rescans) * 1000:.0f} ms", flush=True)
        finally:
            watch.terminate()
            watch.wait(timeout=10)
            tuned_rl(["rollback"], env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
