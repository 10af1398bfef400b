"""The durable undo journal: one file per step, on disk before the step's first write.

Layout of the state directory::

    lock                  flock()ed by a running apply/rollback; holds its pid (core/lock.py)
    journal/applied.json  the profile being applied (name, path, boot id, host root, time)
    journal/NNNNNN.jsonl  one step's undo records: a header line, a line per change,
                          then a line for each later state ("done")
    stale/<time>/         journals from an earlier boot, copied aside and kept for reading; the
                          journal then keeps only the records of what survives a reboot (files)
    refused/<time>/       records rollback would not replay (unreadable, or naming a place
                          tuned-rl does not write), moved aside and kept for reading

The directory and its folders are root's alone (core/state_dir.py); every file in it is
opened with O_NOFOLLOW, and a record is checked whole before anything is replayed.

A step's file is written whole (temporary file, fsync, rename, fsync of the
directory) before the step writes anything, so one fsync covers all its changes
however many tasks it touches; a state line is appended (fdatasync) when the step
is kept. A crash half-way through a step leaves every change's original value on
disk: rollback writes back those that were written and finds the others unchanged.
Records of format 1 (one ``NNNNNN.json`` per change, tuned-rl 0.1) are still read.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from tuned_rl.core.changes import Change
from tuned_rl.core.kinds import UnknownKind
from tuned_rl.core.outcomes import Outcome
from tuned_rl.core.state_dir import ensure_private_dir
from tuned_rl.host.durable import fsync_directory, read_nofollow, replace_durably, write_whole
from tuned_rl.host.tasks import Task

DEFAULT_STATE_DIR = "/var/lib/tuned-rl"
FORMAT = 2
STATES = ("journaled", "done")


WATCH_NOTE = "watch.json"


class JournalError(RuntimeError):
    """A journal file that cannot be read or trusted; names the file."""


@dataclass
class StepRecord:
    """The undo records of one step: enough to restore each change's ``before`` after a crash.

    ``state`` is "journaled" from before the step's first write until it has been
    written, read back and kept, then "done"; rollback restores both alike.
    """

    seq: int
    boot_id: str
    plugin: str
    step: str
    step_index: int
    changes: list[Change]
    state: str = "journaled"
    host_root: str | None = None  # the root the host object had (tests move it); None: not recorded (0.1)
    path: Path | None = field(default=None, compare=False)  # where it is on disk
    by: str = "apply"  # or "watch": a process that started after the apply
    written_at: float | None = None  # Unix time the record was written (None: not recorded, before watch)

    def header(self) -> dict:
        header = {"format": FORMAT, "seq": self.seq, "boot_id": self.boot_id, "plugin": self.plugin,
                  "step": self.step, "step_index": self.step_index, "host_root": self.host_root}
        if self.by != "apply":
            header["by"] = self.by
        if self.written_at is not None:
            header["written_at"] = self.written_at
        return header


@dataclass
class Applied:
    """Which profile the journal belongs to."""

    profile: str
    path: str
    boot_id: str
    started: float
    host_root: str | None = None  # None: not recorded (tuned-rl 0.1)
    digest: str | None = None  # Profile.digest(): the same profile applied again changes nothing
    deferred: list = field(default_factory=list)  # tables whose step waits for the workload (watch applies them)
    deferred_results: list = field(default_factory=list)  # what watch made of them: {table, step, outcome, ...}
    reverted: list = field(default_factory=list)  # tables whose step was verified harmful: watch applies none of them
    awaiting: list = field(default_factory=list)  # {table, step} applied unverified (no workload): watch verifies them
    verified: list = field(default_factory=list)  # apply's verdicts: {table, step, outcome, p999_without_us, ...}

    def verdicts(self) -> list[dict]:
        """Every verdict on this profile's steps, in the order they were made: apply's, then watch's."""
        return [*self.verified, *(r for r in self.deferred_results if "p999_with_us" in r)]

    def verified_p999_us(self) -> float | None:
        """The target's p999 in the state the last verdict left the host in: with the step if it was
        kept, without it if it was reverted (None: no step was verified on a measurement)."""
        for verdict in reversed(self.verdicts()):
            key = "p999_without_us" if verdict.get("outcome") == Outcome.REVERTED else "p999_with_us"
            value = verdict.get(key)
            if isinstance(value, (int, float)) and value == value and value > 0:
                return float(value)
        return None


@dataclass(frozen=True)
class Unreadable:
    """A file in the journal that is not a record tuned-rl could have written, and why."""

    path: Path
    reason: str


@dataclass
class Scan:
    """What the journal holds: the records that can be trusted, and the files that cannot."""

    records: list[StepRecord]
    unreadable: list[Unreadable]


