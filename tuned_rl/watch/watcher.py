"""The watch loop: each process that starts (or renames itself, or changes user) after the apply is
planned by the plugins' ``tuned_rl_plan_process`` and its changes journaled and written as
``apply`` writes them; /proc is rescanned after lost events and every ``rescan_seconds``.

watch takes the state directory's lock only while it writes (a few milliseconds), so ``status``,
``apply`` and ``rollback`` run beside it. After a ``rollback`` (nothing applied) it stops; after
another ``apply`` it reloads the profile that apply recorded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from dataclasses import dataclass
from typing import Callable

from tuned_rl.core.agent import Agent
from tuned_rl.core.kinds import heirs_keep_it_after_undo
from tuned_rl.core.journal import Applied
from tuned_rl.core.lock import LockHeld, exclusive_lock
from tuned_rl.core.outcomes import Outcome
from tuned_rl.core.step_writer import HostError
from tuned_rl.core.verify import Stopped
from tuned_rl.host import TaskGone, printable
from tuned_rl.measure.probes.base import ProbeError
from tuned_rl.measure.targets import TargetError, is_target_process, target_from_table
from tuned_rl.profiles.loader import Profile, ProfileError, load_profile
from tuned_rl.watch.events import WatchEvent, step_event
from tuned_rl.watch.late_steps import LateSteps

KINDS_THAT_MATTER = ("fork", "exec", "comm", "uid")
# A workload process is planned again this long after it was first acted on: its start-up may
# create the threads a pin names, or turn some real-time, and neither gives a process event.
FOLLOW_UP_SECONDS = (1.0, 5.0)
# Periodic rescans are spaced so that they cost at most this share of one CPU (0.2%): on a node of 8,000
# processes a rescan reads 32,000 /proc files, and watch's idle cost must stay small.
RESCAN_CPU_BUDGET = 0.002
# Rescans that answer lost events (the kernel dropped some: another user's fork storm) come at most
# once a second, or less often where one costs more than 2% of a CPU over that time.
LOST_RESCAN_MIN_S = 1.0
COMPACT_EVERY_S = 30.0  # the journal's records of exited tasks are dropped at a rescan at most this often
MAX_EVENTS_PER_S = 2000  # process events read a second at most (~1.5% of a CPU); a node's own starts make ~150
LOST_RESCAN_CPU_BUDGET = 0.02
PLUGIN_NOTE_INTERVAL_S = 60.0
FAILURES_REMEMBERED = 4096  # (pid, plugin, error kind) already said: a bounded set
TELEMETRY_PASS_S = 0.5  # with the target measured, a pass at least this often: an alarm within a second
# A process that renames itself is planned again for a rename at most this often (its first rename at
# once): a user's prctl(PR_SET_NAME) loop made one plan per pass, watch's whole CPU. A new process, an
# exec or another user is planned at once.
RENAME_REPLAN_S = 0.5
PLANNED_AT_BOUND = 4096  # planned_at entries before those older than RENAME_REPLAN_S are dropped


class NothingApplied(RuntimeError):
    """The journal names no applied profile: there is nothing to keep in force."""


@dataclass
class WatchStats:
    events: int = 0
    forks_skipped: int = 0  # forks by a process that needs nothing: its copies, not planned
    lost: int = 0
    rescans: int = 0
    acted: int = 0
    placed: int = 0   # processes placed (each process a step named), and evicted
    evicted: int = 0
    failed: int = 0  # errors on one process (each said once in a `failed` event)
    plugin_failures: dict = dataclasses.field(default_factory=dict)  # plugin -> times its plan_process raised


class Watcher:
    """Keeps the applied profile in force; ``emit(event: dict)`` reports each thing it does."""

    def __init__(self, agent: Agent, emit: Callable[[dict], None], rescan_seconds: float = 30.0,
                 load: Callable[[str], Profile] = load_profile, warm_up_seconds: float = 2.0,
                 telemetry_for: Callable[[Profile, Applied], object] | None = None):
        self.agent = agent
        self.late = LateSteps(agent)  # the steps this watch writes, through the agent's step writer
        # The always-on measurement of the profile's target: ``telemetry_for(profile, applied)`` gives a
        # telemetry.Telemetry, or why there is none (text); None: not asked for.
        self.telemetry_for = telemetry_for
        self.telemetry = None
        self.telemetry_due = False
        self.emit = emit
        self.rescan_seconds = rescan_seconds
        self.warm_up_seconds = warm_up_seconds
        self.load = load
        self.stats = WatchStats()
        self.applied: Applied | None = None
        self.profile: Profile | None = None
        self.pending: dict[int, int] = {}  # pid -> event timestamp (ns, CLOCK_MONOTONIC), not yet acted on
        self.forked_by: dict[int, int] = {}  # pid -> the process that forked it (from fork events)
        # Processes with a policy, nice or I/O class journaled: a child inherits these, and no cgroup's
        # removal puts them back, so its undo is journaled too. (A child born into a cgroup tuned-rl
        # made needs none for that: the cgroup's removal moves it to where its parent is by then.)
        self.policy_parents: set[int] = set()
        self.backed_off: set[int] = set()  # processes someone moved back after watch placed them
        self.follow_ups: dict[int, list[float]] = {}  # workload pid -> when (time.monotonic) to plan it again
        self.followed: dict[int, int] = {}  # workload pid -> its start time, once its follow-ups were set
        self.unchanged: dict[int, bytes] = {}  # pid -> its signature when it was last found to need nothing
        self.renamed: set[int] = set()  # pending pids whose only events since their last plan are renames
        self.planned_at: dict[int, float] = {}  # pid -> when (monotonic) a rename of it was last planned
        self.journaled_ids: set[tuple] = set()  # the identity of every change journaled (Change.identity)
        self.records_of: dict[tuple, list] = {}  # (pid, start time) -> the records naming that task
        self.failures_said: set[tuple] = set()  # (pid, plugin, error kind) said in a `failed` event
        self.plugin_notes: dict[str, dict] = {}  # plugin -> its failures on processes, for `status`
        self._noted_at = 0.0
        self.next_rescan_in = rescan_seconds
        self.next_lost_rescan_in = LOST_RESCAN_MIN_S
        self.next_compaction = 0.0  # (monotonic) the journal is compacted at the first rescan from then
        self.stop_requested: Callable[[], bool] = lambda: False  # run() sets its ``stopping``

    # -- the profile ------------------------------------------------------------

    def load_applied(self) -> bool:
        """(Re)load the applied profile if the journal names another; False if nothing is applied."""
        applied = self.agent.journal.applied()
        if applied is None:
            return False
        if self.applied is None or (applied.started, applied.digest) != (self.applied.started, self.applied.digest):
            try:
                profile = self.load(applied.path)
            except (ProfileError, OSError) as err:
                raise NothingApplied(f"the applied profile {applied.path} cannot be read now: {err}") from err
            if applied.digest and profile.digest() != applied.digest:
                raise NothingApplied(f"{applied.path} changed since it was applied: apply it again, then watch")
            problems = self.agent.plugins.validate(profile, self.agent.host)
            if problems:
                raise NothingApplied(f"{applied.path} no longer validates: {problems[0]}")
            self.applied, self.profile = applied, profile
            self.unchanged.clear()  # another profile: every process is judged afresh
            if self.plugin_notes or self.agent.journal.watch_note():  # this watch's failures, of this profile
                self.plugin_notes.clear()
                with contextlib.suppress(OSError):
                    self.agent.journal.note_watch({"pid": os.getpid(), "plugin_failures": {}})
            self._index(self.agent.journal.records())
            self.emit({"event": WatchEvent.WATCHING, "profile": profile.name, "path": applied.path})
            # Started by the loop, outside the lock this may be called under: loading the probes
            # compiles them (about 2 s), and an apply or rollback must not wait for that.
            self.telemetry_due = True
        return True

    def refresh_telemetry(self) -> None:
        """(Re)start the measurement of the target for the profile last loaded, and say what it measures."""
        if not self.telemetry_due:
            return
        self.telemetry_due = False
        self.stop_telemetry()
        if self.telemetry_for is None:
            return
        made = self.telemetry_for(self.profile, self.applied)
        telemetry, why = (None, made) if isinstance(made, str) else (made, "")
        if telemetry is not None:
            try:
                telemetry.start()
            except (ProbeError, TargetError, OSError) as err:
                telemetry.stop()
                telemetry, why = None, f"the probe cannot run: {err}"
        self.telemetry = telemetry
        if telemetry is None:
            self.emit({"event": WatchEvent.MEASURING, "target": None, "reason": f"not measuring: {why}"})
            return
        verified = telemetry.regression.verified_p999_us if telemetry.regression else None
        notes = telemetry.notes + ([] if verified else ["no regressed check: no step of this profile was verified on a "
                                                        "measurement"])
        self.emit({"event": WatchEvent.MEASURING, "target": str(telemetry.target), "threads": len(telemetry.tids),
                   "alarm_ms": telemetry.settings.alarm_ms, "verified_p999_us": verified,
                   "regressed_if_p999_over_us": round(telemetry.regression.limit_us, 1) if verified else None,
                   "window_s": telemetry.settings.window_s, "notes": notes})

    def stop_telemetry(self) -> None:
        if self.telemetry is not None:
            self.telemetry.stop()
            self.telemetry = None

    def tick_telemetry(self) -> None:
        """One pass of the measurement. A failure of it (a map the kernel would not read) ends the
        measuring, never watch: keeping the profile in force for late processes comes first."""
        if self.telemetry is None:
            return
        try:
            self.telemetry.tick()
        except Exception as err:  # noqa: BLE001 - BCC raises bare Exception; any failure here is the probe's
            self.stop_telemetry()
            self.emit({"event": WatchEvent.MEASURING, "target": None, "reason": f"stopped measuring: {err}"})

    # -- one pass ---------------------------------------------------------------

    def note_events(self, events) -> None:
        for event in events:
            self.stats.events += 1
            if event.kind not in KINDS_THAT_MATTER:
                continue
            if event.kind != "comm":
                self.renamed.discard(event.tgid)  # a new process or program, another user: planned at once
            elif event.tgid not in self.pending:
                self.renamed.add(event.tgid)
            if event.pid == event.tgid:
                if event.kind == "fork" and self._a_copy_of_one_that_needs_nothing(event.parent_tgid):
                    self.stats.forks_skipped += 1
                    continue
                self.pending.setdefault(event.tgid, event.timestamp_ns)
                if event.kind == "fork":
                    self.forked_by[event.tgid] = event.parent_tgid
            elif event.kind == "comm":  # a thread named itself: a pin may name it (a new thread inherits the rest)
                self.pending.setdefault(event.tgid, event.timestamp_ns)
        now = time.monotonic()
        for pid, due in list(self.follow_ups.items()):
            if due and due[0] <= now:
                self.pending.setdefault(pid, time.monotonic_ns())
                due.pop(0)
            if not due:
                del self.follow_ups[pid]

    def _a_copy_of_one_that_needs_nothing(self, parent: int) -> bool:
        """Whether a process forked by ``parent`` needs no planning of its own: until it execs,
        renames itself or changes uid (events that plan it), a forked child is its parent's copy
        (name, command line, user, cgroups), and the parent was found to need nothing, with no
        event of its own since and no policy tuned-rl set that the child would inherit. A fork
        storm's children (fork and exit, as fast as one process can) then cost an event each,
        not a read of /proc; one that lives on is planned by the next rescan."""
        return parent in self.unchanged and parent not in self.pending and parent not in self.policy_parents

    def act_on_pending(self) -> None:
        """Plan each pending process; take the lock only for those with something to do, and plan
        them again under it (the journal may have changed). Those the lock kept waiting stay pending."""
        if not self.pending:
            return
        with self.agent.host.mounts_held():  # thousands of processes, each asking where cgroups are
            self._act_on_pending()

    def _act_on_pending(self) -> None:
        work, now = [], time.monotonic()
        if len(self.planned_at) > PLANNED_AT_BOUND:  # only the last RENAME_REPLAN_S matter: a fork storm's pids
            self.planned_at = {pid: at for pid, at in self.planned_at.items() if now - at < RENAME_REPLAN_S}
        for pid, since in sorted(self.pending.items(), key=lambda item: item[1]):
            if pid in self.renamed:
                if now - self.planned_at.get(pid, -math.inf) < RENAME_REPLAN_S:
                    continue  # renamed again soon after a rename was planned: planned once its interval is over
                self.planned_at[pid] = now
            del self.pending[pid]
            self.renamed.discard(pid)
            if self._guarded(pid, self._needs_acting, pid):
                work.append((pid, since))
        if not work:
            return
        try:
            with exclusive_lock(self.agent.journal.state_dir):
                if not self.load_applied():
                    raise NothingApplied("nothing is applied any more (rolled back)")
                for pid, since in work:
                    try:
                        self._guarded(pid, self._act_on, pid, since)
                    except Stopped:
                        self.after_stopped_verification()  # under the lock, as every journal write
                        raise
        except LockHeld:  # an apply or rollback is running: try again on the next pass
            for pid, since in work:
                self.pending.setdefault(pid, since)

    def _needs_acting(self, pid: int) -> bool:
        """Whether anything may be done for ``pid``: read-only, no lock (most processes need nothing).
        A process found to need nothing is remembered by its signature, which a rescan compares."""
        host = self.agent.host
        self.unchanged.pop(pid, None)
        try:
            signature = host.process_signature(pid)
            process = host.process(pid)
        except TaskGone:
            self.forked_by.pop(pid, None)
            return False
        if process.tgid != pid or process.kernel_thread:
            self.unchanged[pid] = signature
            return False
        if self.forked_by.get(pid) in self.policy_parents:
            return True  # born with a policy tuned-rl set on its parent: its undo is journaled under the lock
        self.forked_by.pop(pid, None)
        if self._is_target(process):  # planned on every rescan: no signature kept
            if self.telemetry is not None and pid not in self.telemetry.pids:
                self.telemetry.add_process(pid)
            if self.followed.get(pid) != process.start_time:
                self.followed[pid] = process.start_time
                self.follow_ups[pid] = [time.monotonic() + s for s in FOLLOW_UP_SECONDS]
            if self.applied.deferred or self.applied.awaiting:
                return True
            return any(self._in_force(s) for s in self._plan(process))
        if any(self._in_force(s) for s in self._plan(process)):
            return True
        self.unchanged[pid] = signature
        return False

    def _plan(self, process) -> list:
        """The plugins' steps for ``process``; a plugin that raises is said (once) and left out."""
        return self.agent.plugins.plan_process(self.profile, self.agent.host, process,
                                               failed=lambda plugin, err: self._failed(process.pid, err, plugin))

    def _guarded(self, pid: int, call: Callable, *args):
        """``call(*args)`` for one process: whatever goes wrong with it is that process's, never
        watch's. A process that exited meanwhile (a /proc file gone) is simply gone; any other error
        is said in a ``failed`` event, and the loop goes on with the next process."""
        try:
            return call(*args)
        except NothingApplied:
            raise
        except TaskGone:
            return False
        except (FileNotFoundError, ProcessLookupError) as err:
            if self._alive(pid):
                self._failed(pid, err)
            return False
        except Exception as err:  # noqa: BLE001 - one process must not end the daemon that serves them all
            self._failed(pid, err)
            return False

    def _alive(self, pid: int) -> bool:
        try:
            self.agent.host.process_signature(pid)
        except (TaskGone, OSError):
            return False
        return True

    def _failed(self, pid: int, err: Exception, plugin: str | None = None) -> None:
        """Say a failure on one process: once per process, plugin and kind of error (a process that
        renames itself in a loop must not turn one fault into a flood of events)."""
        self.stats.failed += 1
        reason = printable(f"{'plugin ' + plugin + ': ' if plugin else ''}{type(err).__name__}: {err}")
        if plugin is not None:
            self.stats.plugin_failures[plugin] = self.stats.plugin_failures.get(plugin, 0) + 1
            self._note_plugin_failure(plugin, reason)
        key = (pid, plugin, type(err).__name__)
        if key in self.failures_said:
            return
        if len(self.failures_said) >= FAILURES_REMEMBERED:
            self.failures_said.clear()
        self.failures_said.add(key)
        self.emit({"event": WatchEvent.FAILED, "pid": pid, "plugin": plugin, "reason": reason})

    def _note_plugin_failure(self, plugin: str, reason: str) -> None:
        """Leave ``status`` the plugins that fail on processes: written when a plugin first fails, then
        at most once a minute while its count grows (a note per failure would be load any user makes)."""
        now = time.time()
        known = self.plugin_notes.get(plugin)
        self.plugin_notes[plugin] = {"count": self.stats.plugin_failures[plugin], "last_error": reason[:500],
                                     "first_at": known["first_at"] if known else round(now, 3), "last_at": round(now, 3)}
        if known is None or now - self._noted_at >= PLUGIN_NOTE_INTERVAL_S:
            self._noted_at = now
            with contextlib.suppress(OSError):
                self.agent.journal.note_watch({"pid": os.getpid(), "plugin_failures": self.plugin_notes})

    def _in_force(self, step) -> bool:
        """Whether watch applies ``step``: it changes something, and its table's apply step is in
        force (not verified harmful, not waiting for the workload: watch applies that one whole)."""
        return (not step.skip_reason and bool(step.pending_changes) and step.table not in self.applied.reverted
                and step.table not in self.applied.deferred)

    def rescan(self, why: str) -> None:
        """Consider every process (a backstop for lost events, and for what started before watch):
        each one whose signature differs from when it was last found to need nothing (a new
        process, an exec, a rename, another user or cgroup) is planned. The next periodic rescan is
        due ``next_rescan_in`` seconds later: ``rescan_seconds``, or more where this one cost more
        than RESCAN_CPU_BUDGET of a CPU over that time."""
        began, cpu_began = time.monotonic(), time.process_time()
        self.stats.rescans += 1
        now = time.monotonic_ns()
        host = self.agent.host
        pids = host.pids()
        alive = set(pids)
        self.unchanged = {pid: s for pid, s in self.unchanged.items() if pid in alive}
        self.followed = {pid: start for pid, start in self.followed.items() if pid in alive}
        self.policy_parents &= alive
        self.backed_off &= alive  # per-pid state lives as long as its process: a pid is reused
        self.planned_at = {pid: at for pid, at in self.planned_at.items() if pid in alive}
        self.renamed &= alive
        self.failures_said = {key for key in self.failures_said if key[0] in alive}
        skipped = 0
        for pid in pids:
            if pid == os.getpid() or pid in self.pending:
                continue
            known = self.unchanged.get(pid)
            if known is not None:
                try:
                    if host.process_signature(pid) == known:
                        skipped += 1
                        continue
                except TaskGone:
                    continue
            self.pending[pid] = now
        before = self.stats.acted
        self.act_on_pending()
        compacted = 0
        if time.monotonic() >= self.next_compaction:  # whichever rescan: under a storm no periodic one comes
            compacted = self.compact()
            self.next_compaction = time.monotonic() + COMPACT_EVERY_S
        cpu = time.process_time() - cpu_began
        # Spaced by what a rescan of known processes costs: the first one, which plans every process,
        # is no measure of the next.
        self.next_rescan_in = max(self.rescan_seconds, cpu / RESCAN_CPU_BUDGET if skipped else 0.0)
        self.next_lost_rescan_in = max(LOST_RESCAN_MIN_S, cpu / LOST_RESCAN_CPU_BUDGET if skipped else 0.0)
        self.emit({"event": WatchEvent.RESCANNED, "why": why, "processes": len(pids), "unchanged": skipped,
                   "acted": self.stats.acted - before, "compacted": compacted,
                   "seconds": round(time.monotonic() - began, 3),
                   "cpu_seconds": round(cpu, 3), "next_periodic_s": round(self.next_rescan_in, 1)})

    def _is_target(self, process) -> bool:
        table = self.profile.get("target")
        if not table or table.get("canary"):
            return False
        return is_target_process(self.agent.host, target_from_table(table)[0], process)

    @contextlib.contextmanager
    def _verifying(self):
        """While watch verifies a step (10-30 s of the loop), its measurement goes on from the judge's
        progress calls: a long wait is still said within a second (without holders: see Telemetry.verifying).
        A stop asked meanwhile (SIGTERM) ends the judge at its next progress call (core.verify.Stopped)."""
        telemetry, progress = self.telemetry, self.agent.progress
        due = [0.0]

        def progress_and_tick(message: str) -> None:
            if self.stop_requested():  # SIGTERM: the verifier reverts the step under test and we end
                raise Stopped("asked to stop while verifying")
            progress(message)
            if time.monotonic() >= due[0]:
                due[0] = time.monotonic() + TELEMETRY_PASS_S
                self.tick_telemetry()
        if telemetry is not None:
            telemetry.verifying = True
        self.agent.progress = progress_and_tick
        try:
            yield
        finally:
            if telemetry is not None:
                telemetry.verifying = False
            self.agent.progress = progress

    def after_stopped_verification(self) -> None:
        """A verification cut short reverted its step and dropped its record: an awaiting step
        ("applied unverified") with no record left is now deferred (applied and verified when the
        workload next starts), so that status says what the host holds."""
        steps = {(r.plugin, r.step) for r in self.agent.journal.records()}
        owners = self.agent.plugins.owners
        gone = [a for a in self.applied.awaiting if (owners.get(a["table"], a["table"]), a["step"]) not in steps]
        if gone:
            self.applied = dataclasses.replace(
                self.applied, awaiting=[a for a in self.applied.awaiting if a not in gone],
                deferred=sorted({*self.applied.deferred, *(a["table"] for a in gone)}))
            self.agent.journal.begin(self.applied)

    def _run_deferred(self, pid: int) -> None:
        """The workload started: apply and verify each step apply deferred until it ran."""
        for table in list(self.applied.deferred):
            began = time.monotonic()
            self.emit({"event": WatchEvent.DEFERRED, "table": table, "pid": pid,
                       "reason": "the workload started: applying the step apply deferred, then verifying it"})
            report = self.late.apply_deferred(self.profile, table, self.warm_up_seconds)
            self._record_verdict(_result(table, pid, report, began, "deferred"), report,
                                 deferred=[t for t in self.applied.deferred if t != table])

    def _verify_awaiting(self, pid: int) -> None:
        """The workload started: verify the steps apply wrote unverified while it was absent."""
        began = time.monotonic()
        awaiting = list(self.applied.awaiting)
        self.emit({"event": WatchEvent.VERIFYING, "steps": [a["step"] for a in awaiting], "pid": pid,
                   "reason": f"the workload started: verifying {len(awaiting)} step(s) apply could not, after "
                             f"{self.warm_up_seconds:g} s of warm-up"})
        warmed = time.monotonic() + self.warm_up_seconds
        while time.monotonic() < warmed:
            time.sleep(min(TELEMETRY_PASS_S, max(0.0, warmed - time.monotonic())))
            self.agent.progress(f"warming up: {max(warmed - time.monotonic(), 0):.0f} s left")
        for entry, report in self.late.verify_awaiting(self.profile, awaiting):
            result = _result(entry["table"], pid, report, began, "unverified at apply")
            result.setdefault("step", entry["step"])
            self._record_verdict(result, report, awaiting=[a for a in self.applied.awaiting if a != entry])

    def _record_verdict(self, result: dict, report, **left) -> None:
        """Journal what watch made of a deferred or awaiting step (``left``: what still waits), and say it."""
        self.applied = dataclasses.replace(self.applied, **left,
                                           deferred_results=[*self.applied.deferred_results, result],
                                           reverted=_reverted(self.applied.reverted, result["table"], report))
        self.agent.journal.begin(self.applied)
        if self.telemetry is not None:
            self.telemetry.set_verified(self.applied.verified_p999_us())
        self.unchanged.clear()  # the step changed what other processes need
        self._index(self.agent.journal.records())
        self.emit({"event": WatchEvent.VERIFIED, **result})

    def _index(self, records) -> None:
        """What the journal holds, kept in memory between reloads (watch writes every record it adds,
        and a reload follows any other writer's apply): the identity of each change tuned-rl set,
        and the records naming each task. Read once per profile, not once per placement: a journal
        of 30,000 records takes 1.7 s to read."""
        self.journaled_ids = {c.identity() for r in records for c in r.changes}
        self.records_of = {}
        for record in records:
            self._index_record(record)
        self._note_journaled(r.changes for r in records)

    def _index_record(self, record) -> None:
        self.journaled_ids.update(c.identity() for c in record.changes)
        for task in {(c.task.pid, c.task.start_time) for c in record.changes if c.task is not None}:
            self.records_of.setdefault(task, []).append(record)

    def compact(self) -> int:
        """Drop the records of watch's whose every task has exited (Journal.compact), under the lock
        if it is free now (else at the next rescan); returns how many."""
        try:
            with exclusive_lock(self.agent.journal.state_dir):
                removed = self.agent.journal.compact(self._task_alive)
        except LockHeld:
            return 0
        for record in removed:
            for change in record.changes:
                self.journaled_ids.discard(change.identity())
                self.records_of.pop((change.task.pid, change.task.start_time), None)
        return len(removed)

    def _task_alive(self, task) -> bool:
        try:
            return self.agent.host.process(task.pid).start_time == task.start_time
        except TaskGone:
            return False

    def _note_journaled(self, change_lists) -> None:
        """Add to ``policy_parents`` the processes whose policy, nice or I/O class these changes set."""
        for changes in change_lists:
            self.policy_parents.update(c.task.pid for c in changes if heirs_keep_it_after_undo(c))

    def _journaled(self, step) -> list[str]:
        """The step's pending changes whose value tuned-rl already set once (a journaled record
        names the same value, task included): someone changed each since."""
        return [c.label() for c in step.pending_changes if c.identity() in self.journaled_ids]

    def _adopt(self, process, parent_pid: int) -> None:
        """A child born into its parent's placement: journal its undo too (LateSteps.adopt)."""
        try:
            parent = self.agent.host.process(parent_pid)
        except TaskGone:
            return
        if parent.tgid != parent_pid or parent.start_time > process.start_time:
            return  # the pid is another process's now
        adopted = self.late.adopt(process, parent, self.records_of.get((parent.pid, parent.start_time), []))
        if adopted is not None:
            self._index_record(adopted)
            self._note_journaled([adopted.changes])
            self.emit({"event": WatchEvent.INHERITED, "pid": process.pid, "comm": printable(process.comm),
                       "parent": parent_pid, "changes": len(adopted.changes)})

    def _act_on(self, pid: int, since_ns: int) -> None:
        host = self.agent.host
        try:
            process = host.process(pid)
        except TaskGone:
            return
        if process.tgid != pid or process.kernel_thread:
            return
        parent = self.forked_by.pop(pid, None)
        if parent in self.policy_parents:
            self._adopt(process, parent)
        if (self.applied.deferred or self.applied.awaiting) and self._is_target(process):
            with self._verifying():
                if self.applied.deferred:
                    self._run_deferred(pid)
                if self.applied.awaiting:
                    self._verify_awaiting(pid)
            try:
                process = host.process(pid)  # placed by the step just verified: plan from where it is now
            except TaskGone:
                return
        for step in self._plan(process):
            if not self._in_force(step):
                continue
            owned = self._journaled(step)
            if owned:
                # tuned-rl set this once and someone changed it since (its owner moved the job back):
                # theirs now. Said once; `tuned-rl apply` again or `rollback --force` decide.
                if pid not in self.backed_off:
                    self.backed_off.add(pid)
                    self.emit({"event": WatchEvent.BACKED_OFF, "pid": pid, "comm": printable(process.comm), "step": step.title,
                               "changed": owned[:5]})
                continue
            pids = sorted({c.task.pid for c in step.pending_changes if c.task is not None})
            try:
                report = self.late.apply(step)
            except HostError as err:
                self.emit({"event": WatchEvent.FAILED, "pid": pid, "comm": printable(process.comm), "step": step.title,
                           "reason": str(err)})
                continue
            if report.outcome in (Outcome.FAILED, Outcome.UNCHANGED, Outcome.SKIPPED):
                if report.outcome == Outcome.FAILED:
                    self.emit({"event": WatchEvent.FAILED, "pid": pid, "comm": printable(process.comm), "step": step.title,
                               "reason": report.reason})
                continue
            if report.record is not None:
                self._index_record(report.record)
            self.stats.acted += 1
            event = step_event(step.verb)
            if event == WatchEvent.EVICTED:
                self.stats.evicted += max(1, len(pids))
            else:
                self.stats.placed += 1
            self._note_journaled([step.pending_changes])
            self.emit({"event": event, "pid": pid,
                       "comm": printable(process.comm), "step": step.title, "plugin": step.table,
                       "pids": pids,
                       "changes": len(report.changes), "outcome": report.outcome,
                       "reaction_ms": round((time.monotonic_ns() - since_ns) / 1e6, 1)})


