"""Where a simulated step is decided, and what held the keep back at the looks before: one row of
bench/judge_sim.py's table, its trials run through the verifier's loop with each look logged.

    .venv/bin/python bench/judge_looks.py [--case "A/A bursty"] [--trials 300] [--seed 1] [--through 12]

Prints how many trials were decided at each block (and by which rule), then, for each look up to
--through at which a trial was not decided although a keep could look, what stood in the way: the
metric's tail bound at or over ``harm`` ("tail"), the slowest 5%'s at or over ``broad_harm``
("broad"), both, a sign of harm over runs or in the step's own fits ("run sign", "sign").
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import judge_sim  # noqa: E402

from tuned_rl.measure import switchback  # noqa: E402
from tuned_rl.measure.switchback import NO_PRIOR  # noqa: E402


def obstacle(windows, blocks: int, settings, prior) -> str:
    """What kept the harm bound from keeping at this look (``switchback.keep_held_back``); "other"
    where nothing in the keep's rules did (a rule before it decided nothing, and it keeps not)."""
    return switchback.keep_held_back(switchback.gather(windows, blocks, settings, prior)) or "other"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", default="A/A bursty", help="a row of judge_sim.py's table, by its exact label")
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--through", type=int, default=12, help="the last block whose undecided looks are explained")
    args = parser.parse_args()
    rows = {case.label: case for case in judge_sim.cases([8000], [])}
    if args.case not in rows:
        raise SystemExit(f"no row {args.case!r}; the rows: " + "; ".join(rows))
    case = rows[args.case]
    if case.steps != 1:
        raise SystemExit(f"{args.case!r} has {case.steps} steps: pick a row of one step")
    decided, held = collections.Counter(), collections.Counter()
    real_look = judge_sim.look

    def logged_look(windows, blocks, settings, prior=NO_PRIOR):
        decision = real_look(windows, blocks, settings, prior)
        if decision.outcome is not None:
            decided[(blocks, decision.rule)] += 1
        elif settings.looks_at(blocks) and blocks <= args.through:
            why = obstacle(windows, blocks, settings, prior)
            if why != "no keep look":
                held[(blocks, why)] += 1
        return decision

    judge_sim.look = logged_look
    seconds = []
    for trial in range(args.trials):  # each trial its own draws, as judge_sim.py's rows: the same trials
        source = judge_sim.synthetic_source(case, judge_sim.trial_rng(args.seed, trial), judge_sim.VERIFY.window_seconds)
        _, measured, _, _ = judge_sim.switchback_step(source, judge_sim.SWITCHBACK, None, NO_PRIOR, case.switching)
        seconds.append(measured)
    print(f"{case.label}: {args.trials} trials, seed {args.seed}, median {np.median(seconds):.1f} s of measuring")
    print("decided at block (rule): trials")
    for (blocks, rule), count in sorted(decided.items()):
        print(f"  {blocks:3d} ({rule}): {count} ({count / args.trials:.0%})")
    print(f"not decided at a look through block {args.through}, because:")
    for blocks in sorted({b for b, _ in held}):
        counts = {why: n for (b, why), n in held.items() if b == blocks}
        total = sum(counts.values())
        print(f"  {blocks:3d}: " + ", ".join(f"{why} {n} ({n / total:.0%})" for why, n in sorted(counts.items())))


if __name__ == "__main__":
    main()
