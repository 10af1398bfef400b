"""Run every scenario of the lab once and print the table the README shows.

    sudo .venv/bin/python bench/scenarios/run_all.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import drifting_target  # noqa: E402
import harmful_step  # noqa: E402
import harmless_step  # noqa: E402
import rt_throttling  # noqa: E402
from lab import HEADER  # noqa: E402


def main() -> None:
    print(HEADER, flush=True)
    for run in (rt_throttling.run, harmful_step.run, harmless_step.run, drifting_target.run,
                lambda state: drifting_target.run(state, "ramp")):
        with tempfile.TemporaryDirectory() as state:
            result = run(Path(state))
        print(result.row(), flush=True)


if __name__ == "__main__":
    main()
