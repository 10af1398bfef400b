"""The README's main command as a new user meets it: `tuned-rl apply profiles/quickstart.toml`,
then `tuned-rl rollback`, N times; each run's seconds, each step's outcome and seconds of
measuring, and the medians. (The bar: at most 30 s an apply, no step inconclusive.)
Each run in a fresh state directory, as on a new node; with ``--one-state``, all in one, as a node
applied again: each apply after the first starts from the host's noise the last one remembered
(`<state-dir>/noise.json`).

With ``--verify KEY=NUMBER``, the profile is judged with that [verify] setting, e.g. ``harm=4``.

    sudo .venv/bin/python bench/scenarios/quickstart.py [--runs 5] [--one-state] [--verify harm=4]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from lab import apply_profile, rollback, add_verify_option, verify_table  # noqa: E402

QUICKSTART = Path(__file__).resolve().parents[2] / "profiles" / "quickstart.toml"


def run(state_dir: Path, verify: Sequence[str] = ()) -> tuple[dict, float]:
    report, seconds = apply_profile(QUICKSTART.read_text() + verify_table(verify), state_dir)
    rollback(state_dir)
    return report, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--one-state", action="store_true", help="every run in one state directory")
    add_verify_option(parser)
    args = parser.parse_args()
    seconds, inconclusive = [], 0
    with contextlib.ExitStack() as stack:
        shared = Path(stack.enter_context(tempfile.TemporaryDirectory())) if args.one_state else None
        for _ in range(args.runs):
            state = shared or Path(stack.enter_context(tempfile.TemporaryDirectory()))
            report, took = run(state, args.verify)
            seconds.append(took)
            steps = [(s["outcome"], (s.get("verdict") or {}).get("seconds"),
                      (s.get("verdict") or {}).get("noise_prior_df") or 0) for s in report["steps"]]
            inconclusive += sum(outcome == "inconclusive" for outcome, _, _ in steps)
            print(f"{took:5.1f} s  " + ", ".join(f"{o} ({m:g} s, {df} df borrowed)" if m is not None else o
                                                 for o, m, df in steps), flush=True)
            for step in report["steps"]:
                if step["outcome"] not in ("kept", "applied"):
                    print(f"  {step['step']}: {step['reason']}", flush=True)
    print(f"{args.runs} runs: median {statistics.median(seconds):.1f} s, at most {max(seconds):.1f} s; "
          f"{sum(s <= 30 for s in seconds)} of {args.runs} within 30 s; {inconclusive} steps inconclusive")


if __name__ == "__main__":
    main()
