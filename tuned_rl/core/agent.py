"""A profile applied step by step under the judge (each step written by the step writer), rolled back, and its status."""

from __future__ import annotations

import dataclasses
import time
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Callable

from tuned_rl.core.change_rows import ChangeStatus
from tuned_rl.core.changes import Step
from tuned_rl.core.journal import Applied, Journal, StepRecord
from tuned_rl.core.journal_review import carry_over, change_status, check_root, is_stale, trusted_records
from tuned_rl.core.lock import exclusive_lock
from tuned_rl.core.outcomes import Outcome, Restore, State
from tuned_rl.core.plugin_host import PluginHost
from tuned_rl.core.report import Report, StepReport
from tuned_rl.core.rollback_report import RollbackReport
from tuned_rl.core.status_report import StatusReport
from tuned_rl.core.step_writer import HostError, StepWriter, describe_error
from tuned_rl.core.undo import undo_records
from tuned_rl.core.noise_memory import NoiseMemory
from tuned_rl.core.verify import Verifier
from tuned_rl.host import Host
from tuned_rl.measure.probes import ProbeError
from tuned_rl.measure.probes.tracefs import remove_leftover_instances
from tuned_rl.measure.settings import VerifySettings
from tuned_rl.measure.targets import TargetError, lookalike_notes, target_from_table, target_processes
from tuned_rl.profiles.loader import Profile

Progress = Callable[[str], None]

