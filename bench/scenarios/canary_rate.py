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
from harmless_step import apply_and_roll_back  # noqa: E402
from lab import block_noise, canary_shape  # noqa: E402


def block_variance(step: dict) -> float:
    """Half the variance of the differences of adjacent blocks' log tail: a block's own noise."""
    return block_noise([math.log(block["tail_us"]) for block in step.get("blocks") or [] if block.get("tail_us")])


def run(canary: str) -> tuple[str, float, float]:
    with tempfile.TemporaryDirectory() as state:
        report, _, restored = apply_and_roll_back(Path(state), canary)
    if not restored:
        raise SystemExit("vm.swappiness not restored")
    step = report["steps"][-1]
    return step["outcome"], (step.get("verdict") or {}).get("seconds") or math.nan, block_variance(step)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--canaries", nargs="+", default=["500x4", "250x4", "500x8"], metavar="PERIODxTHREADS")
    args = parser.parse_args()
    try:  # a malformed one is an error before the first apply
        shapes = {name: canary_shape(name) for name in args.canaries}
    except argparse.ArgumentTypeError as error:
        parser.error(str(error))
    results: dict[str, list[tuple[str, float, float]]] = {name: [] for name in shapes}
    for _ in range(args.rounds):
        for name, shape in shapes.items():
            outcome, seconds, variance = run(shape)
            results[name].append((outcome, seconds, variance))
            print(f"{name:>8}  {outcome:12s} {seconds:5.1f} s  block variance {variance:.3f}", flush=True)
    for name, rows in results.items():
        print(f"{name}: kept {sum(o == 'kept' for o, _, _ in rows)} of {len(rows)}; median "
              f"{statistics.median(s for _, s, _ in rows):.1f} s of measuring, block variance "
              f"{statistics.median(v for _, _, v in rows):.3f}")


if __name__ == "__main__":
    main()
