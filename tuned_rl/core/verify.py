"""Verifying one step: measure the target without and with it, and judge whether it hurt."""

from __future__ import annotations

import math
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from tuned_rl.core.noise_memory import NoiseMemory
from tuned_rl.core.outcomes import Outcome
from tuned_rl.host import Host
from tuned_rl.measure.canary import CanarySpec
from tuned_rl.measure.judge import INCONCLUSIVE, NO_REGRESSION, REGRESSION, Verdict, judge
from tuned_rl.measure.measurement import Measurement, Recorder, Span, attach_probe
from tuned_rl.measure.probes import LatencyProbe, ProbeError
from tuned_rl.measure.settings import VerifySettings
from tuned_rl.measure.stats import QUANTILES, quantile, summarize
from tuned_rl.measure.judge import window_tail
from tuned_rl.measure.switchback import (FLOOR_NS, NO_PRIOR, TAIL_AT_LEAST, Look, Window, arm_order, look,
                                         tail_share_of, why_not_reverted)
from tuned_rl.measure.targets import Target, TargetError

Progress = Callable[[str], None]


class Stopped(BaseException):
    """Asked to stop (SIGTERM) while a step was being measured. Raised from a progress call; the
    verifier reverts the step under test, the agent drops its record, and the caller ends. A
    BaseException, as KeyboardInterrupt is: no handler of errors on one process may swallow it."""


@dataclass
class StepVerdict:
    """What verification found for one step, and what became of the step."""

    keep: bool
    outcome: Outcome  # KEPT, REVERTED or INCONCLUSIVE
    verdict: Verdict
    before: Measurement
    after: Measurement
    reused_baseline: bool = False
    rounds: list[dict] = field(default_factory=list)  # before-after design with rounds > 1
    blocks: list[dict] = field(default_factory=list)  # switchback design: each block's figures

    def figures(self) -> tuple[dict, dict]:
        return _figures(self.before), _figures(self.after)


