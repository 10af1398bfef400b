"""The durable undo journal and the lock that lets one agent at a time change the host.

Layout of the state directory::

    lock                 flock()ed by a running apply/rollback; holds its pid
    journal/applied.json the profile being applied (name, path, boot id, time)
    journal/NNNNNN.json  one undo record per change, written before the change
    stale/<time>/        journals from an earlier boot, moved aside and kept for reading
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from tuned_rl.core.changes import Change

DEFAULT_STATE_DIR = "/var/lib/tuned-rl"


class LockHeld(RuntimeError):
    """Another tuned-rl holds the state directory's lock."""

    def __init__(self, pid: str, path: Path):
        super().__init__(f"another tuned-rl (pid {pid or 'unknown'}) is changing this host; lock: {path}")
        self.pid = pid


class StateDirError(RuntimeError):
    """The state directory cannot be created or written."""


@dataclass
class Record:
    """The undo record of one change: enough to restore ``change.before`` after a crash.

    ``state`` is "journaled" from before the write until the whole step has been
    written and read back, then "done"; rollback restores both alike.
    """

    seq: int
    boot_id: str
    plugin: str
    step: str
    step_index: int
    change: Change
    state: str = "journaled"

    def to_dict(self) -> dict:
        data = asdict(self)
        data["change"] = self.change.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "Record":
        return cls(**{**data, "change": Change.from_dict(data["change"])})


@dataclass
class Applied:
    """Which profile the journal belongs to."""

    profile: str
    path: str
    boot_id: str
    started: float


class Journal:
    """Undo records in ``<state_dir>/journal``, each written durably (fsync, rename)."""

    def __init__(self, state_dir: str | os.PathLike):
        self.state_dir = Path(state_dir)
        self.directory = self.state_dir / "journal"

    def applied(self) -> Applied | None:
        path = self.directory / "applied.json"
        return Applied(**json.loads(path.read_text())) if path.exists() else None

    def records(self) -> list[Record]:
        if not self.directory.is_dir():
            return []
        files = sorted(p for p in self.directory.glob("[0-9]*.json"))
        return [Record.from_dict(json.loads(p.read_text())) for p in files]

    def is_empty(self) -> bool:
        return self.applied() is None and not self.records()

    def begin(self, applied: Applied) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        _write_durably(self.directory / "applied.json", asdict(applied))

    def add(self, record: Record) -> Record:
        """Assign the next sequence number and write the record durably."""
        self.directory.mkdir(parents=True, exist_ok=True)
        numbers = [int(p.stem) for p in self.directory.glob("[0-9]*.json")]
        record.seq = max(numbers, default=0) + 1
        self.save(record)
        return record

    def save(self, record: Record) -> None:
        _write_durably(self._record_path(record), record.to_dict())

    def remove(self, record: Record) -> None:
        self._record_path(record).unlink(missing_ok=True)
        _fsync_dir(self.directory)

    def finish(self) -> None:
        """Forget the applied profile once every record is gone."""
        if not self.records():
            (self.directory / "applied.json").unlink(missing_ok=True)
            _fsync_dir(self.directory)

    def move_aside(self) -> Path:
        """Move the whole journal to ``stale/<time>`` (for records of an earlier boot)."""
        target = self.state_dir / "stale" / time.strftime("%Y%m%dT%H%M%S")
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self.directory, target)
        return target

    def _record_path(self, record: Record) -> Path:
        return self.directory / f"{record.seq:06d}.json"


@contextmanager
def exclusive_lock(state_dir: str | os.PathLike):
    """Hold ``<state_dir>/lock`` or raise LockHeld at once, naming the holder's pid."""
    state_dir = Path(state_dir)
    path = state_dir / "lock"
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        raise StateDirError(f"cannot use the state directory {state_dir}: {err.strerror} (not root? "
                            "--state-dir moves it); nothing was changed") from err
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            raise LockHeld(_holder_pid(fd), path) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
        os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # closing releases the flock


def _holder_pid(fd: int) -> str:
    # The holder writes its pid just after it takes the lock: give it a moment.
    for _ in range(20):
        pid = os.pread(fd, 32, 0).decode(errors="replace").strip()
        if pid:
            return pid
        time.sleep(0.01)
    return ""


def _write_durably(path: Path, data: dict) -> None:
    """Write, fsync, rename over ``path``, fsync the directory: all or nothing on disk."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as handle:
        json.dump(data, handle, indent=1, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