AWAITING_WORKLOAD = ("not verified yet: the workload is not running; `tuned-rl watch` verifies it when it starts "
                     "(until then it is applied, unverified)")


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
    writer: StepWriter = dataclasses.field(init=False, repr=False)

    def __post_init__(self):
        self.writer = StepWriter(self.plugins, self.host, self.journal)

    def dry_run(self, profile: Profile) -> Report:
        """The plan, with nothing written anywhere (no lock, no state directory)."""
        report = Report(profile.name, dry_run=True, digest=profile.digest())
        host, records = self.host, []
        scan, applied = self.journal.scan(), self.journal.applied()
        stale = is_stale(self.host, applied, scan)
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
            report.steps.append(self.writer.step_report(step, outcome, step.skip_reason or ""))
        return report

    def apply(self, profile: Profile, verify: bool = True, max_blocks: int | None = None) -> tuple[Report, int]:
        """Roll back what is applied, then apply (and verify) each step; returns the report and exit status.
        ``max_blocks`` replaces the profile's [verify] max_blocks."""
        report = Report(profile.name, dry_run=False, digest=profile.digest())
        with exclusive_lock(self.journal.state_dir), ExitStack() as stack:
            report.notes += self._clear_previous()
            report.notes += lookalike_notes(self.host, profile.get("target"))
            steps = self.plugins.plan(profile, self.host)
            self.writer.check_writable(steps)
            applied = Applied(profile.name, str(profile.path), self.host.boot_id(), time.time(), str(self.host.root),
                              profile.digest())
            self.journal.begin(applied)
            changing = any(s.pending_changes and not s.skip_reason for s in steps)
            verifier, unverified = (None, "")
            if changing and verify and self._workload_absent(profile):
                unverified = AWAITING_WORKLOAD  # measuring nothing would only read "0 samples"
            elif changing:
                verifier, unverified = self.start_verifier(stack, profile, verify, max_blocks)
            report.notes += verifier.notes if verifier else []
            status = 0
            for index, step in enumerate(steps):
                if status:
                    report.steps.append(self.writer.step_report(step, Outcome.SKIPPED,
                                                          "not attempted: an earlier step failed"))
                    continue
                label = f"[{index + 1}/{len(steps)}] {self.writer.plugin_of(step)}: {step.title}"
                self.progress(label)
                step_report = self.writer.apply(index, step, label, verifier, unverified)
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

    def _workload_absent(self, profile: Profile) -> bool:
        """Whether the profile's [target] names a workload (not a canary) that has no process now."""
        table = profile.get("target")
        if not table or table.get("canary"):
            return False
        try:
            return not target_processes(self.host, table)
        except TargetError:
            return False  # the verifier says what is wrong with it

    def start_verifier(self, stack: ExitStack, profile: Profile, verify: bool,
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
        memory = NoiseMemory.for_target(self.journal.state_dir, profile.get("target"), settings.metric,
                                        settings.window_seconds, self.host.boot_id(), settings.noise_memory_hours)
        verifier = Verifier(self.host, target, canary, settings, self.progress, memory)
        try:
            return stack.enter_context(verifier), ""
        except (ProbeError, TargetError, OSError, RuntimeError) as err:
            return None, f"not verified: cannot measure {target}: {describe_error(err)}"

    def rollback(self, force: bool = False) -> tuple[RollbackReport, int]:
        """Undo every journaled change, newest first; idempotent. Returns report and exit status.

        A value someone changed since tuned-rl applied it is left as they set it (and
        reported), unless ``force``. Records that cannot be trusted are never replayed:
        they are reported and moved to ``<state-dir>/refused``, and the exit status is 1.
        """
        with exclusive_lock(self.journal.state_dir):
            scan, applied = self.journal.scan(), self.journal.applied()
            check_root(self.host, self.journal, applied, scan.records)
            report = RollbackReport(applied.profile if applied else None,
                                    removed=remove_leftover_instances(self.host))
            if is_stale(self.host, applied, scan):
                report.stale = carry_over(self.host, self.journal, applied, scan)
                scan, applied = self.journal.scan(), self.journal.applied()
            trusted, refused = trusted_records(self.host, scan)
            if refused:
                report.refused = [{"path": str(path), "reason": reason} for path, reason in refused]
                report.refused_kept_in = str(self.journal.move_refused([path for path, _ in refused]))
            report.changes = undo_records(self.writer, trusted, force)
            self.journal.finish()
            return report, 1 if report.failed else 0

    def status(self) -> StatusReport:
        """What the journal says is applied, and whether each value still holds."""
        scan, applied = self.journal.scan(), self.journal.applied()
        check_root(self.host, self.journal, applied, scan.records)
        report = StatusReport(applied.profile if applied else None, removed=remove_leftover_instances(self.host),
                              stale=is_stale(self.host, applied, scan))
        trusted, refused = trusted_records(self.host, scan)
        for record in trusted:
            report.changes += [change_status(self.host, record, change, report.stale and not
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

    # -- helpers --------------------------------------------------------------

    def _clear_previous(self) -> list[str]:
        scan, applied = self.journal.scan(), self.journal.applied()
        if applied is None and not scan.records and not scan.unreadable:
            return []
        check_root(self.host, self.journal, applied, scan.records)
        notes = []
        if is_stale(self.host, applied, scan):
            stale = carry_over(self.host, self.journal, applied, scan)
            notes.append(f"a journal from an earlier boot: {stale['set_aside']} run-time change(s) were not replayed "
                         f"(the reboot reset them), {stale['carried']} change(s) to files that survive a reboot are "
                         f"rolled back now; the journal as it was is kept in {stale['kept_in']}")
            scan, applied = self.journal.scan(), self.journal.applied()
            if not scan.records:
                self.journal.finish()
                return notes
        trusted, refused = trusted_records(self.host, scan)
        if refused:
            path, reason = refused[0]
            raise HostError(f"the journal holds {len(refused)} record(s) tuned-rl will not replay ({reason}); "
                            f"nothing was changed: `tuned-rl rollback` restores the rest and moves these to "
                            f"{self.journal.state_dir}/refused, then apply again")
        name = applied.profile if applied else "an unfinished apply"
        results = undo_records(self.writer, trusted, force=False)
        failed = [r for r in results if r.outcome == Restore.FAILED]
        if failed:
            raise HostError(f"could not roll back {name}: {failed[0].target}: {failed[0].reason}")
        self.journal.finish()
        restored = sum(r.outcome == Restore.RESTORED for r in results)
        notes += [f"rolled back previously applied profile {name} first ({restored} of {len(results)} changes "
                 "restored; the others already held their original values, or their tasks had exited)"]
        return notes + [f"left {r.target} as someone set it: {r.reason}" for r in results
                        if r.outcome == Restore.LEFT]


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
