"""The fleet judge's error rates and power, on recorded canary histograms (bench/data).

    .venv/bin/python bench/fleet_sim.py [--trials 1000] [--seed 1]

Each trial's nodes replay one recording (bench/data/canary8k_quiet, _jobs, _noisy_host: 0.25 s windows of a real
canary's waits, 300 s each; a fleet of one kind of node on one kind of day): each sub-window (60 s) a span
of it from a random offset, drawn afresh for every node and sub-window, its waits scaled
by a factor of its own (hardware, log-normal, sd 0.1) and one that every node shares in that
sub-window (the fleet's traffic, sd 0.15); a regression multiplies a treated node's waits. Each
node-minute becomes the histogram watch exports (its bucket bounds), and the judge
(tuned_rl/fleet/verdict.py) decides treated against control as it does from Prometheus. Prints one
row per case: how often it failed, passed, or was inconclusive, and how often the regressed node
was named.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tuned_rl.fleet.node_windows import NodeWindows  # noqa: E402
from tuned_rl.fleet.verdict import FAIL, PASS, FleetSettings, judge  # noqa: E402
from tuned_rl.watch.metrics_endpoint import BOUNDS  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
RECORDINGS = ("canary8k_quiet", "canary8k_jobs", "canary8k_noisy_host")  # 300 s each (canary8k_today: 120 s, two sub-windows)
FINE_PER_DOUBLING, LOW, HIGH = 64, 8, 35  # the fine grid waits are binned on: 2^8 to 2^35 ns
BOUNDS_S = [ns / 1e9 for _, ns in BOUNDS] + [math.inf]
NODE_SD, TIME_SD = 0.10, 0.15
SUB_WINDOW_S = 60.0  # the judge's sub-window (--sub-window)
MINUTE_S = 60.0  # the fleet's traffic and a node's draw of the recording change every minute


class Recording:
    """A recording's windows as fine histograms, summed by prefix so that any run of windows is one subtraction."""

    def __init__(self, name: str):
        data = np.load(DATA / f"{name}.npz")
        self.window_s = float(data["window_seconds"])
        count = len([k for k in data.files if k.startswith("count_")])
        bins = (HIGH - LOW) * FINE_PER_DOUBLING
        fine = np.zeros((count, bins))
        self.below = np.zeros(count)  # waits under the kept top 20%: below any quantile the judge reads
        for index in range(count):
            top = data[f"top_{index}"].astype(float)
            where = np.clip(((np.log2(np.maximum(top, 1)) - LOW) * FINE_PER_DOUBLING).astype(int), 0, bins - 1)
            fine[index] = np.bincount(where, minlength=bins)
            self.below[index] = int(data[f"count_{index}"]) - len(top)
        self.prefix = np.vstack([np.zeros(bins), np.cumsum(fine, axis=0)])
        self.below_prefix = np.concatenate([[0], np.cumsum(self.below)])
        self.windows = count

    def span(self, start: int, length: int) -> tuple[np.ndarray, float]:
        """The fine histogram and the count below it of ``length`` windows from ``start`` (wrapping)."""
        start %= self.windows
        end = start + length
        if end <= self.windows:
            return self.prefix[end] - self.prefix[start], self.below_prefix[end] - self.below_prefix[start]
        tail, low_tail = self.span(start, self.windows - start)
        head, low_head = self.span(0, end - self.windows)
        return tail + head, low_tail + low_head


FINE_CENTRES_NS = 2.0 ** (LOW + (np.arange((HIGH - LOW) * FINE_PER_DOUBLING) + 0.5) / FINE_PER_DOUBLING)
BOUNDS_NS = np.array([ns for _, ns in BOUNDS], dtype=float)


