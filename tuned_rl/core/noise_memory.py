"""What the host's noise was the last time a target was measured here, kept for the next apply.

A verified step is kept once its harm bound is tight enough, and most of a first step's time goes
into learning how much a block's slowest waits move from block to block on this host (the noise
prior, tuned_rl/measure/switchback.py). The steps after it borrow what it learned; this file lets
the next apply's first step, or `watch` verifying a late step, borrow it too:
``<state_dir>/noise.json``, one entry per target, replaced whole.

An entry is recalled only where it was learned the same way: the same target table, metric,
window length and windows per block (a block's statistic rests on as many waits), in the same
boot, within ``[verify] noise_memory_hours``; and it counts as at most RECALLED_DF_CAP degrees of
freedom, so that a past stretch of noise never outweighs the step's own blocks for long. A keep
still refuses to borrow a quieter past when its own blocks are clearly noisier (the F test of
``NoisePrior.moderate``), and a regression rests on the step's own blocks only. Whatever is wrong
with the file (missing, unreadable, another version, values out of range) means nothing is
recalled: the first step learns the host's noise afresh, as on a new node.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tuned_rl.core.state_dir import ensure_private_dir
from tuned_rl.host.durable import read_nofollow, replace_durably
from tuned_rl.measure.switchback import NO_PRIOR, NoisePrior

NOISE_FILE = "noise.json"
VERSION = 1
RECALLED_DF_CAP = 12  # a remembered prior counts as at most this many degrees of freedom
MAX_ENTRIES = 16  # targets remembered; the oldest is forgotten first
MAX_FILE_BYTES = 64 * 1024


@dataclass(frozen=True)
class NoiseMemory:
    """The remembered noise of one target's blocks, in ``state_dir``."""

    state_dir: Path
    target_key: str  # a digest of the target table, the metric and the window length
    boot_id: str
    max_age_seconds: float
    clock: Callable[[], float] = time.time

    @classmethod
    def for_target(cls, state_dir: str | Path, target_table: dict, metric: str, window_seconds: float,
                   boot_id: str, hours: float) -> "NoiseMemory | None":
        """The memory of this target, or None where ``hours`` turns it off."""
        if not (isinstance(hours, (int, float)) and hours > 0):
            return None
        text = json.dumps({"target": target_table, "metric": metric, "window_seconds": window_seconds},
                          sort_keys=True, default=str)
        return cls(Path(state_dir), hashlib.sha256(text.encode()).hexdigest()[:32], boot_id, hours * 3600.0)

    def recall(self, windows_per_block: int) -> NoisePrior:
        """The prior learned here before, if it applies; NO_PRIOR otherwise."""
        entry = self._entries().get(self.target_key)
        if not isinstance(entry, dict):
            return NO_PRIOR
        learned_at = entry.get("learned_at")
        if (entry.get("boot_id") != self.boot_id or entry.get("windows_per_block") != windows_per_block
                or not _number(learned_at) or not 0 <= self.clock() - learned_at <= self.max_age_seconds):
            return NO_PRIOR
        tail, broad = _variance(entry.get("tail")), _variance(entry.get("broad"))
        if tail is None or broad is None:
            return NO_PRIOR
        return NoisePrior(tail, broad)

    def remember(self, windows_per_block: int, prior: NoisePrior) -> bool:
        """Keep ``prior`` for this target (a prior without both statistics is not kept). False if it
        could not be written: the memory saves time, nothing rests on it, so that fails nothing."""
        try:
            if prior.tail is None or prior.broad is None or not ensure_private_dir(self.state_dir, create=False):
                return False
            self._write(windows_per_block, prior)
            return True
        except (OSError, RuntimeError):
            return False

    def _write(self, windows_per_block: int, prior: NoisePrior) -> None:
        entries = self._entries()
        entries[self.target_key] = {"boot_id": self.boot_id, "windows_per_block": windows_per_block,
                                    "learned_at": self.clock(), "tail": list(prior.tail), "broad": list(prior.broad)}
        newest = sorted(entries.items(), key=lambda item: _learned_at(item[1]), reverse=True)[:MAX_ENTRIES]
        text = json.dumps({"version": VERSION, "entries": dict(newest)}, sort_keys=True)
        replace_durably(self.state_dir / NOISE_FILE, text.encode(), 0o600, ".tmp")

    def _entries(self) -> dict:
        try:
            if not ensure_private_dir(self.state_dir, create=False):
                return {}
            text = read_nofollow(self.state_dir / NOISE_FILE)
            data = json.loads(text) if len(text) <= MAX_FILE_BYTES else None
        except (OSError, ValueError, RuntimeError):
            return {}
        if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("entries"), dict):
            return {}
        return {key: value for key, value in data["entries"].items() if isinstance(value, dict)}


def _variance(value) -> tuple[float, int] | None:
    """A remembered (variance, degrees of freedom), checked, its freedom capped at RECALLED_DF_CAP."""
    if not (isinstance(value, list) and len(value) == 2 and _number(value[0]) and isinstance(value[1], int)
            and not isinstance(value[1], bool)):
        return None
    variance, df = value
    if not (0 < variance < 1e6 and df >= 1):
        return None
    return float(variance), min(df, RECALLED_DF_CAP)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _learned_at(entry: dict) -> float:
    value = entry.get("learned_at")
    return value if _number(value) else -math.inf
