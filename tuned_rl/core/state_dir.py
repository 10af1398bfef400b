"""The state directory is root's alone: created 0700, refused if someone else could write it or it is a link.

Whoever can write the state directory could plant undo records that a root
rollback would replay, or links that a root apply would write through. So it
must be a real directory (not a symbolic link), owned by the user running
tuned-rl (root), and writable by nobody else; the same holds for the folders
in it. Files in it are opened with O_NOFOLLOW (journal.py, lock.py).
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
    return True


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