def coarse(fine: np.ndarray, below: float, factor: float) -> np.ndarray:
    """Watch's cumulative buckets of waits ``fine`` scaled by ``factor`` (``below`` in the first bucket)."""
    shift = int(round(math.log2(factor) * FINE_PER_DOUBLING))
    shifted = np.zeros_like(fine)
    if shift >= 0:
        shifted[shift:] = fine[:len(fine) - shift]
        shifted[-1] += fine[len(fine) - shift:].sum() if shift else 0
    else:
        shifted[:shift] = fine[-shift:]
        shifted[0] += fine[:-shift].sum()
    index = np.searchsorted(BOUNDS_NS, FINE_CENTRES_NS)  # len(BOUNDS) is +Inf
    counts = np.bincount(index, weights=shifted, minlength=len(BOUNDS_NS) + 1)
    counts[0] += below
    return np.cumsum(counts)


def simulate(rng, recordings, treated: int, control: int, minutes: int, ratio: float, regressed: int | None):
    """Node windows for one trial: (treated, control, before); ``regressed`` treated nodes (None: all)
    have their waits x ``ratio`` after the change; ``before`` is every node's window before it."""
    recording = recordings[rng.integers(len(recordings))]  # one kind of node, one kind of day, per trial
    minute_windows = int(round(MINUTE_S / recording.window_s))
    length = int(round(SUB_WINDOW_S / recording.window_s))
    nodes: dict[str, dict[str, NodeWindows]] = {"treated": {}, "control": {}, "before": {}}
    for group, count in (("treated", treated), ("control", control)):
        for number in range(count):
            own = math.exp(rng.normal(0, NODE_SD))
            hit = group == "treated" and (regressed is None or number < regressed)
            for period, shared in (("before", BEFORE_SHARED), (group, AFTER_SHARED)):
                windows = NodeWindows(f"{group}-{number}", BOUNDS_S, [])
                for minute in range(minutes):
                    # A recording holds 5 minutes: each minute is a span of it from a random offset,
                    # drawn afresh (a replay in order would give the window before the change the
                    # same minutes as the one after, and a difference of the two no noise at all),
                    # and cut into sub-windows in order: what a minute holds (a stall lasting
                    # seconds) stays in the sub-windows that follow one another.
                    start = int(rng.integers(recording.windows))
                    scale = own * shared[minute] * (ratio if hit and period != "before" else 1.0)
                    for offset in range(0, minute_windows - length + 1, length):
                        fine, below = recording.span(start + offset, length)
                        windows.counts.append(coarse(fine, below, scale))
                nodes[period][windows.node] = windows
    return nodes["treated"], nodes["control"], nodes["before"]


BEFORE_SHARED = AFTER_SHARED = np.ones(1)  # set per trial (the fleet's traffic in each minute)


CASES = [  # (label, treated, control, minutes, ratio, regressed nodes)
    ("A/A, 10 v 10, 15 min", 10, 10, 15, 1.0, None),
    ("1.1x (the tolerance), 10 v 10, 15 min", 10, 10, 15, 1.1, None),
    ("1.2x, 10 v 10, 15 min", 10, 10, 15, 1.2, None),
    ("1.5x on every treated node, 10 v 10, 15 min", 10, 10, 15, 1.5, None),
    ("1.5x on 1 of 10 treated, 10 v 10, 15 min", 10, 10, 15, 1.5, 1),
    ("2x on 1 of 10 treated, 10 v 10, 15 min", 10, 10, 15, 2.0, 1),
    ("1.5x, 3 v 3, 15 min", 3, 3, 15, 1.5, None),
    ("1.5x, 5 v 5, 15 min", 5, 5, 15, 1.5, None),
    ("1.5x, 20 v 20, 15 min", 20, 20, 15, 1.5, None),
    ("1.5x, 10 v 10, 5 min", 10, 10, 5, 1.5, None),
    ("1.5x, 10 v 10, 10 min", 10, 10, 10, 1.5, None),
    ("1.5x, 5 treated v 15 control (a first wave), 15 min", 5, 15, 15, 1.5, None),
    ("1.5x, 10 v 10, 30 min", 10, 10, 30, 1.5, None),
    ("A/A, 3 v 3, 15 min", 3, 3, 15, 1.0, None),
    ("A/A, 20 v 20, 15 min", 20, 20, 15, 1.0, None),
]


