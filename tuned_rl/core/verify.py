"""Verifying one step: measure the target without and with it, and judge whether it hurt."""

from __future__ import annotations

import math
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from tuned_rl.measure.canary import CanarySpec
from tuned_rl.host import Host
from tuned_rl.measure.judge import INCONCLUSIVE, REGRESSION, Verdict, judge
from tuned_rl.measure.measurement import Measurement, attach_probe, record_windows
from tuned_rl.measure.probes import LatencyProbe
from tuned_rl.measure.stats import summarize
from tuned_rl.measure.targets import Target
from tuned_rl.measure.settings import VerifySettings

Progress = Callable[[str], None]


@dataclass
class StepVerdict:
    """What verification found for one step, and what became of the step."""

    keep: bool
    outcome: str  # kept | reverted | inconclusive
    verdict: Verdict
    before: Measurement
    after: Measurement
    reused_baseline: bool = False
    rounds: list[dict] = field(default_factory=list)

    def figures(self) -> tuple[dict, dict]:
        return _figures(self.before), _figures(self.after)


class Verifier:
    """Holds a probe (and the canary, if the target is one) for the whole of an apply.

    ``verify(apply, revert)`` measures, applies, settles, measures again and judges;
    with ``rounds`` > 1 it alternates A B A B, discarding the first window after each
    switch. It leaves the step applied if kept and reverted otherwise.
    """

    def __init__(self, host: Host, target: Target, canary: CanarySpec | None, settings: VerifySettings,
                 progress: Progress = lambda message: None):
        self.host, self.target, self.canary_spec, self.settings = host, target, canary, settings
        self.progress = progress
        self._stack = ExitStack()
        self._probe: LatencyProbe | None = None
        self._tid_source: Callable[[], set[int]] = lambda: set()
        self.baseline: Measurement | None = None  # the host as it is now, if measured since the last change
        self.notes: list[str] = []

    def __enter__(self) -> "Verifier":
        try:
            attached = attach_probe(self._stack, self.host, self.target, self.settings.probe, self.canary_spec)
        except BaseException:
            self._stack.close()
            raise
        self._probe, self._tid_source, self.notes = attached.probe, attached.tid_source, attached.notes
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def seconds_per_step(self) -> float:
        s = self.settings
        if s.rounds == 1:
            return 2 * s.windows * s.window_seconds + s.settle_seconds
        return 2 * s.rounds * (self._block_windows() * s.window_seconds) + s.rounds * s.settle_seconds

    def verify(self, label: str, apply: Callable[[], None], revert: Callable[[], None]) -> StepVerdict:
        """Verify one step; ``apply`` and ``revert`` change the host (and raise if they fail)."""
        if self.settings.rounds > 1:
            return self._verify_rounds(label, apply, revert)
        reused = self.baseline is not None
        before = self.baseline or self._measure(label, "measuring before", self.settings.windows)
        apply()
        self._settle(label)
        after = self._measure(label, "measuring after", self.settings.windows)
        verdict = judge(before.windows, after.windows, self.settings.judge_settings())
        result = self._decide(verdict, before, after, revert)
        result.reused_baseline = reused
        return result

    # -- internals -------------------------------------------------------------

    def _verify_rounds(self, label: str, apply: Callable[[], None], revert: Callable[[], None]) -> StepVerdict:
        arm_a, arm_b, rounds = Measurement(self._probe.name), Measurement(self._probe.name), []
        per_block = self._block_windows()
        for number in range(1, self.settings.rounds + 1):
            if number > 1:
                revert()
            a = self._measure(label, f"round {number}/{self.settings.rounds}: without", per_block)
            apply()
            self._settle(label)
            b = self._measure(label, f"round {number}/{self.settings.rounds}: with", per_block)
            for arm, block in ((arm_a, a), (arm_b, b)):
                arm.windows += block.windows[1:]  # the first window after a switch is settling
                arm.window_tids += block.window_tids[1:]
                arm.lost += block.lost
            rounds.append({"round": number, "before": _figures_of(a.windows[1:]), "after": _figures_of(b.windows[1:])})
        verdict = judge(arm_a.windows, arm_b.windows, self.settings.judge_settings())
        result = self._decide(verdict, arm_a, arm_b, revert)
        result.rounds = rounds
        return result

    def _decide(self, verdict: Verdict, before: Measurement, after: Measurement,
                revert: Callable[[], None]) -> StepVerdict:
        if verdict.outcome == REGRESSION:
            outcome = "reverted"
        elif verdict.outcome == INCONCLUSIVE:
            outcome = "inconclusive" if self.settings.on_inconclusive == "keep" else "reverted"
        else:
            outcome = "kept"
        keep = outcome != "reverted"
        if not keep:
            revert()
        # What was measured last describes the host as it now is: the next step's baseline.
        self.baseline = after if keep else (before if self.settings.rounds == 1 else None)
        return StepVerdict(keep, outcome, verdict, before, after)

    def _measure(self, label: str, phase: str, windows: int) -> Measurement:
        return record_windows(self._probe, self._tid_source, windows, self.settings.window_seconds,
                              lambda left: self.progress(f"{label}: {phase}, {max(left, 0):.0f} s left"))

    def _settle(self, label: str) -> None:
        if self.settings.settle_seconds > 0:
            self.progress(f"{label}: settling {self.settings.settle_seconds:g} s")
            time.sleep(self.settings.settle_seconds)

    def _block_windows(self) -> int:
        return math.ceil(self.settings.windows / self.settings.rounds) + 1


def _figures(measurement: Measurement) -> dict:
    return {**measurement.summary().to_dict(), "lost": measurement.lost, "windows": len(measurement.windows)}


def _figures_of(windows: list[np.ndarray]) -> dict:
    values = np.concatenate(windows) if windows else np.array([], dtype=np.int64)
    return summarize(values).to_dict()
