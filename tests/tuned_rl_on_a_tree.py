"""`tuned-rl` for the unit tests: the command line as shipped, its host a TreeHost (tests/fakes.py)
whose root TUNED_RL_HOST_ROOT names, so that commands and systemd calls stay in the tree."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from fakes import TreeHost  # noqa: E402

from tuned_rl import cli  # noqa: E402

if __name__ == "__main__":
    cli.Host = TreeHost
    sys.exit(cli.main())
