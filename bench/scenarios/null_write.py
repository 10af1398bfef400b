"""The lab's A/A: a step that writes a value the workload cannot feel, through a real toggle.

    sudo .venv/bin/python bench/scenarios/null_write.py [--runs 40]

`kernel.printk_ratelimit` (the seconds between rate-limited kernel messages) moves by one with
`[sysctl]`: journaled, written, read back and undone at every change of arm like any step, so
whatever the switching itself costs (the journal's fsync, the write, this process waking) is in
the measurement, and nothing else. The verdict should never be "reverted". Each run prints its
blocks' statistic in order (the slowest 0.1%'s geometric mean, B with the step, a * after a
change), and the runs together test the blocks for a period of two: the statistic of blocks
measured just after a change against those that followed a block of the same arm (an artefact in
step with the switching shows there, whatever the arm), and with the step against without.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from lab import Outcome, apply_profile, main_once, main_runs, outcome_of, rollback  # noqa: E402

RATELIMIT = Path("/proc/sys/kernel/printk_ratelimit")
PROFILE = """\
[profile]
name = "lab-null-write"

[target]
canary = true

[sysctl]
"kernel.printk_ratelimit" = {value}
"""
BLOCKS: list[dict] = []  # every run's blocks, for the period-two check at the end


def run(state_dir: Path) -> Outcome:
    original = RATELIMIT.read_text().strip()
    value = str(int(original) + 1 if int(original) < 1000 else int(original) - 1)
    report, seconds = apply_profile(PROFILE.format(value=value), state_dir)
    rollback(state_dir)
    blocks = report["steps"][-1].get("blocks") or []
    BLOCKS.extend(blocks)
    print("  blocks: " + " ".join(f"{'B' if b['with_step'] else 'A'}{'*' if b['after_change'] else ''}"
                                  f"{b['tail_us']:.0f}" for b in blocks if b.get("tail_us")), flush=True)
    return outcome_of("null write", report, seconds, RATELIMIT.read_text().strip() == original)


def period_two() -> None:
    import math
    def geometric(rows):
        values = [math.log(b["tail_us"]) for b in rows if b.get("tail_us")]
        return (math.exp(statistics.fmean(values)), len(values)) if values else (math.nan, 0)
    for label, key in (("after a change / after the same arm", "after_change"), ("with / without the step", "with_step")):
        yes, n_yes = geometric([b for b in BLOCKS if b[key]])
        no, n_no = geometric([b for b in BLOCKS if not b[key]])
        print(f"{label}: x{yes / no:.3f} ({yes:.0f} µs over {n_yes} blocks, {no:.0f} µs over {n_no})")


if __name__ == "__main__":
    if "--runs" in sys.argv:
        main_runs(run)
        period_two()
    else:
        main_once(run)
