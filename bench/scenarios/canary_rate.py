"""The canary's rate against the time a harmless step takes to be kept: the harmless step of
harmless_step.py (vm.swappiness moved by one) applied with canaries of each PERIODxTHREADS given
(the wake period in us, the number of threads), alternated in one run, each apply in a fresh state
directory; per apply the verdict, its seconds of measuring and the variance of the log of its
blocks' slowest 0.1% (from adjacent blocks' differences, so that drift does not count), then the
medians per canary.

    sudo .venv/bin/python bench/scenarios/canary_rate.py [--rounds 10] [--canaries 500x4 250x4 500x8]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from lab import apply_profile, rollback  # noqa: E402

SWAPPINESS = Path("/proc/sys/vm/swappiness")
PROFILE = """\
[profile]
name = "lab-canary-rate"

[target]
canary = true
canary_period_us = {period}
canary_threads = {threads}

[sysctl]
"vm.swappiness" = {value}
"""


def block_variance(step: dict) -> float:
    """Half the variance of the differences of adjacent blocks' log tail: a block's own noise."""
    logs = [math.log(block["tail_us"]) for block in step.get("blocks") or [] if block.get("tail_us")]
    differences = [b - a for a, b in zip(logs, logs[1:])]
    return statistics.variance(differences) / 2 if len(differences) >= 2 else math.nan


def run(period: int, threads: int) -> tuple[str, float, float]:
    original = SWAPPINESS.read_text().strip()
    value = int(original) + 1 if int(original) < 200 else int(original) - 1
    with tempfile.TemporaryDirectory() as state:
        report, _ = apply_profile(PROFILE.format(period=period, threads=threads, value=value), Path(state))
        rollback(Path(state))
    if SWAPPINESS.read_text().strip() != original:
        raise SystemExit(f"vm.swappiness not restored: {SWAPPINESS.read_text().strip()} (was {original})")
    step = report["steps"][-1]
    return step["outcome"], (step.get("verdict") or {}).get("seconds") or math.nan, block_variance(step)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--canaries", nargs="+", default=["500x4", "250x4", "500x8"], metavar="PERIODxTHREADS")
    args = parser.parse_args()
    canaries = [tuple(int(part) for part in text.split("x")) for text in args.canaries]
    results: dict[tuple, list[tuple[str, float, float]]] = {canary: [] for canary in canaries}
    for _ in range(args.rounds):
        for period, threads in canaries:
            outcome, seconds, variance = run(period, threads)
            results[(period, threads)].append((outcome, seconds, variance))
            print(f"{period:5d} us x{threads}  {outcome:12s} {seconds:5.1f} s  block variance {variance:.3f}",
                  flush=True)
    for (period, threads), rows in results.items():
        print(f"{period} us x{threads}: kept {sum(o == 'kept' for o, _, _ in rows)} of {len(rows)}; median "
              f"{statistics.median(s for _, s, _ in rows):.1f} s of measuring, block variance "
              f"{statistics.median(v for _, _, v in rows):.3f}")


if __name__ == "__main__":
    main()
