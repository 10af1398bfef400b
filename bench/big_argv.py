"""What does planning cost for a user process with a 2 MB command line and 20,000 threads?

A command line is read once per process and only its first 4 KiB (``CMDLINE_LIMIT``). Before,
it was read whole once per thread: 20,000 threads x 2 MB = 40 GB read, each thread's copy
kept in its ProcessInfo, so planning ran out of memory. This starts such a process (a
sleeping Python with 20 arguments of 100 KiB each and 20,000 idle threads) named by a
profile's ``[target] name``, with ``[cpu_isolation]`` and a ``[cpu_isolation.pin]`` that
reads every one of its threads, and times ``tuned-rl apply --dry-run`` (start-up and planning
alone, a new process each run, as a user runs it). In the same run it does the same for a
control process with the same threads and a short command line, alternating the two, and
prints each one's median wall time and peak memory (the dry run's maximum resident set, from
wait4) and the ratios. Bounded reads: the ratios stay near 1.

    sudo .venv/bin/python bench/big_argv.py [--runs 3] [--threads 20000] [--argv-mb 2]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MARKER = "tuned-rl-bench-big-argv"
ARG_BYTES = 100 * 1024  # one argument may hold at most MAX_ARG_STRLEN (128 KiB)
SPAWNER = """
import sys, threading, time
threading.stack_size(65536)
stop = threading.Event()
threads = [threading.Thread(target=stop.wait, daemon=True) for _ in range(int(sys.argv[2]))]
for thread in threads:
    thread.start()
open(sys.argv[3], "w").write("ready")
time.sleep(3600)
"""


def start(threads: int, argv_bytes: int, ready: Path) -> subprocess.Popen:
    """A process with ``threads`` idle threads and about ``argv_bytes`` of arguments after its marker."""
    filler = ["x" * ARG_BYTES] * (argv_bytes // ARG_BYTES)

    def big_stack():  # ARG_MAX is a quarter of the stack limit: 8 MB of stack allows 2 MB of arguments
        resource.setrlimit(resource.RLIMIT_STACK, (64 << 20, resource.getrlimit(resource.RLIMIT_STACK)[1]))

    process = subprocess.Popen([sys.executable, "-c", SPAWNER, MARKER, str(threads), str(ready), *filler],
                               preexec_fn=big_stack)
    deadline = time.monotonic() + 120
    while not ready.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the bench process did not start its threads (exit {process.poll()})")
        time.sleep(0.1)
    return process


def dry_run(profile: Path, state_dir: Path) -> tuple[float, float]:
    """(wall seconds, peak resident MiB) of one `tuned-rl apply --dry-run` of ``profile``."""
    env = {**os.environ, "TUNED_RL_STATE_DIR": str(state_dir)}
    began = time.monotonic()
    child = subprocess.Popen([sys.executable, "-m", "tuned_rl.cli", "apply", "--dry-run", "--json", str(profile)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.monotonic() - began
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"the dry run failed: {child.stderr.read().decode()[-500:]}")
    return seconds, usage.ru_maxrss / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=20_000)
    parser.add_argument("--argv-mb", type=float, default=2.0)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the dry run reads every process, as apply does")
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        profile = work / "big.toml"
        profile.write_text(f'[target]\nname = "{MARKER}"\n\n[cpu_isolation]\nlatency_cpus = "1"\n\n'
                           '[cpu_isolation.pin]\n"^python" = "1"\n')
        figures = {"2 MB argv": [], "short argv": []}
        for label, argv_bytes in (("2 MB argv", int(args.argv_mb * (1 << 20))), ("short argv", 0)):
            ready = work / f"ready-{len(figures[label])}-{argv_bytes}"
            process = start(args.threads, argv_bytes, ready)
            try:
                length = len(Path(f"/proc/{process.pid}/cmdline").read_bytes())
                print(f"{label}: pid {process.pid}, {len(os.listdir(f'/proc/{process.pid}/task'))} threads, "
                      f"command line {length / (1 << 20):.2f} MiB", flush=True)
                for run in range(args.runs):
                    figures[label].append(dry_run(profile, work / "state"))
                    print(f"  run {run + 1}: {figures[label][-1][0]:.2f} s, {figures[label][-1][1]:.0f} MiB",
                          flush=True)
            finally:
                process.kill()
                process.wait()
    medians = {label: (statistics.median(s for s, _ in runs), statistics.median(m for _, m in runs))
               for label, runs in figures.items()}
    for label, (seconds, mib) in medians.items():
        print(f"{label:>10}: plan (dry run) median {seconds:.2f} s, peak memory median {mib:.0f} MiB")
    big, short = medians["2 MB argv"], medians["short argv"]
    print(f"2 MB argv / short argv: time x{big[0] / short[0]:.2f}, memory x{big[1] / short[1]:.2f} "
          f"(read whole once per thread, the command lines alone were "
          f"{args.threads * args.argv_mb / 1024:.0f} GB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
