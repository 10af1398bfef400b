"""One step written and undone: its originals journaled before the first write, each value read
back, a task gone or a value refused left out of the record; the record undone value by value."""

from __future__ import annotations

import dataclasses
import os
import signal
from dataclasses import dataclass, field
from typing import Callable

from tuned_rl.core.change_rows import RestoredChange
from tuned_rl.core.changes import Change, Step
from tuned_rl.core.journal import Journal, StepRecord
from tuned_rl.core.kinds import Refused
from tuned_rl.core.outcomes import Outcome, Restore
from tuned_rl.core.places import refusal
from tuned_rl.core.plugin_host import PluginHost
from tuned_rl.core.report import ChangeReport, StepReport
from tuned_rl.core.verify import StepVerdict, Stopped, Verifier
from tuned_rl.host import Host, TaskGone
from tuned_rl.host.host import TARGETED_ACTIONS
from tuned_rl.measure.probes import ProbeError

NOT_VERIFIED = "not verified"
WATCHED_STEP_INDEX = 1_000_000  # a record `tuned-rl watch` wrote: no step of the profile's plan


class HostError(RuntimeError):
    """The host could not be changed as planned (exit status 1)."""


class StepFailed(RuntimeError):
    """A write was refused, or did not read back as written."""


@dataclass
class StepWriter:
    """Writes and undoes steps on ``host``, journaling in ``journal``; ``plugins`` names each
    step's plugin and phase in its report."""

    plugins: PluginHost
    host: Host
    journal: Journal
    _read_back: dict = field(default_factory=dict, init=False, repr=False)

    def apply(self, index: int, step: Step, label: str, verifier: Verifier | None, unverified: str,
              by: str = "apply") -> StepReport:
        """Journal the step's originals, then write it (under ``verifier``'s judge if there is one:
        it applies and reverts through this writer), and report what holds. A task gone or a value
        the kernel refuses (``Refused``) is left out of the record; a write that fails or does not
        read back reverts the whole step. ``index`` is the step's place in the plan (watch's records:
        WATCHED_STEP_INDEX), ``by`` who wrote it ("apply", "watch")."""
        if step.skip_reason:
            return self.step_report(step, Outcome.SKIPPED, step.skip_reason)
        if not step.pending_changes:
            return self.step_report(step, Outcome.UNCHANGED, "already set")
        originals, gone = self._originals(step.pending_changes)
        if not originals:
            if gone:
                return self.step_report(step, Outcome.SKIPPED, "every task it would change has exited", [], tasks_of(gone))
            return self.step_report(step, Outcome.UNCHANGED, "already set")
        record = self.journal.add(StepRecord(0, self.host.boot_id(), self.plugin_of(step), step.title, index, originals,
                                             host_root=str(self.host.root), by=by))
        pause_point("journaled")
        gone_ids = {c.identity() for c in gone}
        refused: list[str] = []

        def set_all(changes: list[Change], value_of: Callable[[Change], object]) -> None:
            for change in changes:
                if change.identity() in gone_ids:
                    continue
                try:
                    self._write_change(change, value_of(change))
                except TaskGone:
                    gone_ids.add(change.identity())
                    gone.append(change)
                except Refused as err:  # never written: nothing of it to undo
                    gone_ids.add(change.identity())
                    refused.append(f"{change.label()}: {err}")
            self._run_follow_ups(changes)

        def apply() -> None:
            set_all(record.changes, lambda change: change.after)

        def revert() -> None:
            set_all(list(reversed(record.changes)), lambda change: change.before)

        try:
            result = verifier.verify(label, apply, revert) if verifier else apply()
        except Stopped:
            self.undo_record(record, force=True)  # the verifier reverted it: the record goes, the host checked
            raise
        except (OSError, StepFailed, LookupError) as err:
            left = [r for r in self.undo_record(record, force=True) if r.outcome == Restore.FAILED]
            undone = "step reverted" if not left else (f"reverting it failed too: {left[0].target}: "
                                                       f"{left[0].reason} (`tuned-rl rollback` retries)")
            return self.step_report(step, Outcome.FAILED, f"{describe_error(err)}; {undone}", None, tasks_of(gone))
        except ProbeError as err:  # the verifier left the step applied; only its measurement failed
            result, unverified = None, f"not verified: {err}; the step is applied"
        changes = [c for c in record.changes if c.identity() not in gone_ids]
        step = dataclasses.replace(step, notes=step.notes + [f"left as it is: {r}" for r in dict.fromkeys(refused)])
        if result is not None and not result.keep:
            # The verifier's revert wrote every value back and ran the follow-ups once: this only
            # checks, rewrites what does not read back, and drops the record.
            self.undo_record(record, force=True, follow_up_unchanged=False)
            return self._verified_report(step, result, changes, tasks_of(gone))
        if len(changes) < len(record.changes):
            # Refused (a managed IRQ) or gone: never written, so nothing to undo or to show in status.
            if changes:
                self.journal.replace(record, changes)
            else:
                self.journal.remove(record)
                return self.step_report(step, Outcome.UNCHANGED, "nothing could be changed", [], tasks_of(gone))
        self.journal.mark(record, "done")
        if result is None:
            report = self.step_report(step, Outcome.APPLIED, unverified or NOT_VERIFIED, changes, tasks_of(gone))
        else:
            report = self._verified_report(step, result, changes, tasks_of(gone))
        report.record = record  # what the journal now holds of the step (watch keeps an index of it)
        return report


    def _originals(self, changes: list[Change]) -> tuple[list[Change], list[Change]]:
        """The changes with ``before`` re-read now (the journal must hold the true original), and
        those whose task has gone since planning. A value already as wanted is left out."""
        originals, gone = [], []
        for change in changes:
            try:
                current = change.read(self.host)
            except TaskGone:
                gone.append(change)
                continue
            if not change.holds(current, change.after):
                originals.append(dataclasses.replace(change, before=current))
        return originals, gone


    def _verified_report(self, step: Step, result: StepVerdict, changes: list[Change], gone: int) -> StepReport:
        reason = result.verdict.reason + ("; baseline reused from the previous step" if result.reused_baseline else "")
        if result.outcome == Outcome.INCONCLUSIVE:
            reason += "; kept (on_inconclusive = keep)"
        report = self.step_report(step, result.outcome, reason, changes, gone)
        report.before, report.after = result.figures()
        report.verdict = result.verdict.to_dict()
        report.reused_baseline, report.rounds = result.reused_baseline, result.rounds or None
        report.blocks = result.blocks or None
        return report


    def _write_change(self, change: Change, value) -> None:
        try:
            change.write(self.host, value)
        except OSError as err:
            if isinstance(err, ProcessLookupError):
                raise TaskGone(f"{change.label()}: the task has exited") from err
            raise StepFailed(f"{change.label()}: the kernel refused {change.handler.show(value)!r}: "
                             f"{err.strerror or err}") from err
        pause_point("written")
        now = change.read(self.host)
        if change.handler.shows_read_back and value == change.after:
            self._read_back[change.identity()] = now
        if not change.holds(now, value):
            raise StepFailed(f"{change.label()}: wrote {change.handler.show(value)!r} but it reads back "
                             f"{change.handler.show(now)!r}")


    def _run_follow_ups(self, changes: list[Change]) -> None:
        # An action that acts on the changed file's unit runs once per file; the others once.
        wanted = dict.fromkeys((c.follow_up, c.target if c.follow_up in TARGETED_ACTIONS else None)
                               for c in changes if c.follow_up)
        for action, target in wanted:
            try:
                self.host.run_action(action, target)
            except OSError as err:
                raise StepFailed(f"follow-up {action} failed: {describe_error(err)}") from err


    def undo_record(self, record: StepRecord, force: bool, follow_up_unchanged: bool = True) -> list[RestoredChange]:
        """Restore one step's changes; ``force`` also overwrites values someone changed since.

        Follow-up actions run for the values restored and, unless ``follow_up_unchanged`` is
        False, for those already back too: after a crash, a file may have been restored without
        its daemon being restarted."""
        results, failed, touched = [], set(), []
        for change in reversed(record.changes):
            results.append(self._undo_one(record, change, force))
            if results[-1].outcome == Restore.FAILED:
                failed.add(change.identity())
            elif results[-1].outcome == Restore.RESTORED or results[-1].outcome == Restore.UNCHANGED \
                    and follow_up_unchanged:
                touched.append(change)
        try:
            self._run_follow_ups(touched)
        except StepFailed as err:  # keep the record: the next rollback runs the action again
            results.append(RestoredChange(record.plugin, record.step, "follow-up action", None, None,
                                          Restore.FAILED, str(err)))
            return results
        if failed:
            self.journal.replace(record, [c for c in record.changes if c.identity() in failed])
        else:
            self.journal.remove(record)
        return results


    def _undo_one(self, record: StepRecord, change: Change, force: bool) -> RestoredChange:
        show = change.handler.show
        result = RestoredChange(record.plugin, record.step, change.label(), None, show(change.before))
        try:
            current = change.read(self.host)
            result.before = show(current)
            drifted = not change.holds(current, change.after) and not change.holds(current, change.before)
            if drifted and not force:
                return dataclasses.replace(
                    result, after=show(current), outcome=Restore.LEFT,
                    reason=f"someone set it to {show(current)!r} since tuned-rl applied {show(change.after)!r}: "
                           f"kept (`tuned-rl rollback --force` restores the original {show(change.before)!r})")
            if drifted:
                result.reason = f"was {show(current)!r}, set by someone since the apply: restored with --force"
            if not change.holds(current, change.before):
                change.write(self.host, change.before)
                pause_point("restored")
                if not change.holds(change.read(self.host), change.before):
                    raise StepFailed(f"{change.label()} does not read back {show(change.before)!r}")
            result.outcome = Restore.UNCHANGED if change.holds(current, change.before) else Restore.RESTORED
        except (TaskGone, ProcessLookupError) as err:
            result.outcome, result.reason = Restore.GONE, str(err) or "the task has exited"
        except (OSError, StepFailed, LookupError) as err:
            result.outcome, result.reason = Restore.FAILED, describe_error(err)
        return result


    def check_writable(self, steps: list[Step]) -> None:
        mounts = [m.mount_point for m in self.host.cgroup_mounts()]
        for step in steps:
            for change in step.pending_changes:
                for path in change.handler.paths(change):
                    if reason := refusal(path, mounts):
                        raise HostError(f"plugin {self.plugin_of(step)} plans a write that tuned-rl refuses: {reason}; "
                                        "nothing was changed")
                path = change.handler.file(change)
                if path is None:
                    continue
                where = path
                while not self.host.exists(where) and where != "/":  # created by an earlier change
                    where = os.path.dirname(where)
                if not self.host.writable(where):
                    raise HostError(f"cannot write {path} (not root?); nothing was changed; "
                                    "`tuned-rl apply --dry-run` shows the plan without root")


    def plugin_of(self, step: Step) -> str:
        return self.plugins.owners.get(step.table, step.table)


    def step_report(self, step: Step, outcome: Outcome, reason: str, changes: list[Change] | None = None,
                     gone: int = 0) -> StepReport:
        shown = changes if changes is not None else (step.pending_changes or step.changes)
        return StepReport(self.plugin_of(step), step.title,
                          [ChangeReport(c.label(), c.handler.show(c.before),
                                        c.handler.show(self._read_back.get(c.identity(), c.after))
                                        if outcome in (Outcome.APPLIED, Outcome.KEPT, Outcome.INCONCLUSIVE) else c.handler.show(c.after))
                           for c in shown],
                          outcome, reason, phase=self.plugins.phase_of(step.table), gone=gone, notes=list(step.notes))


def tasks_of(changes: list[Change]) -> int:
    """How many distinct tasks ``changes`` are about."""
    return len({(c.task.pid, c.task.start_time) for c in changes if c.task is not None})



def describe_error(err: Exception) -> str:
    if isinstance(err, OSError) and err.strerror:
        return f"{err.filename or ''}: {err.strerror}".lstrip(": ")
    return str(err)



_pause_counts: dict[str, int] = {}


def pause_point(name: str) -> None:
    """Stop this process (SIGSTOP) at a named point, so a crash test can SIGKILL it there.

    Enabled only by ``TUNED_RL_PAUSE_AT=<name>[:<n>]`` (the n-th time the point is reached).
    """
    wanted = os.environ.get("TUNED_RL_PAUSE_AT")
    if not wanted:
        return
    point, _, nth = wanted.partition(":")
    if point != name:
        return
    _pause_counts[name] = _pause_counts.get(name, 0) + 1
    if _pause_counts[name] == int(nth or 1):
        os.kill(os.getpid(), signal.SIGSTOP)