def main(argv=None) -> int:
    global SUB_WINDOW_S, BEFORE_SHARED, AFTER_SHARED
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--case", action="append", help="only the cases whose label holds this text")
    parser.add_argument("--recording", action="append", choices=RECORDINGS,
                        help="replay only this recording (default: each trial one of them at random)")
    parser.add_argument("--design", choices=("before-after", "same-hours"), default="before-after",
                        help="each node's change from the window before (default), or the same hours alone")
    parser.add_argument("--sub-window", type=float, default=SUB_WINDOW_S,
                        help=f"seconds a sub-window (default {SUB_WINDOW_S:g}: the judge's default)")
    parser.add_argument("--reference-quantile", type=float, default=FleetSettings.reference_quantile,
                        help="the quantile of the control nodes' waits together that each sub-window's reference is")
    parser.add_argument("--quiet-share", type=float, default=FleetSettings.quiet_share,
                        help="the share of alpha the quieter halves' tests spend (0: every sub-window's alone)")
    parser.add_argument("--quiet-from", type=int, default=FleetSettings.quiet_from,
                        help="sub-windows a window needs for the quieter halves to be tested")
    args = parser.parse_args(argv)
    SUB_WINDOW_S = args.sub_window
    recordings = [Recording(name) for name in (args.recording or RECORDINGS)]
    settings = FleetSettings(reference_quantile=args.reference_quantile, quiet_share=args.quiet_share,
                             quiet_from=args.quiet_from)
    print(f"| case | fail | pass | inconclusive | regressed node named | group test fails | a node named wrongly | median shift |  ({args.trials} trials, "
          f"seed {args.seed}, {args.design}, {', '.join(args.recording or ['every recording'])}, reference "
          f"p{args.reference_quantile * 100:g} of the control nodes, quieter halves' share {args.quiet_share:g} from {args.quiet_from} sub-windows)")
    print("|---|---|---|---|---|---|---|---|")
    for label, treated, control, minutes, ratio, regressed in CASES:
        if args.case and not any(text in label for text in args.case):
            continue
        rng = np.random.default_rng(args.seed)
        outcomes, named, shifts, began = [], 0, [], time.monotonic()
        by_group = wrongly_named = 0
        for _ in range(args.trials):
            BEFORE_SHARED, AFTER_SHARED = (np.exp(rng.normal(0, TIME_SD, minutes)) for _ in range(2))
            now, earlier, before = simulate(rng, recordings, treated, control, minutes, ratio, regressed)
            verdict = judge(now, earlier, settings, before if args.design == "before-after" else None)
            outcomes.append(verdict.outcome)
            named += regressed is not None and "treated-0" in verdict.regressed_nodes
            by_group += verdict.p_value is not None and (
                verdict.p_value <= settings.alpha_group * (1 - verdict.quiet_share)
                or verdict.quiet_p_value <= settings.alpha_group * verdict.quiet_share)
            wrongly_named += any(ratio == 1.0 or (regressed is not None and n != "treated-0")
                                 for n in verdict.regressed_nodes)
            if verdict.shift is not None:
                shifts.append(verdict.shift)
        share = {o: outcomes.count(o) / len(outcomes) for o in (FAIL, PASS)}
        print(f"| {label} | {share[FAIL]:.1%} | {share[PASS]:.1%} | {1 - share[FAIL] - share[PASS]:.1%} | "
              f"{named / args.trials:.1%} | {by_group / args.trials:.1%} | {wrongly_named / args.trials:.1%} | x{np.median(shifts) if shifts else float('nan'):.2f} |", flush=True)
        print(f"  ({time.monotonic() - began:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
