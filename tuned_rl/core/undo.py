"""Undoing journaled records, newest first, and then the heirs of what was restored: the children
and threads that copied a value tuned-rl set and that no record names."""

from __future__ import annotations

import dataclasses
import time

from tuned_rl.core.change_rows import RestoredChange
from tuned_rl.core.changes import Change
from tuned_rl.core.journal import StepRecord
from tuned_rl.core.kinds import heirs_keep_it_after_undo
from tuned_rl.core.outcomes import Restore
from tuned_rl.core.step_writer import StepWriter
from tuned_rl.host import Host, TaskGone

SETTLE_S = 0.1  # after a rollback, how long a fork in flight may take to end (its parent runs again at once)


def undo_records(writer: StepWriter, records: list[StepRecord], force: bool) -> list[RestoredChange]:
    """Restore every record, newest first; each record is dropped once all of it is restored.
    Then the children that inherited a restored value and that no record names (_settle_inherited)."""
    results = [result for record in reversed(records) for result in writer.undo_record(record, force)]
    return results + _settle_inherited(writer.host, records)


def _settle_inherited(host: Host, records: list[StepRecord]) -> list[RestoredChange]:
    """A process forked while tuned-rl held its parent at another policy, nice or I/O class
    inherits them, and so does a thread started then by one of its threads; unless `tuned-rl
    watch` journaled it (or a cgroup's removal covered it) no record names it. A fork in flight
    while rollback restores the parent copies the old values too, and ends once the parent runs
    again. So after SETTLE_S, each heir of a restored task, born after the task's record was
    written, that holds every value tuned-rl had set on the task (SCHED_OTHER alone is anyone's
    default; with nice -20 it is tuned-rl's), and not the originals, is given the originals: the
    children of a restored process, and the other threads of a restored thread's process where
    every restored thread of it had the same originals (/proc does not say which started it).

    A task's values are written one at a time (sched_fifo: the nice, then the policy; undone in
    reverse), so a task born between two writes copies the first ones' new values and the rest's
    old: a thread started while the main thread was between its nice and its policy is SCHED_FIFO
    at nice -20. Such a copy is an heir too (``_copied_from``); and where watch then journaled that
    thread for its SCHED_FIFO, its record's originals are that copy, not a value of its own: they
    do not count as a second set of originals, and the thread is given its process's."""
    held: list[tuple[StepRecord, list[Change]]] = []  # each record's inherited changes, by task
    for record in records:
        by_task: dict = {}
        for change in record.changes:
            if heirs_keep_it_after_undo(change):
                by_task.setdefault(change.task, []).append(change)
        held += [(record, changes) for changes in by_task.values()]
    if not held:
        return []
    time.sleep(SETTLE_S)
    restored, originals = [], {}
    for record, changes in held:
        try:
            tgid = host.process(changes[0].task.pid).tgid
            if not all(c.holds(c.read(host), c.before) for c in changes):
                continue  # a task not restored (left, gone)
        except (TaskGone, ProcessLookupError, LookupError, OSError):
            continue
        restored.append((record, changes, tgid))
    for index, (record, changes, tgid) in enumerate(restored):
        if not any(_born_a_copy(host, record, changes, other, other_changes)
                   for other_index, (other, other_changes, other_tgid) in enumerate(restored)
                   if other_tgid == tgid and other_index != index):
            originals.setdefault(tgid, set()).add(tuple((c.kind, c.handler.show(c.before)) for c in changes))
    results = []
    for record, changes, tgid in restored:
        pid = changes[0].task.pid
        heirs = [(child, f"forked by pid {pid}") for child in host.children(tgid)] if tgid == pid else []
        if len(originals.get(tgid, ())) == 1:
            heirs += [(tid, f"a thread started in pid {tgid}") for tid in sorted(host.thread_ids(tgid))
                      if tid != pid]
        for heir, how in heirs:
            results += _give_the_originals(host, record, changes, heir, how)
    return results


def _give_the_originals(host: Host, record: StepRecord, changes: list[Change], pid: int, how: str
                        ) -> list[RestoredChange]:
    """The originals of ``changes`` for task ``pid``, if it was born after ``record`` was written
    and holds every value tuned-rl set and not every original."""
    try:
        task = host.task(pid)
        if record.written_at is None or host.started_at(task) < record.written_at:
            return []  # born before tuned-rl set the values: what it holds is its own
        heirs = [dataclasses.replace(c, task=task) for c in changes]
        current = [h.read(host) for h in heirs]
        if not _copied_from(changes, current):
            return []
        results = []
        for heir, value in zip(heirs, current):
            if not heir.holds(value, heir.before):
                heir.write(host, heir.before)
                show = heir.handler.show
                results.append(RestoredChange(
                    record.plugin, record.step, heir.label(), show(value), show(heir.before), Restore.RESTORED,
                    f"{how} while tuned-rl held it at {show(heir.after)}: given the original"))
        return results
    except (TaskGone, ProcessLookupError, LookupError, OSError):
        return []


def _born_a_copy(host: Host, record: StepRecord, changes: list[Change], other: StepRecord,
                 other_changes: list[Change]) -> bool:
    """Whether the originals ``changes`` journaled (in ``record``) are a copy of ``other_changes``'
    task taken while tuned-rl held it: their task born after ``other`` was written, and holding such a
    copy when ``record`` was written. A value the record has no change for already held what the
    plugin wanted (a plan leaves out what needs no change): where both records are one plugin's,
    wanting the same values, it is taken as ``other``'s new value."""
    if record.plugin != other.plugin:
        return False
    try:
        if other.written_at is None or host.started_at(changes[0].task) < other.written_at:
            return False
    except (TaskGone, ProcessLookupError, LookupError, OSError):
        return False
    own = {c.kind: c for c in changes}
    if not set(own) <= {c.kind for c in other_changes}:
        return False
    if not all(c.holds(own[c.kind].after, c.after) for c in other_changes if c.kind in own):
        return False  # not the values the other was given
    return _copied_from(other_changes, [own[c.kind].before if c.kind in own else c.after for c in other_changes])


def _copied_from(changes: list[Change], values: list) -> bool:
    """Whether ``values`` (one per change, in the order the changes were made) are a copy of the
    task taken while tuned-rl held it, or between two of its writes: the new values of the first
    changes (one at least) and the old of the rest; not every old one (that is anyone's)."""
    if all(c.holds(value, c.before) for c, value in zip(changes, values)):
        return False
    made = 0
    while made < len(changes) and changes[made].holds(values[made], changes[made].after):
        made += 1
    return made > 0 and all(c.holds(value, c.before) for c, value in zip(changes[made:], values[made:]))
