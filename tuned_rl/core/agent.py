"""Applying planned steps with their undo records journaled before the first write; rollback and status."""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tuned_rl.core.change_rows import ChangeStatus, RestoredChange
from tuned_rl.core.changes import Change, Step
from tuned_rl.core.kinds import Refused
from tuned_rl.core.journal import Applied, Journal, Scan, StepRecord
from tuned_rl.core.lock import exclusive_lock
from tuned_rl.core.outcomes import Outcome, Restore, State
from tuned_rl.core.places import refusal
from tuned_rl.core.plugin_host import PluginHost
from tuned_rl.core.report import ChangeReport, Report, StepReport
from tuned_rl.core.rollback_report import RollbackReport
from tuned_rl.core.status_report import StatusReport
from tuned_rl.core.verify import StepVerdict, Stopped, Verifier
from tuned_rl.host import Host, TaskGone
from tuned_rl.host.host import TARGETED_ACTIONS
from tuned_rl.measure.probes import ProbeError
from tuned_rl.measure.probes.tracefs import remove_leftover_instances
from tuned_rl.measure.settings import VerifySettings
from tuned_rl.measure.targets import TargetError, lookalike_notes, target_from_table, target_processes
from tuned_rl.profiles.loader import Profile

Progress = Callable[[str], None]

NOT_VERIFIED = "not verified"
AWAITING_WORKLOAD = ("not verified yet: the workload is not running; `tuned-rl watch` verifies it when it starts "
                     "(until then it is applied, unverified)")


class HostError(RuntimeError):
    """The host could not be changed as planned (exit status 1)."""


class StepFailed(RuntimeError):
    """A write was refused, or did not read back as written."""


def _lasting(records: list[StepRecord]) -> list[StepRecord]:
    """``records`` with only the changes that survive a reboot (records left with none dropped)."""
    kept = []
    for record in records:
        lasting = [c for c in record.changes if c.handler.survives_reboot(c)]
        if lasting:
            kept.append(dataclasses.replace(record, changes=lasting))
    return kept


class RestoredView(Host):
    """The host's files as a rollback of ``records`` would leave them: for planning a dry run."""

    def __init__(self, host: Host, records: list[StepRecord]):
        super().__init__(host.root)
        self._restored: dict[str, str] = {}
        for change in (c for r in records for c in r.changes):  # oldest first: the first holds the original
            path = change.handler.file(change)
            if path is not None and isinstance(change.before, str):
                self._restored.setdefault(path, change.before)

    def read(self, target: str) -> str:
        return self._restored[target] if target in self._restored else super().read(target)