def _result(table: str, pid: int, report, began: float, after: str) -> dict:
    """What watch made of a step it verified, as status shows it (``after``: deferred, or unverified at apply)."""
    result = {"table": table, "at": round(time.time(), 3), "pid": pid, "after": after}
    if report is None:
        return {**result, "outcome": Outcome.UNCHANGED, "reason": "nothing to change now"}
    result.update(step=report.step, outcome=report.outcome, reason=report.reason, changes=len(report.changes),
                  seconds=round(time.monotonic() - began, 1))
    if report.before is not None:
        result.update(p999_without_us=report.before["p999_us"], p999_with_us=report.after["p999_us"],
                      samples_without=report.before["n"], samples_with=report.after["n"])
    return result


def _reverted(reverted: list, table: str, report) -> list:
    """The tables watch applies no rule of: a step verified harmful adds its table."""
    return sorted({*reverted, table}) if report is not None and report.outcome == Outcome.REVERTED else reverted


def run(watcher: Watcher, source, stopping: Callable[[], bool]) -> int:
    """The loop, until ``stopping()``; returns the exit status (0: stopped or nothing left to watch)."""
    if not watcher.load_applied():
        raise NothingApplied("no profile is applied: run `tuned-rl apply PROFILE` first, then watch")
    lost_seen, lost_unanswered, next_lost_rescan = source.lost, 0, 0.0
    watcher.stop_requested = stopping
    try:
        watcher.refresh_telemetry()
        watcher.rescan("start")  # what started between the apply and now
        next_rescan = time.monotonic() + watcher.next_rescan_in
        next_check = time.monotonic()
        while not stopping():
            longest = TELEMETRY_PASS_S if watcher.telemetry is not None else 1.0
            read_at = time.monotonic()
            events = source.read(timeout=min(longest, max(0.0, next_rescan - time.monotonic())))
            if len(events) >= getattr(source, "read_limit", math.inf):
                # A storm of events (another user's rename loop or fork storm): read them at most at
                # MAX_EVENTS_PER_S; the rest overflow the socket, silently after the first ENOBUFS
                # (the kernel says it once until the queue drains), so reading behind counts as a
                # loss: a rescan answers it.
                time.sleep(max(0.0, len(events) / MAX_EVENTS_PER_S - (time.monotonic() - read_at)))
                lost_unanswered += 1
            watcher.note_events(events)
            watcher.refresh_telemetry()
            watcher.tick_telemetry()
            if source.lost != lost_seen:
                watcher.stats.lost += source.lost - lost_seen
                lost_unanswered += source.lost - lost_seen
                lost_seen = source.lost
            if lost_unanswered and time.monotonic() >= next_lost_rescan:
                # Answered by a rescan, but not by one per overflow: under a fork storm the socket
                # overflows on every read, and back-to-back rescans were watch's whole CPU.
                watcher.emit({"event": WatchEvent.LOST, "overflows": lost_unanswered, "total": source.lost})
                lost_unanswered = 0
                watcher.rescan("events were lost")
                next_rescan = time.monotonic() + watcher.next_rescan_in
                next_lost_rescan = time.monotonic() + watcher.next_lost_rescan_in
                continue
            if time.monotonic() >= next_check:  # a rollback, or another apply, since: at most a second ago
                if not watcher.load_applied():
                    raise NothingApplied("nothing is applied any more (rolled back)")
                next_check = time.monotonic() + 1.0
            watcher.act_on_pending()
            if time.monotonic() >= next_rescan:
                watcher.rescan("periodic")
                next_rescan = time.monotonic() + watcher.next_rescan_in
    except NothingApplied as err:
        watcher.emit({"event": WatchEvent.STOPPED, "reason": str(err)})
        return 0
    except Stopped:
        watcher.emit({"event": WatchEvent.STOPPED, "reason": "asked to stop while verifying a step: that step was reverted, "
                                                    "and is verified when the workload next starts under watch"})
        return 0
    finally:
        watcher.stop_telemetry()
    watcher.emit({"event": WatchEvent.STOPPED, "reason": "asked to stop (the tuning stays; `tuned-rl rollback` undoes it)"})
    return 0