class Verifier:
    """Holds a probe (and the canary, if the target is one) for the whole of an apply.

    ``verify(apply, revert)`` judges one step and leaves it applied if kept, reverted
    otherwise. The default design alternates without and with the step in blocks and
    stops as soon as the evidence decides (measure/switchback.py); ``design =
    "before-after"`` measures a fixed number of windows without, then with it (and
    with ``rounds`` > 1 alternates A B A B). If the probe fails at any point, the step
    is left applied (as with --no-verify), the error is raised, and the verifier is
    not used again: the report then says the step is applied and not verified.
    """

    def __init__(self, host: Host, target: Target, canary: CanarySpec | None, settings: VerifySettings,
                 progress: Progress = lambda message: None, memory: NoiseMemory | None = None):
        self.host, self.target, self.canary_spec, self.settings = host, target, canary, settings
        self.memory = memory  # the host's noise as an earlier apply learned it, recalled and kept
        self.progress = progress
        self._stack = ExitStack()
        self._probe: LatencyProbe | None = None
        self._tid_source: Callable[[], set[int]] = lambda: set()
        self.baseline: Measurement | None = None  # the host as it is now, if measured since the last change
        self.notes: list[str] = []
        self.failed: str | None = None  # why the probe stopped working, once it has
        self._recorder_of: Recorder | None = None
        self.prior = NO_PRIOR  # what earlier steps learned of the host's block-to-block noise
        self._per_block: int | None = None  # windows per switchback block, sized at the first baseline
        self._order = np.random.default_rng()  # the coin of each AB/BA pair

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

    def verify(self, label: str, apply: Callable[[], None], revert: Callable[[], None]) -> StepVerdict:
        """Verify one step; ``apply`` and ``revert`` change the host (and raise if they fail).

        Raises ProbeError with the step applied when the probe fails.
        """
        if self.failed:
            apply()
            raise ProbeError(self.failed)
        state = {"applied": False}

        def tracked(change: Callable[[], None], applied: bool) -> Callable[[], None]:
            def run() -> None:
                change()
                state["applied"] = applied
            return run

        design = self._switchback if self.settings.design == "switchback" else self._before_after
        try:
            return design(label, tracked(apply, True), tracked(revert, False))
        except Stopped:
            self.baseline = None
            if state["applied"]:
                revert()  # the host as it was before this step
            raise
        except (ProbeError, TargetError) as err:
            self.failed, self.baseline = f"the probe failed: {err}", None
            if not state["applied"]:
                apply()  # unmeasured, the step is applied as --no-verify would
            raise ProbeError(self.failed) from err

    # -- the switchback design -------------------------------------------------

    def _switchback(self, label: str, apply: Callable[[], None], revert: Callable[[], None]) -> StepVerdict:
        s = self.settings
        reused = self.baseline is not None
        self._recorder.forget_all_but(self.baseline.spans if reused else [])
        baseline = self.baseline or self._measure_baseline(label)
        sequential = s.switchback_settings(self._per_block)
        plan = [(span, False, 0) for span in baseline.spans]  # each window: its span, its arm, its block
        settling: list[Span] = []
        with_step, decision, last = False, None, baseline
        held: dict[int, str] = {}  # block: what held a keep back at the look after it
        order = arm_order(self._order, s.max_blocks, sequential.run_blocks, sequential.single_blocks)
        for block, arm in enumerate(order, 1):
            phase = f"block {block}/{s.max_blocks} {'with' if arm else 'without'} the step"
            if arm != with_step:  # pairs meeting with one arm (B A | A B) need no change, and no settling
                (apply if arm else revert)()
                with_step = arm
                settling.append(self._settle(label, phase))
            last = self._measure(label, phase, self._per_block)
            plan += [(span, with_step, block) for span in last.spans]
            decision = look([Window(span.values, a, span.midpoint, number) for span, a, number in plan], block,
                            sequential, self.prior)
            if decision.held:
                held[block] = decision.held
            if decision.outcome is not None:
                break
        arms = {arm: _arm(self._probe, [span for span, a, _ in plan if a == arm]) for arm in (False, True)}
        verdict = _switchback_verdict(decision, arms, s, sum(span.count for span in settling),
                                      sum(_last_of_each_block(plan)))
        keep = self._keeps(verdict)
        if keep != with_step:
            (apply if keep else revert)()
        # The last block measured the host as it now is, if the step ended where it was measured.
        self.baseline = last if keep == with_step else None
        if verdict.outcome != REGRESSION:  # the host's noise, learned for the next steps' harm bounds
            self.prior = self.prior.learned(decision, sequential.prior_df_cap)
            if self.memory is not None:
                self.memory.remember(self._per_block, self.prior)
        result = StepVerdict(keep, self._outcome(verdict), verdict, arms[False], arms[True], reused)
        result.blocks = _block_figures(plan, s.metric, held)
        return result

    def _measure_baseline(self, label: str) -> Measurement:
        """One block without the step; the first of an apply also sizes the blocks: one window, then
        as many more as the target's event rate needs for a block's metric tail (held for the apply,
        so that every block's statistic rests on as many waits and a noise prior carries over)."""
        if self._per_block is None:
            first = self._measure(label, "measuring without the step", 1)
            rate = first.spans[0].count / self.settings.window_seconds if first.spans else 0.0
            self._per_block = self.settings.windows_per_block(rate)
            if self.memory is not None:
                self.prior = self.memory.recall(self._per_block)
            if self._per_block > 1:
                self._recorder.record(self._per_block - 1, self.settings.window_seconds, measurement=first)
            return first
        return self._measure(label, "measuring without the step", self._per_block)

    # -- the before-after design -----------------------------------------------

    def _before_after(self, label: str, apply: Callable[[], None], revert: Callable[[], None]) -> StepVerdict:
        s = self.settings
        if s.rounds > 1:
            return self._rounds(label, apply, revert)
        reused = self.baseline is not None
        self._recorder.forget_all_but(self.baseline.spans if reused else [])
        before = self.baseline or self._measure(label, "measuring before", s.windows)
        apply()
        self._settle(label, "after the change")
        after = self._measure(label, "measuring after", s.windows)
        verdict = judge(before.windows, after.windows, s.judge_settings())
        result = self._decide(verdict, before, after, revert)
        result.reused_baseline = reused
        return result

    def _rounds(self, label: str, apply: Callable[[], None], revert: Callable[[], None]) -> StepVerdict:
        arm_a, arm_b, rounds = Measurement(self._probe.name), Measurement(self._probe.name), []
        self._recorder.forget_all_but([])
        per_block = math.ceil(self.settings.windows / self.settings.rounds)
        for number in range(1, self.settings.rounds + 1):
            if number > 1:
                revert()
            self._settle(label, f"round {number}: without")
            a = self._measure(label, f"round {number}/{self.settings.rounds}: without", per_block)
            apply()
            self._settle(label, f"round {number}: with")
            b = self._measure(label, f"round {number}/{self.settings.rounds}: with", per_block)
            _extend(arm_a, a)
            _extend(arm_b, b)
            rounds.append({"round": number, "before": _figures_of(a.windows), "after": _figures_of(b.windows)})
        verdict = judge(arm_a.windows, arm_b.windows, self.settings.judge_settings())
        result = self._decide(verdict, arm_a, arm_b, revert)
        result.rounds = rounds
        return result

    def _decide(self, verdict: Verdict, before: Measurement, after: Measurement,
                revert: Callable[[], None]) -> StepVerdict:
        keep = self._keeps(verdict)
        if not keep:
            revert()
        # What was measured last describes the host as it now is: the next step's baseline.
        self.baseline = after if keep else (before if self.settings.rounds == 1 else None)
        return StepVerdict(keep, self._outcome(verdict), verdict, before, after)

    # -- shared ----------------------------------------------------------------

    @property
    def _recorder(self) -> Recorder:
        """Counts each wait in the window where it began, across steps (a baseline is reused)."""
        if self._recorder_of is None or self._recorder_of.probe is not self._probe:
            self._recorder_of = Recorder(self._probe, self._tid_source)
        return self._recorder_of

    def _keeps(self, verdict: Verdict) -> bool:
        if verdict.outcome == REGRESSION:
            return False
        return not (verdict.outcome == INCONCLUSIVE and self.settings.on_inconclusive == "revert")

    def _outcome(self, verdict: Verdict) -> str:
        if verdict.outcome == INCONCLUSIVE:
            return Outcome.INCONCLUSIVE if self._keeps(verdict) else Outcome.REVERTED
        return Outcome.REVERTED if verdict.outcome == REGRESSION else Outcome.KEPT

    def _measure(self, label: str, phase: str, windows: int) -> Measurement:
        return self._recorder.record(windows, self.settings.window_seconds,
                                     lambda left: self.progress(f"{label}: {phase}, {max(left, 0):.0f} s left"))

    def _settle(self, label: str, phase: str) -> Span:
        """Let the change take hold: from the end of the last window, for ``settle_seconds`` more, the
        waits that begin are dropped (the change itself is made in that time too)."""
        if self.settings.settle_seconds > 0:
            self.progress(f"{label}: {phase}: settling {self.settings.settle_seconds:g} s")
        return self._recorder.settle(self.settings.settle_seconds)


