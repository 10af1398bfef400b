"""A harmless step is kept: vm.swappiness moves by one, which the canary's run-queue latency ignores.

    sudo .venv/bin/python bench/scenarios/harmless_step.py [--runs 20] [--rounds 1]

With --runs N it repeats the scenario and prints how many runs kept the step (the lab's
bar: at least 19 of 20). With --rounds 3 the steps are verified in interleaved rounds.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from lab import HEADER, Outcome, apply_profile, outcome_of, rollback  # noqa: E402

SWAPPINESS = Path("/proc/sys/vm/swappiness")
PROFILE = """\
[profile]
name = "lab-harmless"

[target]
canary = true

[verify]
rounds = {rounds}

[sysctl]
"vm.swappiness" = {value}
"""


def run(state_dir: Path, rounds: int = 1) -> Outcome:
    original = SWAPPINESS.read_text().strip()
    value = str(int(original) + 1 if int(original) < 200 else int(original) - 1)
    report, seconds = apply_profile(PROFILE.format(value=value, rounds=rounds), state_dir)
    rollback(state_dir)
    return outcome_of("harmless step", report, seconds, SWAPPINESS.read_text().strip() == original)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    print(HEADER, flush=True)
    decisions = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as state:
            result = run(Path(state), args.rounds)
        decisions.append(result.decision)
        print(result.row(), flush=True)
    print(f"kept in {decisions.count('kept')} of {args.runs} runs (rounds = {args.rounds}); "
          f"decisions: {', '.join(sorted(set(decisions)))}")


if __name__ == "__main__":
    main()
