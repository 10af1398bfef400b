"""The state directory is root's alone: created 0700, refused if someone else could write it or it is a link.

Whoever can write the state directory could plant undo records that a root
rollback would replay, or links that a root apply would write through. So it
must be a real directory (not a symbolic link), owned by the user running
tuned-rl (root), and writable by nobody else; the same holds for the folders
in it. Files in it are opened with O_NOFOLLOW (journal.py, lock.py).

Its parents count too: whoever can write /var/lib (or the folder --state-dir names)
can rename the state directory away and put their own in its place. Each parent must
be owned by root or by the user running tuned-rl, and not writable by group or others
unless it is sticky (/tmp: there, nobody may rename another user's entry).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class StateDirError(RuntimeError):
    """The state directory cannot be created, written or trusted."""


def ensure_private_dir(path: Path, create: bool) -> bool:
    """Check (and with ``create``, make) a directory only this user can write; False if it does not exist.

    Raises StateDirError naming the path and the fix.
    """
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        if not create:
            return False
        _check_parents(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            os.mkdir(path, 0o700)
        except OSError as err:
            raise StateDirError(f"cannot create the state directory {path}: {err.strerror} (not root? "
                                "--state-dir moves it); nothing was changed") from err
        info = os.lstat(path)
    except OSError as err:
        raise StateDirError(f"cannot use the state directory {path}: {err.strerror}") from err
    _check(path, info)
    _check_parents(path)
    return True


def _check_parents(path: Path) -> None:
    real = Path(os.path.realpath(path.parent))
    for parent in (real, *real.parents):
        try:
            info = os.stat(parent)
        except FileNotFoundError:
            continue  # created below, by this user, 0755 at most
        if info.st_uid not in (0, os.geteuid()):
            raise StateDirError(f"{parent}, a parent of the state directory {path}, is owned by uid {info.st_uid}: "
                                "its owner could put another state directory in its place (fix: --state-dir a "
                                "directory whose parents are root's)")
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
            raise StateDirError(f"{parent}, a parent of the state directory {path}, is writable by group or others "
                                f"(mode {stat.S_IMODE(info.st_mode):o}): they could put another state directory in "
                                f"its place (fix: chmod go-w {parent}, or --state-dir elsewhere)")


def _check(path: Path, info: os.stat_result) -> None:
    if stat.S_ISLNK(info.st_mode):
        raise StateDirError(f"{path} is a symbolic link: tuned-rl does not follow links in its state directory "
                            f"(fix: rm {path}, or --state-dir a real directory)")
    if not stat.S_ISDIR(info.st_mode):
        raise StateDirError(f"{path} is not a directory (fix: move it away)")
    if info.st_uid != os.geteuid():
        raise StateDirError(f"{path} is owned by uid {info.st_uid}, not by uid {os.geteuid()} running tuned-rl: "
                            f"whoever owns it could plant undo records (fix: chown {os.geteuid()} {path} "
                            f"&& chmod 700 {path}, after checking its contents)")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise StateDirError(f"{path} is writable by group or others (mode {stat.S_IMODE(info.st_mode):o}): they "
                            f"could plant undo records (fix: chmod 700 {path}, after checking its contents)")
