"""Run every scenario of the lab once and print the table docs/lab.md shows.

    sudo .venv/bin/python bench/scenarios/run_all.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import diagnosis  # noqa: E402
import drifting_target  # noqa: E402
import fifo_removal  # noqa: E402
import harmful_cpuset  # noqa: E402
import harmful_step  # noqa: E402
import harmless_step  # noqa: E402
import noisy_neighbour  # noqa: E402
import rt_throttling  # noqa: E402
from lab import HEADER  # noqa: E402


def main() -> None:
    print(HEADER, flush=True)
    runs = [(rt_throttling.run, None), (harmful_step.run, None), (harmful_cpuset.run, harmful_cpuset.row),
            (harmless_step.run, None),
            (drifting_target.run, None), (lambda state: drifting_target.run(state, "ramp"), None),
            (lambda state: fifo_removal.run(state, "helps"), None), (lambda state: fifo_removal.run(state, "hurts"), None)]
    runs += [(lambda state, v=v: noisy_neighbour.run(state, v), noisy_neighbour.row)
             for v in ("isolate", "evict", "evict-isolate")]
    for run, row in runs:
        with tempfile.TemporaryDirectory() as state:
            result = run(Path(state))
        print(row(result) if row else result.row(), flush=True)
        verdicts = [s["verdict"] for s in result.report["steps"] if s.get("verdict")]
        if verdicts and verdicts[-1].get("seconds") is not None:
            print(f"  {'':<14} decided on {verdicts[-1]['windows']} windows, {verdicts[-1]['seconds']} s of measurement",
                  flush=True)
    print("\ndiagnose, then apply what it wrote:", flush=True)
    for case in diagnosis.CASES.values():
        with tempfile.TemporaryDirectory() as state:
            print(case(Path(state)).row(), flush=True)


if __name__ == "__main__":
    main()
