"""What a journal found on disk may be replayed as: written against this host root, trusted (no
record names a place tuned-rl never writes), of this boot or carried over a reboot; and each
journaled change's state now, for `tuned-rl status`."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tuned_rl.core.change_rows import ChangeStatus
from tuned_rl.core.changes import Change
from tuned_rl.core.journal import Applied, Journal, Scan, StepRecord
from tuned_rl.core.outcomes import State
from tuned_rl.core.places import refusal
from tuned_rl.core.step_writer import HostError, describe_error
from tuned_rl.host import Host, TaskGone


def check_root(host: Host, journal: Journal, applied: Applied | None, records: list[StepRecord]) -> None:
    """Refuse a journal written against another host root (a test tree's, or the real one's)."""
    roots = {r.host_root for r in records} | ({applied.host_root} if applied else set())
    other = sorted(roots - {str(host.root), None})
    if other:
        raise HostError(f"the journal in {journal.state_dir} was written against host root {other[0]}, "
                        f"not {host.root}: it is not replayed here (run with TUNED_RL_HOST_ROOT={other[0]},"
                        " or use another --state-dir)")


def trusted_records(host: Host, scan: Scan) -> tuple[list[StepRecord], list[tuple[Path, str]]]:
    """The records rollback may replay, and (path, why) of the files it must not."""
    mounts = [m.mount_point for m in host.cgroup_mounts()]
    trusted, refused = [], [(u.path, u.reason) for u in scan.unreadable]
    for record in scan.records:
        why = next((f"{record.path}: {reason}" for change in record.changes for path in change.handler.paths(change)
                    if (reason := refusal(path, mounts))), None)
        if why:
            refused.append((record.path, why))
        else:
            trusted.append(record)
    return trusted, refused


def is_stale(host: Host, applied: Applied | None, scan: Scan) -> bool:
    """The journal was written in an earlier boot: a reboot already reset what it holds."""
    boots = {r.boot_id for r in scan.records} | ({applied.boot_id} if applied else set())
    return bool(boots) and boots != {host.boot_id()}


def carry_over(host: Host, journal: Journal, applied: Applied | None, scan: Scan) -> dict:
    """After a reboot: copy the journal aside, then keep in it only the records of changes that
    survive a reboot (files in /etc), re-dated to this boot; the rest a reboot already reset.

    Each record is rewritten whole or removed, so a crash part-way leaves records of either
    boot, and the next run carries over what is left: nothing of the admin's is ever lost.
    Files that are not records tuned-rl could have written are dropped (the copy keeps them)."""
    boot = host.boot_id()
    kept_in = journal.copy_aside()
    carried = set_aside = 0
    boot_ids = sorted({r.boot_id for r in scan.records} | ({applied.boot_id} if applied else set()))
    if applied is not None and applied.boot_id != boot:
        journal.begin(dataclasses.replace(applied, boot_id=boot))
    for record in scan.records:
        lasting = [c for c in record.changes if c.handler.survives_reboot(c)]
        set_aside += len(record.changes) - len(lasting)
        carried += len(lasting)
        if lasting:
            record.boot_id = boot
            journal.replace(record, lasting)
        else:
            journal.remove(record)
    for unreadable in scan.unreadable:
        unreadable.path.unlink(missing_ok=True)
    return {"records": carried + set_aside, "set_aside": set_aside, "carried": carried, "boot_ids": boot_ids,
            "kept_in": str(kept_in)}


def change_status(host: Host, record: StepRecord, change: Change, stale: bool) -> ChangeStatus:
    show = change.handler.show
    row = ChangeStatus(record.plugin, record.step, change.label(), show(change.before), show(change.after), None)
    if stale:
        return dataclasses.replace(row, state=State.STALE)
    try:
        current = change.read(host)
    except TaskGone:
        return dataclasses.replace(row, state=State.GONE)
    except (OSError, LookupError) as err:
        return dataclasses.replace(row, state=State.UNREADABLE, reason=describe_error(err))
    row.current = show(current)
    if record.state != "done":
        return dataclasses.replace(row, state=State.INTERRUPTED)
    return dataclasses.replace(row, state=State.HOLDS if change.holds(current, change.after) else State.DRIFTED)
