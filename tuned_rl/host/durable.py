"""Writes that survive a crash: the one place tuned-rl makes a file whole on disk (the journal's
records and the files a change creates or replaces both come through here)."""

from __future__ import annotations

import errno
import os
from pathlib import Path


def write_whole(fd: int, data: bytes) -> None:
    """Write all of ``data`` to a regular file: os.write may write less (a nearly full filesystem);
    loop, and raise ENOSPC if a write makes no progress."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(errno.ENOSPC, "no space left: the write made no progress")
        view = view[written:]


def read_nofollow(path: Path) -> str:
    """A file's text, never through a symbolic link (ELOOP says so in words)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "it is a symbolic link, which tuned-rl does not follow") from err
        raise
    with os.fdopen(fd, "rb") as handle:
        return handle.read().decode("utf-8")


def fsync_directory(path: str | os.PathLike) -> None:
    """fsync a directory, so that a rename or unlink in it is on disk (a crash cannot undo it)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_durably(path: Path, content: bytes, mode: int, temporary_suffix: str) -> None:
    """Create or replace a regular file, all or nothing on disk: a temporary file beside it
    (``.<name><temporary_suffix>``, never a link followed) written whole and fsynced, renamed over
    ``path``, then the directory fsynced so that the rename survives a crash. The file gets ``mode``
    whatever the umask."""
    tmp = path.with_name(f".{path.name}{temporary_suffix}")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        os.fchmod(fd, mode)
        write_whole(fd, content)  # a short write (a nearly full disk) is an error, never a torn file
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(tmp, path)
    fsync_directory(path.parent)
