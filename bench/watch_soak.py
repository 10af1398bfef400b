"""watch for a long while on a shared node: does its cost stay where it started?

Applies an eviction profile (processes whose command line holds a marker, to SCHED_IDLE in the
offline cgroup), starts `tuned-rl watch --json --metrics-address 127.0.0.1:PORT` at nice -10 with
its descriptors limited to 1,024 (systemd's default), and for ``--minutes`` runs, as ``nobody``:
short-lived matching jobs (``--jobs-per-second``, each a shell that lives 0.2 s with the marker in
its command line: every one is evicted and exits), a rename loop, a fork burst every 10 s (the netlink socket overflows), and 2,000 idle
connections to /metrics held for 20 s out of every minute; a scrape every 15 s, as Prometheus does.
Each minute it prints watch's CPU share, its resident memory, the journal's size (bytes, records),
the minute's exec -> evicted p50/p99 and scrapes served. At a random moment of the last minute
watch is killed with SIGKILL, then rolled back, and every task's placement is compared with the
start (lab.placement). The last minute's figures against the first are the verdict: each within
10% (journal size and RSS), exec -> evicted p99 <= 100 ms, watch never exited on its own.

    sudo .venv/bin/python bench/watch_soak.py [--minutes 30] [--jobs-per-second 20]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "scenarios"))
sys.path.insert(0, str(Path(__file__).parent))
from lab import placement, placement_differences  # noqa: E402
from watch_cost import cpu_seconds, rss_mib  # noqa: E402

MARKER = "tuned-rl-bench-soak-job"
PROFILE = f'[offline_eviction]\npolicy = "SCHED_IDLE"\n\n[[offline_eviction.match]]\ncmdline = "{MARKER}"\n'
RENAME = ("import ctypes\nlibc = ctypes.CDLL(None)\ni = 0\nwhile True:\n    i += 1\n"
          "    libc.prctl(15, str(i % 1000).encode(), 0, 0, 0)\n")
FORK_BURSTS = ("import os, time\nwhile True:\n    for _ in range(3000):\n        pid = os.fork()\n"
               "        if pid == 0:\n            os._exit(0)\n        os.waitpid(pid, 0)\n    time.sleep(10)\n")
# The marker is put together at run time: in this program's own command line it would make the
# starter a matching job, and every job its child, born evicted.
JOBS = ("import subprocess, sys, time\nrate = float(sys.argv[1])\nwhile True:\n"
        f"    subprocess.Popen(['sh', '-c', 'sleep 0.2; :', '{MARKER[:8]}' + '{MARKER[8:]}'])\n    time.sleep(1 / rate)\n")
IDLE = ("import socket, sys, time\nwhile True:\n    held = []\n    for _ in range(2000):\n        try:\n"
        "            held.append(socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=2))\n"
        "        except OSError:\n            pass\n    time.sleep(20)\n    for s in held:\n        s.close()\n"
        "    time.sleep(40)\n")


def journal_size(state_dir: Path) -> tuple[int, int]:
    records = [p for p in (state_dir / "journal").iterdir() if p.name[:1].isdigit()]
    return sum(p.stat().st_size for p in records), len(records)


def as_nobody() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))
    os.setgid(65534)
    os.setuid(65534)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--jobs-per-second", type=float, default=20.0)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: watch subscribes to the kernel's process events")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped early: the churn killed, the host rolled back
    code = Path(__file__).resolve().parent.parent
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    original = placement()
    with tempfile.TemporaryDirectory() as work:
        state = Path(work) / "state"
        env = {**os.environ, "TUNED_RL_STATE_DIR": str(state), "PYTHONPATH": str(code)}
        env.pop("TUNED_RL_HOST_ROOT", None)
        (Path(work) / "p.toml").write_text(PROFILE)
        subprocess.run([sys.executable, "-m", "tuned_rl.cli", "apply", str(Path(work) / "p.toml"), "--no-verify"],
                       env=env, check=True, capture_output=True)
        watch = subprocess.Popen([sys.executable, "-m", "tuned_rl.cli", "watch", "--json", "--no-measure",
                                  "--metrics-address", f"127.0.0.1:{port}"], stdout=subprocess.PIPE, text=True, env=env)
        resource.prlimit(watch.pid, resource.RLIMIT_NOFILE, (1024, 1024))
        os.setpriority(os.PRIO_PROCESS, watch.pid, -10)
        events: list[dict] = []
        threading.Thread(target=lambda: events.extend(json.loads(line) for line in watch.stdout), daemon=True).start()
        while not any(e["event"] == "rescanned" for e in events):
            time.sleep(0.05)
        churn = [subprocess.Popen([sys.executable, "-c", text, *extra], preexec_fn=as_nobody,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for text, extra in ((RENAME, []), (FORK_BURSTS, []), (IDLE, [str(port)]))]
        jobs = subprocess.Popen([sys.executable, "-c", JOBS, str(args.jobs_per_second)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        minutes, scrapes = [], {"ok": 0, "failed": 0}
        kill_at = (args.minutes - 1 + random.random()) * 60
        began = time.monotonic()
        try:
            print(f"{'minute':>6} {'CPU':>7} {'RSS MiB':>8} {'journal':>12} {'records':>8} {'evicted':>8} "
                  f"{'p50 ms':>7} {'p99 ms':>7} {'scrapes':>8}", flush=True)
            minute = 0
            while time.monotonic() - began < kill_at:
                cpu0, seen = cpu_seconds(watch.pid), len(events)
                start = time.monotonic()
                ok0, failed0 = scrapes["ok"], scrapes["failed"]
                while time.monotonic() - start < 60 and time.monotonic() - began < kill_at:
                    try:
                        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
                            scrapes["ok" if response.status == 200 else "failed"] += 1
                    except OSError:
                        scrapes["failed"] += 1
                    time.sleep(min(15.0, max(0.0, kill_at - (time.monotonic() - began))))
                    if watch.poll() is not None:
                        raise SystemExit(f"watch exited {watch.returncode} on its own at minute {minute + 1}")
                elapsed = time.monotonic() - start
                reactions = sorted(e["reaction_ms"] for e in events[seen:] if e["event"] == "evicted")
                size, records = journal_size(state)
                row = {"minute": minute + 1, "cpu": (cpu_seconds(watch.pid) - cpu0) / elapsed, "rss": rss_mib(watch.pid),
                       "journal": size, "records": records, "evicted": len(reactions),
                       "p50": statistics.median(reactions) if reactions else float("nan"),
                       "p99": reactions[int(0.99 * (len(reactions) - 1))] if reactions else float("nan"),
                       "scrapes": f"{scrapes['ok'] - ok0}/{scrapes['ok'] - ok0 + scrapes['failed'] - failed0}"}
                minutes.append(row)
                print(f"{row['minute']:>6} {row['cpu']:>7.2%} {row['rss']:>8.1f} {row['journal']:>12,} "
                      f"{row['records']:>8} {row['evicted']:>8} {row['p50']:>7.1f} {row['p99']:>7.1f} "
                      f"{row['scrapes']:>8}", flush=True)
                minute += 1
            watch.send_signal(signal.SIGKILL)
            watch.wait()
            print(f"watch killed with SIGKILL at {time.monotonic() - began:.0f} s", flush=True)
        finally:
            for process in (*churn, jobs):
                process.kill()
                process.wait()
            if watch.poll() is None:
                watch.kill()
                watch.wait()
            time.sleep(0.5)  # the last jobs exit
            subprocess.run([sys.executable, "-m", "tuned_rl.cli", "rollback"], env=env, capture_output=True)
        differences = placement_differences(original, placement())
        first, last = minutes[0], minutes[-1]
        print(f"\nfirst minute -> last: CPU {first['cpu']:.2%} -> {last['cpu']:.2%}; RSS {first['rss']:.1f} -> "
              f"{last['rss']:.1f} MiB; journal {first['journal']:,} -> {last['journal']:,} bytes ({first['records']} -> "
              f"{last['records']} records); exec -> evicted p99 {first['p99']:.1f} -> {last['p99']:.1f} ms; "
              f"scrapes served {scrapes['ok']} of {scrapes['ok'] + scrapes['failed']}")
        print(f"after the SIGKILL and rollback: {'every placement as at the start' if not differences else differences[:5]}")
    return 0 if not differences else 1


if __name__ == "__main__":
    sys.exit(main())