def _switchback_verdict(decision: Look, arms: dict[bool, Measurement], settings: VerifySettings, settling: int,
                        straddled: int) -> Verdict:
    """The verdict, with the figures that decided it: what the report shows is what was judged."""
    lower = decision.bound if decision.outcome == REGRESSION else None
    upper = decision.bound if decision.outcome != REGRESSION else None
    claim = settings.confidence if decision.outcome == REGRESSION else settings.harm_confidence
    return Verdict(decision.outcome or INCONCLUSIVE, _metric(arms[False], settings.metric),
                   _metric(arms[True], settings.metric), decision.p_value, decision.reason, effect=decision.effect,
                   upper=upper, lower=lower, windows=sum(len(a.spans) for a in arms.values()),
                   seconds=sum(a.seconds for a in arms.values()), rule=decision.rule, statistic=decision.statistic,
                   tail_before_us=decision.tail_us[0], tail_after_us=decision.tail_us[1],
                   why_not_reverted=why_not_reverted(decision, settings.switchback_settings()),
                   settling_dropped=settling, straddled=straddled, metric=settings.metric,
                   confidence=claim, look_level=decision.level, harm=decision.harm,
                   randomization_p=decision.randomization_p, noisy_blocks=decision.noisy_blocks,
                   blocks=decision.blocks, noise_prior_df=_borrowed_df(decision), unit=decision.unit,
                   run_blocks=decision.run_blocks)