@dataclass
class Agent:
    """Applies a validated profile's plan to ``host``, journaling in ``journal``."""

    plugins: PluginHost
    host: Host
    journal: Journal
    progress: Progress = lambda message: None
    _read_back: dict = dataclasses.field(default_factory=dict, init=False, repr=False)

    def dry_run(self, profile: Profile) -> Report:
        """The plan, with nothing written anywhere (no lock, no state directory)."""
        report = Report(profile.name, dry_run=True, digest=profile.digest())
        host, records = self.host, []
        scan, applied = self.journal.scan(), self.journal.applied()
        stale = self._is_stale(applied, scan)
        carried = _lasting(scan.records) if stale else scan.records  # what a real apply would roll back
        if carried or (applied and not stale):
            records = carried
            report.notes.append(f"profile {applied.profile if applied else '?'} is applied: apply would roll "
                                "it back first; values below are those the rollback restores")
            host = RestoredView(self.host, records)
        report.notes += lookalike_notes(self.host, profile.get("target"))
        for step in self.plugins.plan(profile, host):
            step = _with_originals(step, records)
            outcome = (Outcome.SKIPPED if step.skip_reason else Outcome.PLANNED if step.pending_changes
                       else Outcome.UNCHANGED)
            report.steps.append(self._step_report(step, outcome, step.skip_reason or ""))
        return report

    def apply(self, profile: Profile, verify: bool = True, max_blocks: int | None = None) -> tuple[Report, int]:
        """Roll back what is applied, then apply (and verify) each step; returns the report and exit status.
        ``max_blocks`` replaces the profile's [verify] max_blocks."""
        report = Report(profile.name, dry_run=False, digest=profile.digest())
        with exclusive_lock(self.journal.state_dir), ExitStack() as stack:
            report.notes += self._clear_previous()
            report.notes += lookalike_notes(self.host, profile.get("target"))
            steps = self.plugins.plan(profile, self.host)
            self._check_writable(steps)
            applied = Applied(profile.name, str(profile.path), self.host.boot_id(), time.time(), str(self.host.root),
                              profile.digest())
            self.journal.begin(applied)
            changing = any(s.pending_changes and not s.skip_reason for s in steps)
            verifier, unverified = (None, "")
            if changing and verify and self._workload_absent(profile):
                unverified = AWAITING_WORKLOAD  # measuring nothing would only read "0 samples"
            elif changing:
                verifier, unverified = self._start_verifier(stack, profile, verify, max_blocks)
            report.notes += verifier.notes if verifier else []
            status = 0
            for index, step in enumerate(steps):
                if status:
                    report.steps.append(self._step_report(step, Outcome.SKIPPED,
                                                          "not attempted: an earlier step failed"))
                    continue
                label = f"[{index + 1}/{len(steps)}] {self._plugin(step)}: {step.title}"
                self.progress(label)
                step_report = self._apply_step(index, step, label, verifier, unverified)
                report.steps.append(step_report)
                status = 1 if step_report.outcome == Outcome.FAILED else 0
            if status:
                self.journal.finish()  # a failed apply left nothing of itself (its step reverted)
            else:
                # applied.json stays even when no step changed anything: the profile is applied, and
                # `tuned-rl watch` keeps it in force for the processes that start later, but for the
                # steps verified harmful, and applies the deferred ones when the workload starts.
                deferred = [s.table for s in steps if s.skip_reason and s.waits_for_workload]
                reverted = sorted({s.table for s, r in zip(steps, report.steps) if r.outcome == Outcome.REVERTED})
                awaiting = [{"table": s.table, "step": s.title} for s, r in zip(steps, report.steps)
                            if _verified_on_nothing(r)]
                verified = [_verdict(s, r) for s, r in zip(steps, report.steps)
                            if r.before is not None and not _verified_on_nothing(r)]
                if deferred or reverted or awaiting or verified:
                    self.journal.begin(dataclasses.replace(applied, deferred=deferred, reverted=reverted,
                                                           awaiting=awaiting, verified=verified))
        self.progress("")  # done: an empty line clears the progress display
        return report, status

    def apply_watched_step(self, step: Step) -> StepReport:
        """Journal and write one step `tuned-rl watch` planned for a process that started after the
        apply (the caller holds the lock). Unverified here: it is part of a profile already applied."""
        self._check_writable([step])
        return self._apply_step(WATCHED_STEP_INDEX, step, f"watch: {self._plugin(step)}: {step.title}", None,
                                "applied by watch to a process that started after the apply", by="watch")

    def adopt_inherited(self, child, parent, records: list[StepRecord] | None = None) -> StepRecord | None:
        """Journal the undo of what a process inherited from a parent tuned-rl placed (the caller
        holds the lock). A child forked by an evicted job is born in its cgroup at its policy; its
        parent's undo records say where both would be without tuned-rl, so the child gets the same
        records (``before`` the parent's original, ``after`` the value it holds), and ``rollback``
        puts it back too. Nothing is written to the host. Returns the record journaled (None: nothing
        inherited). ``records``: those naming the parent, where the caller keeps an index (else all
        are read)."""
        inherited, plugin = [], "watch"
        for record in self.journal.records() if records is None else records:
            for change in record.changes:
                if change.kind not in INHERITED_KINDS or change.task is None or change.task.pid != parent.pid \
                        or change.task.start_time != parent.start_time:
                    continue
                before = change.before["cgroup"] if isinstance(change.before, dict) else change.before
                adopted = Change(change.kind, change.target, before, change.after, task=child.task)
                try:
                    if adopted.holds(adopted.read(self.host), adopted.after) and not adopted.holds(before, adopted.after):
                        inherited.append(adopted)
                        plugin = record.plugin
                except (TaskGone, OSError, LookupError):
                    return None
        if not inherited:
            return None
        record = self.journal.add(StepRecord(0, self.host.boot_id(), plugin,
                                             f"inherited by pid {child.pid} from pid {parent.pid}",
                                             WATCHED_STEP_INDEX, inherited, host_root=str(self.host.root), by="watch"))
        self.journal.mark(record, "done")
        return record

    def apply_deferred(self, profile: Profile, table: str, warm_up_s: float) -> StepReport | None:
        """The step of ``table`` that apply deferred until the workload ran, now that it does (the
        caller holds the lock): applied at once, so the workload is placed within moments of its
        start; after ``warm_up_s`` (its start-up is not its steady state) undone and verified by
        the profile's judge as apply would (baseline without, then with), kept or reverted.
        None if the plan has nothing for it now."""
        step = self._deferred_step(profile, table)
        if step is None:
            return None
        first = self._apply_step(WATCHED_STEP_INDEX, step, f"watch: {self._plugin(step)}: {step.title}", None,
                                 "applied when the workload started", by="watch")
        if first.outcome != Outcome.APPLIED:
            return first
        time.sleep(warm_up_s)
        record = next((r for r in reversed(self.journal.records()) if r.by == "watch" and r.step == step.title), None)
        if record is not None:
            self._undo_record(record, force=True)
        step = self._deferred_step(profile, table)
        if step is None:
            return first
        with ExitStack() as stack:
            verifier, unverified = self._start_verifier(stack, profile, True)
            return self._apply_step(WATCHED_STEP_INDEX, step, f"watch: {self._plugin(step)}: {step.title}", verifier,
                                    unverified, by="watch")

    def verify_awaiting(self, profile: Profile, awaiting: list[dict]) -> list[tuple[dict, StepReport | None]]:
        """Verify the steps apply wrote unverified because the workload was not running (or that
        were judged on no samples), now that it runs (the caller holds the lock). Each, in apply
        order: its record undone, the step planned again and applied under the profile's judge
        (baseline without, then with), kept or reverted as apply would. A step whose values someone
        changed since is left as it is (report "left"); None: the plan has nothing for it now."""
        results: list[tuple[dict, StepReport | None]] = []
        with ExitStack() as stack:
            verifier, unverified = self._start_verifier(stack, profile, True)
            for entry in awaiting:
                record = next((r for r in reversed(self.journal.records())
                               if r.step == entry["step"] and r.plugin == self.plugins.owners.get(entry["table"],
                                                                                                  entry["table"])),
                              None)
                if record is not None:
                    changed = self._changed_since(record)
                    if changed:
                        results.append((entry, StepReport(record.plugin, record.step, [], "left",
                                                          f"someone changed {changed[0]} since the apply: left as "
                                                          "it is, unverified")))
                        continue
                    self._undo_record(record, force=True)
                step = next((s for s in self.plugins.plan(profile, self.host) if s.table == entry["table"]
                             and s.title == entry["step"] and not s.skip_reason and s.pending_changes), None)
                if step is None:
                    results.append((entry, None))
                    continue
                self._check_writable([step])
                if verifier is not None:
                    verifier.baseline = None  # the host changed (undone) since any baseline it holds
                index = record.step_index if record is not None else WATCHED_STEP_INDEX
                results.append((entry, self._apply_step(index, step, f"watch: {self._plugin(step)}: {step.title}",
                                                        verifier, unverified, by="watch")))
        return results

    def _changed_since(self, record: StepRecord) -> list[str]:
        """The changes of ``record`` that no longer read as tuned-rl wrote them (a task gone is not one)."""
        changed = []
        for change in record.changes:
            try:
                if not change.holds(change.read(self.host), change.after):
                    changed.append(change.label())
            except (TaskGone, ProcessLookupError):
                continue
            except (OSError, LookupError):
                changed.append(change.label())
        return changed

    def _workload_absent(self, profile: Profile) -> bool:
        """Whether the profile's [target] names a workload (not a canary) that has no process now."""
        table = profile.get("target")
        if not table or table.get("canary"):
            return False
        try:
            return not target_processes(self.host, table)
        except TargetError:
            return False  # the verifier says what is wrong with it

    def _deferred_step(self, profile: Profile, table: str) -> Step | None:
        steps = [s for s in self.plugins.plan(profile, self.host)
                 if s.table == table and not s.skip_reason and s.pending_changes]
        if steps:
            self._check_writable(steps[:1])
        return steps[0] if steps else None

    def _start_verifier(self, stack: ExitStack, profile: Profile, verify: bool,
                        max_blocks: int | None = None) -> tuple[Verifier | None, str]:
        """A started Verifier, or None and the reason steps go unverified."""
        if not verify:
            return None, "applied with --no-verify"
        if profile.get("target") is None:
            return None, "not verified: the profile names no [target]"
        target, canary = target_from_table(profile.get("target"))
        settings = VerifySettings.from_table(profile.get("verify"))
        if max_blocks is not None:
            settings = dataclasses.replace(settings, max_blocks=max_blocks)
        verifier = Verifier(self.host, target, canary, settings, self.progress)
        try:
            return stack.enter_context(verifier), ""
        except (ProbeError, TargetError, OSError, RuntimeError) as err:
            return None, f"not verified: cannot measure {target}: {_describe_error(err)}"

    def rollback(self, force: bool = False) -> tuple[RollbackReport, int]:
        """Undo every journaled change, newest first; idempotent. Returns report and exit status.

        A value someone changed since tuned-rl applied it is left as they set it (and
        reported), unless ``force``. Records that cannot be trusted are never replayed:
        they are reported and moved to ``<state-dir>/refused``, and the exit status is 1.
        """
        with exclusive_lock(self.journal.state_dir):
            scan, applied = self.journal.scan(), self.journal.applied()
            self._check_root(applied, scan.records)
            report = RollbackReport(applied.profile if applied else None,
                                    removed=remove_leftover_instances(self.host))
            if self._is_stale(applied, scan):
                report.stale = self._carry_over(applied, scan)
                scan, applied = self.journal.scan(), self.journal.applied()
            trusted, refused = self._trusted(scan)
            if refused:
                report.refused = [{"path": str(path), "reason": reason} for path, reason in refused]
                report.refused_kept_in = str(self.journal.move_refused([path for path, _ in refused]))
            report.changes = self._undo(trusted, force)
            self.journal.finish()
            return report, 1 if report.failed else 0

    def status(self) -> StatusReport:
        """What the journal says is applied, and whether each value still holds."""
        scan, applied = self.journal.scan(), self.journal.applied()
        self._check_root(applied, scan.records)
        report = StatusReport(applied.profile if applied else None, removed=remove_leftover_instances(self.host),
                              stale=self._is_stale(applied, scan))
        trusted, refused = self._trusted(scan)
        for record in trusted:
            report.changes += [self._change_status(record, change, report.stale and not
                                                   change.handler.survives_reboot(change))
                               for change in record.changes]
        report.changes += [ChangeStatus(None, None, str(path), None, None, None, State.REFUSED, reason)
                           for path, reason in refused]
        if applied is not None:
            report.path, report.digest, report.applied_at = applied.path, applied.digest, applied.started
            report.deferred, report.deferred_results = applied.deferred, applied.deferred_results
            report.awaiting, report.verified = applied.awaiting, applied.verified
            report.verified_p999_us = applied.verified_p999_us()  # what watch compares with
        if applied is not None:
            failures = self.journal.watch_note().get("plugin_failures")
            report.watch_plugin_failures = failures if isinstance(failures, dict) else {}
        report.watched = [{"plugin": r.plugin, "step": r.step, "at": r.written_at, "changes": len(r.changes),
                           "pids": sorted({c.task.pid for c in r.changes if c.task is not None})}
                          for r in trusted if r.by == "watch"]
        return report

    # -- one step -------------------------------------------------------------

    def _apply_step(self, index: int, step: Step, label: str, verifier: Verifier | None,
                    unverified: str, by: str = "apply") -> StepReport:
        if step.skip_reason:
            return self._step_report(step, Outcome.SKIPPED, step.skip_reason)
        if not step.pending_changes:
            return self._step_report(step, Outcome.UNCHANGED, "already set")
        originals, gone = self._originals(step.pending_changes)
        if not originals:
            if gone:
                return self._step_report(step, Outcome.SKIPPED, "every task it would change has exited", [], _tasks(gone))
            return self._step_report(step, Outcome.UNCHANGED, "already set")
        record = self.journal.add(StepRecord(0, self.host.boot_id(), self._plugin(step), step.title, index, originals,
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
            self._undo_record(record, force=True)  # the verifier reverted it: the record goes, the host checked
            raise
        except (OSError, StepFailed, LookupError) as err:
            left = [r for r in self._undo_record(record, force=True) if r.outcome == Restore.FAILED]
            undone = "step reverted" if not left else (f"reverting it failed too: {left[0].target}: "
                                                       f"{left[0].reason} (`tuned-rl rollback` retries)")
            return self._step_report(step, Outcome.FAILED, f"{_describe_error(err)}; {undone}", None, _tasks(gone))
        except ProbeError as err:  # the verifier left the step applied; only its measurement failed
            result, unverified = None, f"not verified: {err}; the step is applied"
        changes = [c for c in record.changes if c.identity() not in gone_ids]
        step = dataclasses.replace(step, notes=step.notes + [f"left as it is: {r}" for r in dict.fromkeys(refused)])
        if result is not None and not result.keep:
            # The verifier's revert wrote every value back and ran the follow-ups once: this only
            # checks, rewrites what does not read back, and drops the record.
            self._undo_record(record, force=True, follow_up_unchanged=False)
            return self._verified_report(step, result, changes, _tasks(gone))
        if len(changes) < len(record.changes):
            # Refused (a managed IRQ) or gone: never written, so nothing to undo or to show in status.
            if changes:
                self.journal.replace(record, changes)
            else:
                self.journal.remove(record)
                return self._step_report(step, Outcome.UNCHANGED, "nothing could be changed", [], _tasks(gone))
        self.journal.mark(record, "done")
        if result is None:
            report = self._step_report(step, Outcome.APPLIED, unverified or NOT_VERIFIED, changes, _tasks(gone))
        else:
            report = self._verified_report(step, result, changes, _tasks(gone))
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
        report = self._step_report(step, result.outcome, reason, changes, gone)
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
                raise StepFailed(f"follow-up {action} failed: {_describe_error(err)}") from err

    # -- undo -----------------------------------------------------------------

    def _undo(self, records: list[StepRecord], force: bool) -> list[RestoredChange]:
        """Restore every record, newest first; each record is dropped once all of it is restored.
        Then the children that inherited a restored value and that no record names (_settle_inherited)."""
        results = [result for record in reversed(records) for result in self._undo_record(record, force)]
        return results + self._settle_inherited(records)

    def _settle_inherited(self, records: list[StepRecord]) -> list[RestoredChange]:
        """A process forked while tuned-rl held its parent at another policy, nice or I/O class
        inherits them, and so does a thread started then by one of its threads; unless `tuned-rl
        watch` journaled it (or a cgroup's removal covered it) no record names it. A fork in flight
        while rollback restores the parent copies the old values too, and ends once the parent runs
        again. So after SETTLE_S, each heir of a restored task, born after the task's record was
        written, that holds every value tuned-rl had set on the task (SCHED_OTHER alone is anyone's
        default; with nice -20 it is tuned-rl's), and not the originals, is given the originals: the
        children of a restored process, and the other threads of a restored thread's process where
        every restored thread of it had the same originals (/proc does not say which started it)."""
        held: list[tuple[StepRecord, list[Change]]] = []  # each record's inherited changes, by task
        for record in records:
            by_task: dict = {}
            for change in record.changes:
                if change.kind in INHERITED_POLICY_KINDS and change.task is not None:
                    by_task.setdefault(change.task, []).append(change)
            held += [(record, changes) for changes in by_task.values()]
        if not held:
            return []
        time.sleep(SETTLE_S)
        restored, originals = [], {}
        for record, changes in held:
            try:
                tgid = self.host.process(changes[0].task.pid).tgid
                if not all(c.holds(c.read(self.host), c.before) for c in changes):
                    continue  # a task not restored (left, gone)
            except (TaskGone, ProcessLookupError, LookupError, OSError):
                continue
            restored.append((record, changes, tgid))
            originals.setdefault(tgid, set()).add(tuple((c.kind, c.handler.show(c.before)) for c in changes))
        results = []
        for record, changes, tgid in restored:
            pid = changes[0].task.pid
            heirs = [(child, f"forked by pid {pid}") for child in self.host.children(tgid)] if tgid == pid else []
            if len(originals[tgid]) == 1:
                heirs += [(tid, f"a thread started in pid {tgid}") for tid in sorted(self.host.thread_ids(tgid))
                          if tid != pid]
            for heir, how in heirs:
                results += self._give_the_originals(record, changes, heir, how)
        return results

    def _give_the_originals(self, record: StepRecord, changes: list[Change], pid: int, how: str
                            ) -> list[RestoredChange]:
        """The originals of ``changes`` for task ``pid``, if it was born after ``record`` was written
        and holds every value tuned-rl set and not every original."""
        try:
            task = self.host.task(pid)
            if record.written_at is None or self.host.started_at(task) < record.written_at:
                return []  # born before tuned-rl set the values: what it holds is its own
            heirs = [dataclasses.replace(c, task=task) for c in changes]
            current = [h.read(self.host) for h in heirs]
            if not all(h.holds(value, h.after) for h, value in zip(heirs, current)) \
                    or all(h.holds(value, h.before) for h, value in zip(heirs, current)):
                return []
            results = []
            for heir, value in zip(heirs, current):
                if not heir.holds(value, heir.before):
                    heir.write(self.host, heir.before)
                    show = heir.handler.show
                    results.append(RestoredChange(
                        record.plugin, record.step, heir.label(), show(value), show(heir.before), Restore.RESTORED,
                        f"{how} while tuned-rl held it at {show(heir.after)}: given the original"))
            return results
        except (TaskGone, ProcessLookupError, LookupError, OSError):
            return []

    def _undo_record(self, record: StepRecord, force: bool, follow_up_unchanged: bool = True) -> list[RestoredChange]:
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
            result.outcome, result.reason = Restore.FAILED, _describe_error(err)
        return result

    # -- helpers --------------------------------------------------------------

    def _clear_previous(self) -> list[str]:
        scan, applied = self.journal.scan(), self.journal.applied()
        if applied is None and not scan.records and not scan.unreadable:
            return []
        self._check_root(applied, scan.records)
        notes = []
        if self._is_stale(applied, scan):
            stale = self._carry_over(applied, scan)
            notes.append(f"a journal from an earlier boot: {stale['set_aside']} run-time change(s) were not replayed "
                         f"(the reboot reset them), {stale['carried']} change(s) to files that survive a reboot are "
                         f"rolled back now; the journal as it was is kept in {stale['kept_in']}")
            scan, applied = self.journal.scan(), self.journal.applied()
            if not scan.records:
                self.journal.finish()
                return notes
        trusted, refused = self._trusted(scan)
        if refused:
            path, reason = refused[0]
            raise HostError(f"the journal holds {len(refused)} record(s) tuned-rl will not replay ({reason}); "
                            f"nothing was changed: `tuned-rl rollback` restores the rest and moves these to "
                            f"{self.journal.state_dir}/refused, then apply again")
        name = applied.profile if applied else "an unfinished apply"
        results = self._undo(trusted, force=False)
        failed = [r for r in results if r.outcome == Restore.FAILED]
        if failed:
            raise HostError(f"could not roll back {name}: {failed[0].target}: {failed[0].reason}")
        self.journal.finish()
        restored = sum(r.outcome == Restore.RESTORED for r in results)
        notes += [f"rolled back previously applied profile {name} first ({restored} of {len(results)} changes "
                 "restored; the others already held their original values, or their tasks had exited)"]
        return notes + [f"left {r.target} as someone set it: {r.reason}" for r in results
                        if r.outcome == Restore.LEFT]

    def _check_root(self, applied: Applied | None, records: list[StepRecord]) -> None:
        """Refuse a journal written against another host root (a test tree's, or the real one's)."""
        roots = {r.host_root for r in records} | ({applied.host_root} if applied else set())
        other = sorted(roots - {str(self.host.root), None})
        if other:
            raise HostError(f"the journal in {self.journal.state_dir} was written against host root {other[0]}, "
                            f"not {self.host.root}: it is not replayed here (run with TUNED_RL_HOST_ROOT={other[0]},"
                            " or use another --state-dir)")

    def _trusted(self, scan: Scan) -> tuple[list[StepRecord], list[tuple[Path, str]]]:
        """The records rollback may replay, and (path, why) of the files it must not."""
        mounts = [m.mount_point for m in self.host.cgroup_mounts()]
        trusted, refused = [], [(u.path, u.reason) for u in scan.unreadable]
        for record in scan.records:
            why = next((f"{record.path}: {reason}" for change in record.changes for path in change.handler.paths(change)
                        if (reason := refusal(path, mounts))), None)
            if why:
                refused.append((record.path, why))
            else:
                trusted.append(record)
        return trusted, refused

    def _is_stale(self, applied: Applied | None, scan: Scan) -> bool:
        """The journal was written in an earlier boot: a reboot already reset what it holds."""
        boots = {r.boot_id for r in scan.records} | ({applied.boot_id} if applied else set())
        return bool(boots) and boots != {self.host.boot_id()}

    def _carry_over(self, applied: Applied | None, scan: Scan) -> dict:
        """After a reboot: copy the journal aside, then keep in it only the records of changes that
        survive a reboot (files in /etc), re-dated to this boot; the rest a reboot already reset.

        Each record is rewritten whole or removed, so a crash part-way leaves records of either
        boot, and the next run carries over what is left: nothing of the admin's is ever lost.
        Files that are not records tuned-rl could have written are dropped (the copy keeps them)."""
        boot = self.host.boot_id()
        kept_in = self.journal.copy_aside()
        carried = set_aside = 0
        boot_ids = sorted({r.boot_id for r in scan.records} | ({applied.boot_id} if applied else set()))
        if applied is not None and applied.boot_id != boot:
            self.journal.begin(dataclasses.replace(applied, boot_id=boot))
        for record in scan.records:
            lasting = [c for c in record.changes if c.handler.survives_reboot(c)]
            set_aside += len(record.changes) - len(lasting)
            carried += len(lasting)
            if lasting:
                record.boot_id = boot
                self.journal.replace(record, lasting)
            else:
                self.journal.remove(record)
        for unreadable in scan.unreadable:
            unreadable.path.unlink(missing_ok=True)
        return {"records": carried + set_aside, "set_aside": set_aside, "carried": carried, "boot_ids": boot_ids,
                "kept_in": str(kept_in)}

    def _change_status(self, record: StepRecord, change: Change, stale: bool) -> ChangeStatus:
        show = change.handler.show
        row = ChangeStatus(record.plugin, record.step, change.label(), show(change.before), show(change.after), None)
        if stale:
            return dataclasses.replace(row, state=State.STALE)
        try:
            current = change.read(self.host)
        except TaskGone:
            return dataclasses.replace(row, state=State.GONE)
        except (OSError, LookupError) as err:
            return dataclasses.replace(row, state=State.UNREADABLE, reason=_describe_error(err))
        row.current = show(current)
        if record.state != "done":
            return dataclasses.replace(row, state=State.INTERRUPTED)
        return dataclasses.replace(row, state=State.HOLDS if change.holds(current, change.after) else State.DRIFTED)

    def _check_writable(self, steps: list[Step]) -> None:
        mounts = [m.mount_point for m in self.host.cgroup_mounts()]
        for step in steps:
            for change in step.pending_changes:
                for path in change.handler.paths(change):
                    if reason := refusal(path, mounts):
                        raise HostError(f"plugin {self._plugin(step)} plans a write that tuned-rl refuses: {reason}; "
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

    def _plugin(self, step: Step) -> str:
        return self.plugins.owners.get(step.table, step.table)

    def _step_report(self, step: Step, outcome: Outcome, reason: str, changes: list[Change] | None = None,
                     gone: int = 0) -> StepReport:
        shown = changes if changes is not None else (step.pending_changes or step.changes)
        return StepReport(self._plugin(step), step.title,
                          [ChangeReport(c.label(), c.handler.show(c.before),
                                        c.handler.show(self._read_back.get(c.identity(), c.after))
                                        if outcome in (Outcome.APPLIED, Outcome.KEPT, Outcome.INCONCLUSIVE) else c.handler.show(c.after))
                           for c in shown],
                          outcome, reason, phase=self.plugins.phase_of(step.table), gone=gone, notes=list(step.notes))


def _verdict(step: Step, report: StepReport) -> dict:
    """A verified step's outcome and figures, as the journal keeps them (watch compares its tail with them)."""
    return {"table": step.table, "step": step.title, "outcome": report.outcome, "at": round(time.time(), 3),
            "p999_without_us": report.before["p999_us"], "p999_with_us": report.after["p999_us"],
            "samples_without": report.before["n"], "samples_with": report.after["n"]}


def _verified_on_nothing(report: StepReport) -> bool:
    """A step applied unverified because the workload was not running, or judged on no samples."""
    if report.outcome == Outcome.APPLIED and report.reason == AWAITING_WORKLOAD:
        return True
    return report.outcome == Outcome.INCONCLUSIVE and report.before is not None and (
        not report.before.get("n") or not (report.after or {}).get("n"))


WATCHED_STEP_INDEX = 1_000_000  # a record `tuned-rl watch` wrote: no step of the profile's plan

# What a child process takes from its parent at fork: its cgroups, policy, nice and I/O class.
INHERITED_KINDS = ("process_cgroup", "sched", "nice", "io_priority")
INHERITED_POLICY_KINDS = ("sched", "nice", "io_priority")  # what a child copies at fork and no cgroup removal resets
SETTLE_S = 0.1  # after a rollback, how long a fork in flight may take to end (its parent runs again at once)


def _tasks(changes: list[Change]) -> int:
    """How many distinct tasks ``changes`` are about."""
    return len({(c.task.pid, c.task.start_time) for c in changes if c.task is not None})


def _with_originals(step: Step, records: list[StepRecord]) -> Step:
    """``step`` with each change's ``before`` replaced by the original the journal holds for it."""
    originals: dict[tuple, object] = {}
    for change in (c for r in records for c in r.changes):
        originals.setdefault(change.identity(), change.before)
    if not originals:
        return step
    changes = [dataclasses.replace(c, before=originals[c.identity()]) if c.identity() in originals else c
               for c in step.changes]
    return dataclasses.replace(step, changes=changes)


def _describe_error(err: Exception) -> str:
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
