"""How long does a five-step profile take to verify? (Bar: a median of 30 seconds at the default [verify].)

Five harmless steps (sysctls nudged by one) verified against a canary, then rolled back.
With ``--verify KEY=NUMBER``, the profile is judged with that [verify] setting, e.g. ``harm=4``.

    sudo .venv/bin/python bench/scenarios/five_steps.py [--runs N] [--verify harm=4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from lab import apply_profile, held_back, held_back_line, rollback, add_verify_option, verify_table  # noqa: E402

SYSCTLS = ["vm/swappiness", "vm/dirty_ratio", "vm/dirty_background_ratio", "vm/vfs_cache_pressure",
           "kernel/sched_rr_timeslice_ms"]


def run(state_dir: Path, steps: int = 5, max_blocks: int | None = None,
        verify: Sequence[str] = ()) -> tuple[dict, float, bool]:
    """The first ``steps`` sysctls nudged, one step each (``max_blocks``: the profile's [verify]
    budget, else the default; ``verify``: more ``verify_setting`` lines): the report, the seconds,
    whether restored."""
    original = {s: Path(f"/proc/sys/{s}").read_text().strip() for s in SYSCTLS[:steps]}
    keys = "".join(f'"{s}" = {int(v) + 1}\n' for s, v in original.items())
    settings = [*verify, *([f"max_blocks = {max_blocks}"] if max_blocks else [])]
    report, seconds = apply_profile(f"[target]\ncanary = true\n{verify_table(settings)}\n[sysctl]\n{keys}",
                                    state_dir)
    rollback(state_dir)
    restored = {s: Path(f"/proc/sys/{s}").read_text().strip() for s in original} == original
    return report, seconds, restored


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1)
    add_verify_option(parser)
    args = parser.parse_args()
    totals = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as state:
            report, seconds, restored = run(Path(state), verify=args.verify)
        totals.append(seconds)
        for step in report["steps"]:
            print(f"{step['step']:<45} {step['outcome']:<13} reused baseline: {step.get('reused_baseline')}, "
                  f"{step['verdict']['seconds']:g} s measured")
            if step["outcome"] != "kept":
                print(f"  {step['reason']}")
            looks = held_back(step)
            if looks:
                print(f"  {held_back_line(looks)}")
        print(f"five steps in {seconds:.1f} s; host restored: {restored}", flush=True)
    if args.runs > 1:
        print(f"{args.runs} runs: median {statistics.median(totals):.1f} s ({', '.join(f'{t:.1f}' for t in totals)})")


if __name__ == "__main__":
    main()
