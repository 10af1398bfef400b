"""What does watch's always-on measurement cost watch itself? Its CPU with and without it, in one run.

The lab's request/response workload (about 10,000 waits a second) runs pinned to CPU 1; a profile
that names it and changes nothing is applied. Each round starts `tuned-rl watch --json` twice, in
rotated order: measuring the workload (the default, with `--metrics-address`, scraped every 5 s as
Prometheus would) and with `--no-measure`. For each, watch's CPU time (utime + stime of its
process) as a share of one CPU:

- **idle**: over ``--idle-seconds`` with nothing else running;
- **storm**: while hackbench (rt-tests, ``-p -g 1 -l 10000``) runs once beside the workload: every
  context switch passes the program, and the workload's waits come in bursts.

Printed per arm: medians over the rounds, with quartiles; and the measuring arm's figures less the
other's (what measuring adds). The programs' own kernel time is `bench/probe_overhead.py --arms watch`.

    sudo .venv/bin/python bench/watch_measure_cost.py [--rounds 5] [--idle-seconds 20]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "scenarios"))
from lab import apply_profile, processes, rollback  # noqa: E402
from rare_stalls import workload_command  # noqa: E402
from watch_alarm import free_port  # noqa: E402
from watch_cost import cpu_seconds  # noqa: E402
from workload import MARKER  # noqa: E402

PROFILE = f'[profile]\nname = "bench-watch-measure"\n\n[target]\nname = "{MARKER}"\n'
HACKBENCH = ["hackbench", "-p", "-g", "1", "-l", "10000"]


def one_watch(state_dir: Path, measuring: bool, idle_s: float) -> dict:
    port = free_port()
    args = ["--metrics-address", f"127.0.0.1:{port}"] if measuring else ["--no-measure"]
    env = {**os.environ, "TUNED_RL_STATE_DIR": str(state_dir)}
    watch = subprocess.Popen([sys.executable, "-m", "tuned_rl.cli", "watch", "--json", *args], stdout=subprocess.PIPE,
                             text=True, env=env)
    events: list[dict] = []
    threading.Thread(target=lambda: events.extend(json.loads(line) for line in watch.stdout), daemon=True).start()
    stop = threading.Event()

    def scraper() -> None:
        while not stop.wait(5.0):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                response.read()
    try:
        deadline = time.monotonic() + 30
        while not any(e["event"] == "rescanned" for e in events):
            if time.monotonic() > deadline or watch.poll() is not None:
                raise RuntimeError("watch did not start")
            time.sleep(0.05)
        if measuring:
            threading.Thread(target=scraper, daemon=True).start()
        time.sleep(2)  # past its start-up (a BPF compile)
        before, began = cpu_seconds(watch.pid), time.monotonic()
        time.sleep(idle_s)
        idle = (cpu_seconds(watch.pid) - before) / (time.monotonic() - began)
        before, began = cpu_seconds(watch.pid), time.monotonic()
        subprocess.run(HACKBENCH, capture_output=True, check=True)
        storm = (cpu_seconds(watch.pid) - before) / (time.monotonic() - began)
        return {"idle": idle, "storm": storm, "alarms": sum(e["event"] == "alarm" for e in events)}
    finally:
        stop.set()
        watch.send_signal(signal.SIGTERM)
        watch.wait(30)


def spread(values: list[float]) -> str:
    low, _, high = statistics.quantiles(values, n=4) if len(values) > 1 else (values[0], 0, values[0])
    return f"{100 * statistics.median(values):.3f}% ({100 * low:.3f}-{100 * high:.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--idle-seconds", type=float, default=20.0)
    args = parser.parse_args()
    results: dict[bool, list[dict]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="tuned-rl-watch-measure-") as tmp, \
            processes([workload_command(1)]):
        state = Path(tmp)
        time.sleep(2)
        apply_profile(PROFILE, state)
        try:
            for number in range(args.rounds):
                for measuring in ([True, False] if number % 2 == 0 else [False, True]):
                    results[measuring].append(one_watch(state, measuring, args.idle_seconds))
                print(f"round {number + 1}: " + ", ".join(
                    f"{'measuring' if m else 'not measuring'} idle {100 * results[m][-1]['idle']:.3f}% storm "
                    f"{100 * results[m][-1]['storm']:.3f}%" for m in (True, False)), flush=True)
        finally:
            rollback(state)
    for phase in ("idle", "storm"):
        on = [r[phase] for r in results[True]]
        off = [r[phase] for r in results[False]]
        print(f"{phase}: watch's CPU measuring {spread(on)}, not measuring {spread(off)}, measuring adds "
              f"{spread([a - b for a, b in zip(on, off)])} of one CPU ({args.rounds} rounds)", flush=True)
    print(f"alarms during the rounds (hackbench beside the workload): {[r['alarms'] for r in results[True]]}")


if __name__ == "__main__":
    main()
