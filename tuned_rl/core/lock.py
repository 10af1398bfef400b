"""The lock that lets one tuned-rl at a time change the host: an flock on ``<state_dir>/lock``."""

from __future__ import annotations

import errno
import fcntl
import os
import time
from contextlib import contextmanager
from pathlib import Path

from tuned_rl.core.state_dir import StateDirError, ensure_private_dir


class LockHeld(RuntimeError):
    """Another tuned-rl holds the state directory's lock."""

    def __init__(self, pid: str, path: Path):
        super().__init__(f"another tuned-rl (pid {pid or 'unknown'}) is changing this host; lock: {path}")
        self.pid = pid


@contextmanager
def exclusive_lock(state_dir: str | os.PathLike):
    """Hold ``<state_dir>/lock`` or raise LockHeld at once, naming the holder's pid."""
    state_dir = Path(state_dir)
    path = state_dir / "lock"
    ensure_private_dir(state_dir, create=True)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise StateDirError(f"{path} is a symbolic link: tuned-rl does not follow it (fix: rm {path})") from err
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
