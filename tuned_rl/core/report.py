"""What `apply` and `rollback` did, as the stable JSON report and as a table for people."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tuned_rl.core.outcomes import Outcome
from tuned_rl.host.untrusted import printable
from tuned_rl.measure.stats import format_us
from tuned_rl.rendering import RendersJson, format_table

OUTCOMES = tuple(Outcome)  # every outcome a step can have, in the order reports count them


SHOWN_CHANGES = 12  # a step over many tasks lists this many changes in the table; JSON lists all


@dataclass
class ChangeReport:
    target: str
    before: str | None  # None: absent
    after: str | None

    def to_dict(self) -> dict:
        return {"target": self.target, "before": self.before, "after": self.after}


@dataclass
class StepReport:
    plugin: str
    step: str
    changes: list[ChangeReport]
    outcome: Outcome
    reason: str = ""
    before: dict | None = None  # latency figures, once a probe measured the step
    after: dict | None = None
    verdict: dict | None = None  # the judge's p-value and ratio
    reused_baseline: bool = False  # "before" is the previous step's measurement
    rounds: list[dict] | None = None  # each round's figures, with [verify] rounds > 1
    blocks: list[dict] | None = None  # each switchback block's figures
    phase: str | None = None  # when the step runs (tuned_rl.core.phases)
    gone: int = 0  # tasks that exited (or whose pid was reused) before they could be changed
    notes: list[str] = field(default_factory=list)  # what the plugin says beside the step
    record: object = field(default=None, repr=False, compare=False)  # the journal's record of it, if it holds one

    def to_dict(self) -> dict:
        data = {"plugin": self.plugin, "step": self.step, "phase": self.phase,
                "changes": [c.to_dict() for c in self.changes],
                "outcome": self.outcome, "reason": self.reason}
        if self.gone:
            data["gone"] = self.gone
        if self.notes:
            data["notes"] = self.notes
        if self.before is not None:
            data.update(before=self.before, after=self.after, verdict=self.verdict,
                        reused_baseline=self.reused_baseline)
        if self.rounds:
            data["rounds"] = self.rounds
        if self.blocks:
            data["blocks"] = self.blocks
        return data


@dataclass
class Report(RendersJson):
    profile: str
    dry_run: bool
    steps: list[StepReport] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # things said before the steps ran
    digest: str | None = None  # the profile's (Profile.digest), as `status` names the applied one

    def to_dict(self) -> dict:
        data = {"profile": self.profile, "dry_run": self.dry_run,
                "notes": self.notes, "steps": [s.to_dict() for s in self.steps]}
        if self.digest is not None:
            data["digest"] = self.digest
        return data

    def to_text(self) -> str:
        title = f"profile {self.profile}" + (" (dry run: nothing was changed)" if self.dry_run else "")
        lines = [printable(title), *(f"  note: {printable(n)}" for n in self.notes)]
        lines += format_table(
            ("PHASE", "STEP", "OUTCOME", "CHANGE"),
            [row for step in self.steps for row in _step_rows(step)],
        )
        return "\n".join(lines)


def _step_rows(step: StepReport) -> list[tuple[str, str, str, str]]:
    return [((step.phase or "") if i == 0 else "", *row) for i, row in enumerate(_rows_of(step))]


def _rows_of(step: StepReport) -> list[tuple[str, str, str]]:
    name = f"{step.plugin}: {step.step}"
    changes = [f"{c.target}: {_value(c.before)} -> {_value(c.after)}" for c in step.changes[:SHOWN_CHANGES]]
    if len(step.changes) > SHOWN_CHANGES:
        changes.append(f"... and {len(step.changes) - SHOWN_CHANGES} more (--json lists every change)")
    rows = [(name if i == 0 else "", step.outcome if i == 0 else "", text) for i, text in enumerate(changes)]
    if not rows:
        rows = [(name, step.outcome, "")]
    switchback = bool(step.verdict and step.verdict.get("statistic"))
    if step.before is not None:
        b, a = step.before, step.after
        arms = "without -> with the step" if switchback else "before -> after"
        rows.append(("", "", f"latency {arms}: p99 {format_us(b['p99_us'])} -> {format_us(a['p99_us'])}, p999 "
                             f"{format_us(b['p999_us'])} -> {format_us(a['p999_us'])} (n {b['n']} / {a['n']})"))
    if step.gone:
        rows.append(("", "", f"({step.gone} tasks exited before they were changed)"))
    rows += [("", "", f"note: {note}") for note in step.notes]
    if step.reason:
        rows.append(("", "", f"({step.reason})"))
    if switchback:
        rows += [("", "", line) for line in _judged_lines(step.verdict)]
    for figures in step.rounds or []:
        rows.append(("", "", f"round {figures['round']}: p999 {format_us(figures['before']['p999_us'])} -> "
                             f"{format_us(figures['after']['p999_us'])}"))
    return rows


def _judged_lines(v: dict) -> list[str]:
    """What decided a switchback verdict, in figures: the statistic per arm, its drift-adjusted ratio
    and bound, what the verdict claims at what error rate, the one line that says why a rise was not
    reverted, and the waits at the changes."""
    bound = (f", at least x{v['effect_lower']:.3g}" if v.get("effect_lower") is not None else
             f", at most x{v['effect_upper']:.3g}" if v.get("effect_upper") is not None else "")
    level = v.get("look_level")
    at = f" ({level_text(level)} at this look)" if bound and level else ""
    over = (f"each run's waits ({v.get('run_blocks')} blocks of one arm in a row)" if v.get("unit") == "run"
            else "each block's waits")
    lines = [f"judged on {v['statistic']} of {over}: {format_us(v['statistic_without_us'] or math.nan)} "
             f"without, {format_us(v['statistic_with_us'] or math.nan)} with the step (geometric means); drift "
             f"allowed for x{v['effect']:.3g}{bound}{at}; {v['windows']} windows, {v['seconds']:g} s"]
    claim = _claim(v)
    if claim:
        lines.append(claim)
    if v.get("why_not_reverted"):
        lines.append(v["why_not_reverted"])
    if v.get("straddled"):
        lines.append(f"({v['straddled']} waits began before a change of arm and ended after it: each counted in the "
                     "arm where it began)")
    return lines


def _claim(v: dict) -> str | None:
    """The verdict's claim and its error rate over all looks, in one line."""
    confidence = v.get("confidence")
    if not confidence:
        return None
    error = f"{1 - confidence:.0%}".replace(".0%", "%")
    borrowed = (f"; the noise of the host learned over {v['noise_prior_df']} degrees of freedom of earlier "
                "steps on this host" if v.get("noise_prior_df") else "")
    if v.get("outcome") == "regression":
        return (f"reverted: {v['statistic']} worse than the tolerance at {level_text(confidence)} (a step within "
                f"the tolerance is reverted at most {error} of the time, over every look)")
    if v.get("rule") in ("harm ruled out", "tail bounded", "large improvement") and v.get("harm"):
        return (f"kept: {v['statistic']} worse than x{v['harm']:g} ruled out at {level_text(confidence)} (a step "
                f"that harmful is kept at most {error} of the time, over every look){borrowed}")
    return None


