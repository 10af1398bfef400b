"""The steps watch writes for processes that start after the apply: a late process's own step, the
undo of what a child inherited from a parent tuned-rl placed, the steps apply deferred until the
workload ran, and those it wrote unverified because the workload was not running yet. The caller
(the watcher) holds the state directory's lock for each."""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass

from tuned_rl.core.agent import Agent
from tuned_rl.core.changes import Change, Step
from tuned_rl.core.journal import StepRecord
from tuned_rl.core.kinds import inherited_at_fork
from tuned_rl.core.outcomes import Outcome
from tuned_rl.core.report import StepReport
from tuned_rl.core.step_writer import WATCHED_STEP_INDEX
from tuned_rl.host import TaskGone
from tuned_rl.profiles.loader import Profile


@dataclass
class LateSteps:
    """Writes watch's steps through ``agent``'s step writer and verifier."""

    agent: Agent

    @property
    def writer(self):
        return self.agent.writer

    def apply(self, step: Step) -> StepReport:
        """Journal and write one step `tuned-rl watch` planned for a process that started after the
        apply (the caller holds the lock). Unverified here: it is part of a profile already applied."""
        self.writer.check_writable([step])
        return self.writer.apply(WATCHED_STEP_INDEX, step, f"watch: {self.writer.plugin_of(step)}: {step.title}", None,
                                "applied by watch to a process that started after the apply", by="watch")

    def adopt(self, child, parent, records: list[StepRecord] | None = None) -> StepRecord | None:
        """Journal the undo of what a process inherited from a parent tuned-rl placed (the caller
        holds the lock). A child forked by an evicted job is born in its cgroup at its policy; its
        parent's undo records say where both would be without tuned-rl, so the child gets the same
        records (``before`` the parent's original, ``after`` the value it holds), and ``rollback``
        puts it back too. Nothing is written to the host. Returns the record journaled (None: nothing
        inherited). ``records``: those naming the parent, where the caller keeps an index (else all
        are read)."""
        inherited, plugin = [], "watch"
        for record in self.agent.journal.records() if records is None else records:
            for change in record.changes:
                if not inherited_at_fork(change) or change.task.pid != parent.pid \
                        or change.task.start_time != parent.start_time:
                    continue
                before = change.before["cgroup"] if isinstance(change.before, dict) else change.before
                adopted = Change(change.kind, change.target, before, change.after, task=child.task)
                try:
                    if adopted.holds(adopted.read(self.agent.host), adopted.after) and not adopted.holds(before, adopted.after):
                        inherited.append(adopted)
                        plugin = record.plugin
                except (TaskGone, OSError, LookupError):
                    return None
        if not inherited:
            return None
        record = self.agent.journal.add(StepRecord(0, self.agent.host.boot_id(), plugin,
                                             f"inherited by pid {child.pid} from pid {parent.pid}",
                                             WATCHED_STEP_INDEX, inherited, host_root=str(self.agent.host.root), by="watch"))
        self.agent.journal.mark(record, "done")
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
        first = self.writer.apply(WATCHED_STEP_INDEX, step, f"watch: {self.writer.plugin_of(step)}: {step.title}", None,
                                 "applied when the workload started", by="watch")
        if first.outcome != Outcome.APPLIED:
            return first
        time.sleep(warm_up_s)
        record = next((r for r in reversed(self.agent.journal.records()) if r.by == "watch" and r.step == step.title), None)
        if record is not None:
            self.writer.undo_record(record, force=True)
        step = self._deferred_step(profile, table)
        if step is None:
            return first
        with ExitStack() as stack:
            verifier, unverified = self.agent.start_verifier(stack, profile, True)
            return self.writer.apply(WATCHED_STEP_INDEX, step, f"watch: {self.writer.plugin_of(step)}: {step.title}", verifier,
                                    unverified, by="watch")

    def verify_awaiting(self, profile: Profile, awaiting: list[dict]) -> list[tuple[dict, StepReport | None]]:
        """Verify the steps apply wrote unverified because the workload was not running (or that
        were judged on no samples), now that it runs (the caller holds the lock). Each, in apply
        order: its record undone, the step planned again and applied under the profile's judge
        (baseline without, then with), kept or reverted as apply would. A step whose values someone
        changed since is left as it is (report "left"); None: the plan has nothing for it now."""
        results: list[tuple[dict, StepReport | None]] = []
        with ExitStack() as stack:
            verifier, unverified = self.agent.start_verifier(stack, profile, True)
            for entry in awaiting:
                record = next((r for r in reversed(self.agent.journal.records())
                               if r.step == entry["step"] and r.plugin == self.agent.plugins.owners.get(entry["table"],
                                                                                                  entry["table"])),
                              None)
                if record is not None:
                    changed = self._changed_since(record)
                    if changed:
                        results.append((entry, StepReport(record.plugin, record.step, [], "left",
                                                          f"someone changed {changed[0]} since the apply: left as "
                                                          "it is, unverified")))
                        continue
                    self.writer.undo_record(record, force=True)
                step = next((s for s in self.agent.plugins.plan(profile, self.agent.host) if s.table == entry["table"]
                             and s.title == entry["step"] and not s.skip_reason and s.pending_changes), None)
                if step is None:
                    results.append((entry, None))
                    continue
                self.writer.check_writable([step])
                if verifier is not None:
                    verifier.baseline = None  # the host changed (undone) since any baseline it holds
                index = record.step_index if record is not None else WATCHED_STEP_INDEX
                results.append((entry, self.writer.apply(index, step, f"watch: {self.writer.plugin_of(step)}: {step.title}",
                                                        verifier, unverified, by="watch")))
        return results

    def _changed_since(self, record: StepRecord) -> list[str]:
        """The changes of ``record`` that no longer read as tuned-rl wrote them (a task gone is not one)."""
        changed = []
        for change in record.changes:
            try:
                if not change.holds(change.read(self.agent.host), change.after):
                    changed.append(change.label())
            except (TaskGone, ProcessLookupError):
                continue
            except (OSError, LookupError):
                changed.append(change.label())
        return changed

    def _deferred_step(self, profile: Profile, table: str) -> Step | None:
        steps = [s for s in self.agent.plugins.plan(profile, self.agent.host)
                 if s.table == table and not s.skip_reason and s.pending_changes]
        if steps:
            self.writer.check_writable(steps[:1])
        return steps[0] if steps else None