def _borrowed_df(decision: Look) -> int:
    """The degrees of freedom a keep's harm bound took from the noise prior (0 for other verdicts)."""
    tail = decision.tail
    return tail.df - tail.own_df if decision.outcome == NO_REGRESSION and tail is not None else 0


def _arm(probe: LatencyProbe, spans: list[Span]) -> Measurement:
    """One arm of a switchback verdict: its windows, however many blocks they came from."""
    return Measurement(probe.name, spans, probe.lost, sum(span.end_ns - span.start_ns for span in spans) / 1e9)


def _block_figures(plan: list[tuple[Span, bool, int]], metric: str = "p999",
                   held: dict[int, str] | None = None) -> list[dict]:
    """Each block's figures (the baseline's, block 0, left out), with every wait that began in it:
    its arm, whether a change was made just before it (``after_change``: in step with the switching,
    where an artefact of the change itself would show), the statistic the verdict read of it
    (``tail_us``: the geometric mean of its slowest 0.1% for p999), and at a look after it that
    could keep but measured on, what held the keep back (``keep_held_back``: "tail" or "broad" for
    a harm bound not yet under its named harm, "run sign" or "sign" for a sign of harm)."""
    arms = dict.fromkeys((number, arm) for _, arm, number in plan)
    previous, figures = False, []
    for number, arm in arms:
        values = [span.values for span, _, n in plan if n == number]
        if number > 0:
            pooled = np.concatenate(values) if values else np.array([], dtype=np.int64)
            tail = window_tail(pooled, tail_share_of(metric), TAIL_AT_LEAST, FLOOR_NS) if len(pooled) else math.nan
            figures.append({"block": number, "with_step": arm, "after_change": arm != previous,
                            "tail_us": round(math.exp(tail) / 1000, 1) if math.isfinite(tail) else None,
                            **_figures_of(values)})
            if held and number in held:
                figures[-1]["keep_held_back"] = held[number]
        previous = arm
    return figures


def _last_of_each_block(plan: list[tuple[Span, bool, int]]) -> list[int]:
    """Of each block's last window, the waits that ended after it: they straddled a change of arm."""
    last: dict[int, Span] = {}
    for span, _, number in plan:
        last[number] = span
    return [span.ended_after for span in last.values()]


def _extend(arm: Measurement, block: Measurement) -> None:
    arm.spans += block.spans
    arm.seconds += block.seconds
    arm.lost = block.lost  # the probe's count so far


def _metric(measurement: Measurement, metric: str) -> float:
    return quantile(measurement.values, QUANTILES[metric]) / 1000 if measurement.spans else float("nan")


def _figures(measurement: Measurement) -> dict:
    return {**measurement.summary().to_dict(), "lost": measurement.lost, "windows": len(measurement.spans)}


def _figures_of(windows: list[np.ndarray]) -> dict:
    values = np.concatenate(windows) if windows else np.array([], dtype=np.int64)
    return summarize(values).to_dict()