def level_text(level: float) -> str:
    """99%, 99.5%, 99.95%: a confidence with the digits that matter."""
    for digits in range(0, 4):
        text = f"{level * 100:.{digits}f}"
        if abs(float(text) - level * 100) < 1e-9 or digits == 3:
            return f"{text}%"
    return f"{level:.3%}"  # pragma: no cover


def _value(value: str | None) -> str:
    if value is None:
        return "(absent)"
    first, _, rest = value.partition("\n")
    return first.replace("\t", " ") + (" ..." if rest.strip() else "")  # one table row per change


def to_diff(report: Report) -> str:
    """The plan as a unified-diff-style listing of live values, for a change review: one hunk per
    step that changes something, ``-`` the value the host holds now, ``+`` the value planned."""
    lines = ["--- live values of this host", f"+++ profile {printable(report.profile)}"]
    lines += [f"# note: {printable(note)}" for note in report.notes]
    for step in report.steps:
        header = printable(f"@@ {step.phase or ''}: {step.plugin}: {step.step} ({step.outcome}) @@")
        if step.outcome == Outcome.SKIPPED:
            lines += [header, f"# skipped: {printable(step.reason)}"]
            continue
        if not step.changes or step.outcome == Outcome.UNCHANGED:
            continue
        lines.append(header)
        for change in step.changes:
            for sign, value in (("-", change.before), ("+", change.after)):
                text = "(absent)" if value is None else value
                first, *more = [printable(line) for line in text.split("\n")]
                target = printable(change.target)
                lines.append(f"{sign}{target} = {first}")
                lines += [f"{sign}{' ' * len(target)}   {line}" for line in more]
        lines += [f"# note: {printable(note)}" for note in step.notes]
    return "\n".join(lines)
