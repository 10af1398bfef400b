"""A harmless step is kept: vm.swappiness moves by one, which the canary's run-queue latency ignores.

    sudo .venv/bin/python bench/scenarios/harmless_step.py [--runs 20 [--verify harm=4] [--canary 250x4]]

With --runs N it repeats the scenario and tallies the decisions (the lab's bar: kept or
inconclusive in at least 19 of 20).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from lab import Outcome, apply_profile, main_once, main_runs, outcome_of, rollback, verify_table  # noqa: E402

SWAPPINESS = Path("/proc/sys/vm/swappiness")
PROFILE = """\
[profile]
name = "lab-harmless"

[target]
canary = true
{canary}

[sysctl]
"vm.swappiness" = {value}
"""


def apply_and_roll_back(state_dir: Path, canary: str = "", verify: Sequence[str] = ()) -> tuple[dict, float, bool]:
    """The step applied and rolled back (``canary``: more [target] keys; ``verify``: [verify] settings):
    the report, the apply's seconds, and whether vm.swappiness is back."""
    original = SWAPPINESS.read_text().strip()
    value = str(int(original) + 1 if int(original) < 200 else int(original) - 1)
    report, seconds = apply_profile(PROFILE.format(canary=canary, value=value) + verify_table(verify), state_dir)
    rollback(state_dir)
    return report, seconds, SWAPPINESS.read_text().strip() == original


def run(state_dir: Path, verify: Sequence[str] = (), canary: str = "") -> Outcome:
    return outcome_of("harmless step", *apply_and_roll_back(state_dir, canary, verify))


if __name__ == "__main__":
    main_runs(run, verify=True, canary=True) if "--runs" in sys.argv else main_once(run)