class Journal:
    """Step records in ``<state_dir>/journal``."""

    def __init__(self, state_dir: str | os.PathLike):
        self.state_dir = Path(state_dir)
        self.directory = self.state_dir / "journal"

    def applied(self) -> Applied | None:
        path = self.directory / "applied.json"
        if not self._exists():
            return None
        try:
            data = json.loads(read_nofollow(path))
            applied = Applied(**data)
            if not isinstance(applied.profile, str) or not isinstance(applied.host_root, (str, type(None))):
                raise TypeError("profile and host_root must be text")
            return applied
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError) as err:
            raise JournalError(f"{path}: not a tuned-rl journal file: {err}; move it away (it names the profile "
                               "applied, no value to restore)") from err

    def scan(self) -> Scan:
        """Every step record, oldest first, and every file that cannot be trusted as one."""
        if not self._exists():
            return Scan([], [])
        records, unreadable = [], []
        for path in self._record_paths():
            try:
                records.append(_read_record(path))
            except JournalError as err:
                unreadable.append(Unreadable(path, str(err)))
        return Scan(sorted(records, key=lambda r: r.seq), unreadable)

    def records(self) -> list[StepRecord]:
        """The records that can be trusted, oldest first (``scan`` also says which files cannot)."""
        return self.scan().records

    def is_empty(self) -> bool:
        return self.applied() is None and not (self._exists() and self._record_paths())

    def begin(self, applied: Applied) -> None:
        self._prepare()
        _write_durably(self.directory / "applied.json", json.dumps(asdict(applied), indent=1, sort_keys=True))

    def add(self, record: StepRecord) -> StepRecord:
        """Assign the next sequence number and write the whole record durably."""
        self._prepare()
        if record.written_at is None:
            record.written_at = round(time.time(), 3)
        # Read from the directory each time, never cached: `tuned-rl watch` adds records from
        # another process between an apply's (each under the lock).
        record.seq = max((int(p.name[:6]) for p in self._record_paths() if p.name[:6].isdigit()), default=0) + 1
        record.path = self.directory / f"{record.seq:06d}.jsonl"
        _write_durably(record.path, _lines(record))
        return record

    def mark(self, record: StepRecord, state: str) -> None:
        """Append a state line (one fdatasync)."""
        fd = os.open(record.path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            write_whole(fd, (json.dumps({"state": state}) + "\n").encode())
            os.fdatasync(fd)
        finally:
            os.close(fd)
        record.state = state

    def replace(self, record: StepRecord, changes: list[Change]) -> None:
        """Keep only ``changes`` of a record (those a rollback could not restore yet)."""
        record.changes = changes
        target = self.directory / f"{record.seq:06d}.jsonl"
        _write_durably(target, _lines(record))
        if record.path != target:
            record.path.unlink(missing_ok=True)  # a format-1 record, now rewritten
        record.path = target

    def remove(self, record: StepRecord) -> None:
        record.path.unlink(missing_ok=True)
        fsync_directory(self.directory)

    def compact(self, alive: Callable[[Task], bool]) -> list[StepRecord]:
        """Remove watch's records whose every change is of a task that has exited (``alive`` False:
        its pid gone, or another task's now); returns them. Their undo is moot (rollback would
        report each change "gone"), and a node's short-lived jobs left one each, for months: the
        journal grew without end. One unlink per record, then one fsync of the directory: a crash
        part-way leaves some of them, each whole; no record of a living task is touched."""
        done = [r for r in self.records() if r.by == "watch" and r.changes
                and all(c.task is not None for c in r.changes) and not any(alive(c.task) for c in r.changes)]
        for record in done:
            record.path.unlink(missing_ok=True)
        if done:
            fsync_directory(self.directory)
        return done

    def finish(self) -> None:
        """Forget the applied profile once every record is gone."""
        if self._exists() and not self._record_paths():
            (self.directory / "applied.json").unlink(missing_ok=True)
            fsync_directory(self.directory)

    def move_aside(self) -> Path:
        """Move the whole journal to ``stale/<time>`` (for records of an earlier boot)."""
        target = self._aside("stale")
        os.replace(self.directory, target)
        return target

    def copy_aside(self) -> Path:
        """Copy every regular file of the journal to ``stale/<time>``, kept for reading (after a
        reboot, before the records of run-time state are dropped from the journal)."""
        target = self._aside("stale")
        target.mkdir(mode=0o700)
        for path in sorted(self.directory.iterdir()):
            if path.is_symlink() or not path.is_file():
                continue
            _write_durably(target / path.name, read_nofollow(path))
        return target

    def move_refused(self, paths: list[Path]) -> Path:
        """Move files rollback would not replay to ``refused/<time>``, kept for reading."""
        target = self._aside("refused")
        target.mkdir(mode=0o700)
        for path in paths:
            os.replace(path, target / path.name)
        fsync_directory(self.directory)
        return target

    def note_watch(self, note: dict) -> None:
        """What a running watch wants ``status`` to show (the plugins that failed on processes, with
        why): ``<state_dir>/watch.json``, replaced whole. No undo rests on it."""
        if self._exists():
            _write_durably(self.state_dir / WATCH_NOTE, json.dumps(note, sort_keys=True))

    def watch_note(self) -> dict:
        """The last note watch left ({} if none, or unreadable)."""
        try:
            note = json.loads(read_nofollow(self.state_dir / WATCH_NOTE))
        except (OSError, ValueError):
            return {}
        return note if isinstance(note, dict) else {}

    def _aside(self, folder: str) -> Path:
        ensure_private_dir(self.state_dir / folder, create=True)
        target = self.state_dir / folder / time.strftime("%Y%m%dT%H%M%S")
        suffix = 0
        while target.exists():  # two in one second
            suffix += 1
            target = target.with_name(f"{target.name.split('.')[0]}.{suffix}")
        return target

    def _exists(self) -> bool:
        return ensure_private_dir(self.state_dir, create=False) and ensure_private_dir(self.directory, create=False)

    def _prepare(self) -> None:
        ensure_private_dir(self.state_dir, create=True)
        ensure_private_dir(self.directory, create=True)

    def _record_paths(self) -> list[Path]:
        return sorted(p for p in self.directory.iterdir() if p.name[:1].isdigit() and p.suffix in (".json", ".jsonl"))


def _lines(record: StepRecord) -> str:
    lines = [record.header(), *({"change": c.to_dict()} for c in record.changes)]
    if record.state != "journaled":
        lines.append({"state": record.state})
    return "".join(json.dumps(line, sort_keys=True) + "\n" for line in lines)


def _read_record(path: Path) -> StepRecord:
    try:
        text = read_nofollow(path)
        record = _parse_v1(json.loads(text)) if path.suffix == ".json" else _parse_v2(text)
    except (OSError, ValueError, TypeError, KeyError, UnknownKind) as err:
        why = err.strerror if isinstance(err, OSError) and err.strerror else err
        why = f"{err} is missing" if isinstance(err, KeyError) else why
        raise JournalError(f"{path}: cannot be read as a tuned-rl journal record: {why}") from err
    if path.suffix == ".jsonl" and f"{record.seq:06d}" != path.stem:
        raise JournalError(f"{path}: its header names step {record.seq}")
    record.path = path
    return record


def _parse_v2(text: str) -> StepRecord:
    rows = text.split("\n")
    if rows and rows[-1] == "":
        rows.pop()
    elif rows:
        rows.pop()  # a line torn by a crash while it was appended: its state never took effect
    if not rows:
        raise ValueError("empty")
    header = json.loads(rows[0])
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ValueError(f"format {header.get('format') if isinstance(header, dict) else '?'!r} is not {FORMAT}")
    record = StepRecord(_int(header["seq"]), _str(header["boot_id"]), _str(header["plugin"]), _str(header["step"]),
                        _int(header["step_index"]), [], host_root=_str(header["host_root"]))
    if "by" in header:
        if header["by"] not in ("apply", "watch"):
            raise ValueError(f"by {header['by']!r} is neither apply nor watch"[:200])
        record.by = header["by"]
    if "written_at" in header:
        if not isinstance(header["written_at"], (int, float)) or isinstance(header["written_at"], bool):
            raise ValueError("written_at is not a time")
        record.written_at = float(header["written_at"])
    for row in map(json.loads, rows[1:]):
        if isinstance(row, dict) and set(row) == {"change"}:
            record.changes.append(Change.from_dict(row["change"]))
        elif isinstance(row, dict) and set(row) == {"state"} and row["state"] in STATES:
            record.state = row["state"]
        else:
            raise ValueError(f"unexpected line {row!r}"[:200])
    return record


def _parse_v1(data: dict) -> StepRecord:
    if data.get("state") not in STATES:
        raise ValueError(f"unknown state {data.get('state')!r}")
    return StepRecord(_int(data["seq"]), _str(data["boot_id"]), _str(data["plugin"]), _str(data["step"]),
                      _int(data["step_index"]), [Change.from_dict(data["change"])], data["state"])


def _int(value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{value!r} is not a count")
    return value


def _str(value) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not text")
    return value


def _write_durably(path: Path, text: str) -> None:
    """All or nothing on disk, readable by root only (a record names other users' tasks)."""
    replace_durably(path, text.encode(), 0o600, ".tmp")
