"""What another user's churn costs `tuned-rl watch`: its CPU while an unprivileged user renames a
process in a loop, forks as fast as it can, or starts 50 processes a second, and how soon a
matching job started in the middle of each is evicted.

Applies an eviction profile (processes whose command line holds a marker, to SCHED_IDLE in the
offline cgroup) while none runs, starts `tuned-rl watch --json --no-measure` at nice -10 (as the
unit runs it), then for each phase of ``--seconds``: watch's CPU time (utime + stime) over the
phase as a share of one CPU, and the time from a matching job's start (half-way through) to its
eviction, read from watch's events. The churn runs as ``nobody``. Phases: idle, rename (a
prctl(PR_SET_NAME) loop), fork (fork-and-exit as fast as one process can: the netlink socket
overflows), starts (50 `/bin/true` a second). Then rollback.

With ``--code DIR`` (repeatable) each phase is run once per code tree, in alternating order, and
the table compares them: a before/after in one run, on the same noise.

    sudo .venv/bin/python bench/watch_churn.py [--seconds 10] [--rounds 3] [--code /path/to/old --code .]
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

sys.path.insert(0, str(Path(__file__).parent))
from watch_cost import cpu_seconds  # noqa: E402

MARKER = "tuned-rl-bench-churn-job"
PROFILE = f'[offline_eviction]\npolicy = "SCHED_IDLE"\n\n[[offline_eviction.match]]\ncmdline = "{MARKER}"\n'
CHURN = {
    "idle": None,
    "rename": "import ctypes\nlibc = ctypes.CDLL(None)\ni = 0\nwhile True:\n"
              "    i += 1\n    libc.prctl(15, str(i % 1000).encode(), 0, 0, 0)\n",
    "fork": "import os\nwhile True:\n    pid = os.fork()\n    if pid == 0:\n        os._exit(0)\n    os.waitpid(pid, 0)\n",
    "starts": "import subprocess, time\nwhile True:\n    subprocess.Popen(['/bin/true']).wait()\n    time.sleep(0.018)\n",
}


def as_nobody() -> None:
    os.setgid(65534)
    os.setuid(65534)


def phase(watch: subprocess.Popen, events: list, name: str, seconds: float) -> tuple[float, float | None]:
    """(watch's CPU share over the phase, seconds from the job's start to its eviction or None)."""
    churn = None if CHURN[name] is None else subprocess.Popen([sys.executable, "-c", CHURN[name]],
                                                              preexec_fn=as_nobody, stdout=subprocess.DEVNULL,
                                                              stderr=subprocess.DEVNULL)
    try:
        time.sleep(1.0)  # the churn under way
        before, began = cpu_seconds(watch.pid), time.monotonic()
        time.sleep(seconds / 2)
        job = subprocess.Popen(["sh", "-c", "sleep 5", MARKER])
        started = time.monotonic()
        evicted = None
        while time.monotonic() - started < seconds / 2:
            if evicted is None and any(e["event"] == "evicted" and e["pid"] == job.pid for e in list(events)):
                evicted = time.monotonic() - started
            time.sleep(0.01)
        share = (cpu_seconds(watch.pid) - before) / (time.monotonic() - began)
        job.kill()
        job.wait()
        return share, evicted
    finally:
        if churn is not None:
            churn.kill()
            churn.wait()


def start_watch(code: Path, env: dict) -> tuple[subprocess.Popen, list]:
    watch = subprocess.Popen([sys.executable, "-m", "tuned_rl.cli", "watch", "--json", "--no-measure"],
                             stdout=subprocess.PIPE, text=True, env={**env, "PYTHONPATH": str(code)}, cwd=str(code))
    events: list[dict] = []
    threading.Thread(target=lambda: events.extend(json.loads(line) for line in watch.stdout), daemon=True).start()
    while not any(e["event"] == "rescanned" for e in events):
        if watch.poll() is not None:
            raise SystemExit(f"watch exited {watch.returncode}")
        time.sleep(0.05)
    return watch, events


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--code", action="append", type=Path, help="a tree of tuned-rl's code (default: this one)")
    parser.add_argument("--phases", nargs="+", default=list(CHURN), choices=list(CHURN))
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: watch subscribes to the kernel's process events")
    codes = [c.resolve() for c in args.code] if args.code else [Path(__file__).resolve().parent.parent]
    results: dict[tuple[str, Path], list[tuple[float, float | None]]] = {}
    with tempfile.TemporaryDirectory() as work:
        env = {**os.environ, "TUNED_RL_STATE_DIR": str(Path(work) / "state")}
        env.pop("TUNED_RL_HOST_ROOT", None)
        (Path(work) / "p.toml").write_text(PROFILE)
        subprocess.run([sys.executable, "-m", "tuned_rl.cli", "apply", str(Path(work) / "p.toml"), "--no-verify"],
                       env={**env, "PYTHONPATH": str(codes[-1])}, check=True, capture_output=True)
        try:
            for number in range(args.rounds):
                for code in codes if number % 2 == 0 else list(reversed(codes)):
                    watch, events = start_watch(code, env)
                    try:
                        for name in args.phases:
                            results.setdefault((name, code), []).append(phase(watch, events, name, args.seconds))
                            share, evicted = results[(name, code)][-1]
                            print(f"round {number + 1} {code.name:>12} {name:>7}: watch {share:6.1%} of a CPU; job "
                                  f"evicted {'never' if evicted is None else f'in {evicted * 1000:.0f} ms'}",
                                  flush=True)
                    finally:
                        watch.terminate()
                        watch.wait(timeout=10)
        finally:
            subprocess.run([sys.executable, "-m", "tuned_rl.cli", "rollback"], env={**env, "PYTHONPATH": str(codes[-1])},
                           capture_output=True)
    print(f"\nmedians over {args.rounds} rounds of {args.seconds:g} s (churn by nobody; watch at nice -10, --no-measure)")
    print(f"{'phase':>7} " + " ".join(f"{c.name + ': CPU':>18} {'evicted':>9}" for c in codes))
    for name in args.phases:
        cells = []
        for code in codes:
            rows = results[(name, code)]
            evictions = [e for _, e in rows if e is not None]
            cells.append(f"{statistics.median(s for s, _ in rows):>18.2%} "
                         f"{(f'{statistics.median(evictions) * 1000:.0f} ms' if evictions else 'never'):>9}"
                         + ("" if len(evictions) == len(rows) else f" ({len(rows) - len(evictions)} never)"))
        print(f"{name:>7} " + " ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
