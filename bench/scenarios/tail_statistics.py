"""Which block statistic separates a rare stall from a block's own noise: the canary measured in
0.5 s blocks, its helper (rare_stalls.py's, pinned to the canary's CPU) SCHED_IDLE, then
SCHED_FIFO:10, for each canary shape given, alternated in one run; per block each statistic below,
then per shape and statistic the block's own noise (half the variance of adjacent blocks'
differences, so that drift does not count) with the helper idle, and the stall's signal (the mean
with the helper FIFO less the mean with it idle, in log).

    sudo .venv/bin/python bench/scenarios/tail_statistics.py [--spin-ms 3] [--every-s 1] [--rounds 6]
        [--blocks 40] [--canaries 500x4 250x4] [--cpu 1]

The statistics: the judge's (the mean log of a block's slowest 0.1%, at least 4 waits), and the mean
log of a block's slowest 2, 4 and 8 waits whatever its count. The helper's spin delays each canary
thread's wake once, so its signal rests on as many waits as the canary has threads; a statistic on
more waits dilutes it, one on fewer is noisier. A keep at harm x3 needs about
(2 t sd / log 3)^2 blocks, where sd is the block noise's square root and t about 2.9 at the
judge's keep levels: the column "blocks" shows it.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from lab import block_noise, canary_shape, processes  # noqa: E402
from rare_stalls import helper_command  # noqa: E402

from tuned_rl.host import Host  # noqa: E402
from tuned_rl.measure.canary import CanarySpec  # noqa: E402
from tuned_rl.measure.judge import window_tail  # noqa: E402
from tuned_rl.measure.measurement import measure_target  # noqa: E402
from tuned_rl.measure.switchback import FLOOR_NS, TAIL_AT_LEAST, tail_share_of  # noqa: E402
from tuned_rl.measure.targets import Target  # noqa: E402

BLOCK_SECONDS = 0.5
KEEP_T = 2.9  # the t quantile of the judge's keep levels (0.994 one-sided at 12 df)


def slowest(count: int):
    return lambda values: window_tail(values, 0.0, count, FLOOR_NS)


STATISTICS = {"judge's (0.1%)": lambda values: window_tail(values, tail_share_of("p999"), TAIL_AT_LEAST, FLOOR_NS),
              "slowest 2": slowest(2), "slowest 4": slowest(4), "slowest 8": slowest(8)}


def shape_of(text: str) -> tuple[int, int]:
    """``PERIODxTHREADS`` as (period, threads), for argparse (lab.canary_shape says what is wrong)."""
    canary_shape(text)
    period, _, threads = text.partition("x")
    return int(period), int(threads)


def measure(period_us: int, threads: int, cpu: int, blocks: int) -> dict[str, list[float]]:
    spec = CanarySpec(period_us=period_us, threads=threads, cpus=str(cpu))
    measurement = measure_target(Host(), Target("canary"), blocks, BLOCK_SECONDS, "auto", spec)
    spans = [span.values for span in measurement.spans if span.count > 0]
    return {name: [statistic(values) for values in spans] for name, statistic in STATISTICS.items()}


def noise(series: list[list[float]]) -> float:
    """The block noise of each run's series (lab.block_noise), averaged over the runs."""
    return statistics.mean(block_noise(values) for values in series)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spin-ms", type=float, default=3.0)
    parser.add_argument("--every-s", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--blocks", type=int, default=40)
    parser.add_argument("--cpu", type=int, default=1)
    parser.add_argument("--canaries", nargs="+", type=shape_of, default=[(500, 4), (250, 4)], metavar="PERIODxTHREADS")
    args = parser.parse_args()
    shapes = args.canaries
    series: dict[tuple[int, int, str], list[dict[str, list[float]]]] = {}
    with processes([helper_command(args.spin_ms, args.every_s, args.cpu)]) as (helper,):
        time.sleep(0.5)
        for round_ in range(args.rounds):
            for period_us, threads in shapes:
                for policy in ("idle", "fifo"):
                    os.sched_setscheduler(helper.pid, os.SCHED_FIFO if policy == "fifo" else os.SCHED_IDLE,
                                          os.sched_param(10 if policy == "fifo" else 0))
                    try:
                        blocks = measure(period_us, threads, args.cpu, args.blocks)
                    finally:
                        os.sched_setscheduler(helper.pid, os.SCHED_IDLE, os.sched_param(0))
                    series.setdefault((period_us, threads, policy), []).append(blocks)
                    print(f"round {round_ + 1}: {period_us} us x {threads}, helper {policy}: "
                          + ", ".join(f"{name} {statistics.mean(v):.2f}" for name, v in blocks.items()), flush=True)
    print(f"\nhelper spinning {args.spin_ms:g} ms every {args.every_s:g} s, {args.rounds} rounds of {args.blocks} "
          f"blocks of {BLOCK_SECONDS} s per shape and policy")
    print(f"{'canary':10} {'statistic':16} {'noise':>6} {'signal':>14} {'blocks':>7}")
    for period_us, threads in shapes:
        for name in STATISTICS:
            idle = [run[name] for run in series[(period_us, threads, "idle")]]
            fifo = [run[name] for run in series[(period_us, threads, "fifo")]]
            variance = noise(idle)
            signal = statistics.mean(map(statistics.mean, fifo)) - statistics.mean(map(statistics.mean, idle))
            blocks = (2 * KEEP_T * math.sqrt(variance) / math.log(3)) ** 2
            print(f"{period_us}x{threads:<6} {name:16} {variance:6.2f} {signal:+6.2f} (x{math.exp(signal):4.2f}) "
                  f"{blocks:7.1f}")


if __name__ == "__main__":
    main()
