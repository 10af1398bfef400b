"""A harmless step judged on a live workload that drifts: it must not be reverted.

The request/response workload (workload.py: one server, four clients waking every
millisecond) and three CPU-bound jobs start together, 2 s before `apply`: for the next
half minute the workload's event rate falls and its tail grows on their own (the drift
that made a before/after comparison revert this step in 5 of 10 runs). The profile
names the workload (`[target] name = ...`) and nudges kernel.printk_ratelimit by one.
Variant "ramp": the clients also speed up from one request every 4 ms to one every
1 ms over the first 60 s.

    sudo .venv/bin/python bench/scenarios/drifting_target.py [--variant start|ramp] [--runs 20] [--design before-after]
        [--verify harm=4]

The bar: kept or inconclusive in at least 19 of 20 runs of each variant, reverted in at most 1.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from lab import (HEADER, Outcome, add_verify_option, apply_profile, hog_command, outcome_of,  # noqa: E402
                 processes, rollback, verify_table)
from workload import MARKER  # noqa: E402

PRINTK = Path("/proc/sys/kernel/printk_ratelimit")
PROFILE = """\
[profile]
name = "lab-drifting-{variant}"

[target]
name = "{marker}"
{verify}
[sysctl]
"kernel.printk_ratelimit" = {value}
"""


def workload_command(variant: str) -> list[str]:
    command = [sys.executable, str(Path(__file__).parent / "workload.py"), "--marker", MARKER, "--clients", "4",
               "--period-us", "1000"]
    return command + (["--ramp-from-us", "4000", "--ramp-seconds", "60"] if variant == "ramp" else [])


def run(state_dir: Path, variant: str = "start", design: str = "switchback", verify: Sequence[str] = ()) -> Outcome:
    """``verify``: more [verify] settings (``verify_setting`` lines) for the profile."""
    original = PRINTK.read_text().strip()
    profile = PROFILE.format(variant=variant, marker=MARKER, value=int(original) + 1,
                             verify=verify_table([f'design = "{design}"', *verify]))
    with processes([workload_command(variant)] + [hog_command()] * 3):
        time.sleep(2)  # the workload and the jobs have just started: they drift from here on
        report, seconds = apply_profile(profile, state_dir)
        rollback(state_dir)
    return outcome_of(f"drifting, {variant}", report, seconds, PRINTK.read_text().strip() == original)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--variant", choices=("start", "ramp"), default="start")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--design", choices=("switchback", "before-after"), default="switchback",
                        help="before-after: the fixed design (15 windows, then 15), for comparison")
    add_verify_option(parser)
    args = parser.parse_args()
    print(HEADER, flush=True)
    decisions = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as state:
            result = run(Path(state), args.variant, args.design, args.verify)
        decisions.append(result.decision)
        print(result.row(), flush=True)
        print(f"  {result.report['steps'][-1]['reason']}", flush=True)
    print(f"{args.variant}, {args.design}: kept {decisions.count('kept')}, inconclusive {decisions.count('inconclusive')}, "
          f"reverted {decisions.count('reverted')} of {args.runs}")


if __name__ == "__main__":
    main()
