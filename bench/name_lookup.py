"""What one look-up of a `name:` target costs the measuring process (it runs once a second while a
workload named that way is measured, and the workload may wait behind it).

    .venv/bin/python bench/name_lookup.py [--rounds 200]

Two arms in alternation, CPU time of this thread per look-up over every process on the host,
medians (quartiles): "pathlib", each process's comm and command line read with Host.read and
Host.read_bytes, paths built through pathlib (tuned-rl until this release), and "fd", through
bare file descriptors on string paths (Host.process_names, now).
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from tuned_rl.host import Host
from tuned_rl.measure.targets import Target, resolve_tids

PATTERN = "tuned-rl-bench-no-such-workload"  # every process is read, none matches


def lookup_pathlib(host: Host, pattern: re.Pattern) -> set[int]:
    """The look-up as it was: Host.read and Host.read_bytes, each path built through pathlib."""
    found = set()
    for pid in sorted(int(p.name) for p in host.path("/proc").iterdir() if p.name.isdigit()):
        try:
            comm = host.read(f"/proc/{pid}/comm")
            cmdline = host.read_bytes(f"/proc/{pid}/cmdline").replace(b"\0", b" ").decode(errors="replace").strip()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if pattern.search(comm) or pattern.search(cmdline):
            found.add(pid)
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    host, target, pattern = Host(), Target.parse(f"name:{PATTERN}"), re.compile(PATTERN)
    arms = {"pathlib": lambda: lookup_pathlib(host, pattern), "fd": lambda: resolve_tids(host, target)}
    spent: dict[str, list[float]] = {arm: [] for arm in arms}
    for number in range(args.rounds):
        for arm in (list(arms) if number % 2 == 0 else list(arms)[::-1]):
            started = time.thread_time()
            arms[arm]()
            spent[arm].append((time.thread_time() - started) * 1e3)
    processes = len(host.pids())
    for arm, values in spent.items():
        low, median, high = statistics.quantiles(values, n=4)
        print(f"{arm:8} {median:.2f} ms ({low:.2f}-{high:.2f}) a look-up over {processes} processes, "
              f"{1000 * median / processes:.1f} µs a process")
    print(f"pathlib / fd: {statistics.median(spent['pathlib']) / statistics.median(spent['fd']):.1f}x")


if __name__ == "__main__":
    main()
