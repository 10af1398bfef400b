"""What differs between the live host and a tree standing in for it, chosen once when a Host is
made (:func:`root_for`): the Host and everything built on it ask their root, never whether it is live.

On the live host ("/"), /proc is this kernel's: its hot reads go through bare file descriptors,
a task is pinned by a pidfd while it is changed, commands and systemd calls run, accounts come
from NSS and interfaces from netlink. Below a moved root (a test tree) every read goes through
the Host's ``path()`` (which a stand-in host may map), no link in the tree is followed on a write,
nothing acts on the machine, and no pid is a task of this kernel.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from tuned_rl.host.tasks import Task, open_pidfd, read_once, read_small

if TYPE_CHECKING:
    from tuned_rl.host.host import Host


class LiveRoot:
    """The machine itself."""

    moved_to: Path | None = None  # where a moved root is: none

    def write_path(self, host: Host, target: str) -> Path:
        return host.path(target)

    def read_proc(self, host: Host, relative: str, limit: int) -> bytes:
        return read_small(f"/proc/{relative}", limit)

    def read_prefix(self, host: Host, target: str, limit: int) -> bytes:
        return read_small(_bare(host, target), limit)

    def read_once(self, host: Host, target: str, limit: int) -> bytes:
        return read_once(_bare(host, target), limit)

    def refuse_commands(self, what: str) -> None:
        """Commands and systemd calls run here."""

    def network_devices(self, host: Host) -> list[str]:
        from pyroute2 import IPRoute  # netlink answers for this kernel
        with IPRoute() as ipr:
            return sorted(link.get_attr("IFLA_IFNAME") for link in ipr.get_links())

    def account_name(self, uid: int) -> str | None:
        """NSS (LDAP, sssd, systemd-homed) knows accounts /etc/passwd lacks: the machine's own."""
        import pwd
        try:
            return pwd.getpwuid(uid).pw_name
        except KeyError:
            return None

    def account_id(self, name: str) -> int | None:
        import pwd
        try:
            return pwd.getpwnam(name).pw_uid
        except KeyError:
            return None

    def pin(self, task: Task) -> int | None:
        """A pidfd holding ``task`` while it is changed (None where the kernel has none)."""
        return open_pidfd(task)

    def own_pid(self) -> int | None:
        """This process's pid in the host's /proc."""
        return os.getpid()


class TreeRoot:
    """A tree below a moved root: its files only."""

    def __init__(self, root: Path):
        self.moved_to = root

    def write_path(self, host: Host, target: str) -> Path:
        """No part of a changed path may be a symbolic link, so a link planted in the tree
        (``etc -> /etc``) never turns a test's write into the real host's."""
        path = host.path(target)  # a ValueError for a path that is not host-absolute
        walked = host.root
        for part in PurePosixPath(target).parts[1:]:
            walked = walked / part
            if walked.is_symlink():
                raise OSError(f"{target}: {walked} is a symbolic link below the host root {host.root}; "
                              "tuned-rl does not follow it")
        return path

    def read_proc(self, host: Host, relative: str, limit: int) -> bytes:
        return host.read_prefix(f"/proc/{relative}", limit)  # through the host, which a stand-in may map

    def read_prefix(self, host: Host, target: str, limit: int) -> bytes:
        return read_small(str(host.path(target)), limit)

    def read_once(self, host: Host, target: str, limit: int) -> bytes:
        return host.read_prefix(target, limit)

    def refuse_commands(self, what: str) -> None:
        raise OSError(f"{what}: not run, the host root is moved to {self.moved_to}; tuned-rl runs commands and "
                      "starts or stops services only on the live host")

    def network_devices(self, host: Host) -> list[str]:
        base = host.path("/sys/class/net")  # netlink would answer for this kernel: a tree lists its own
        return sorted(p.name for p in base.iterdir()) if base.is_dir() else []

    def account_name(self, uid: int) -> str | None:
        return None  # NSS is the machine's, never a tree's

    def account_id(self, name: str) -> int | None:
        return None

    def pin(self, task: Task) -> int | None:
        return None  # a tree's pids are no task of this kernel

    def own_pid(self) -> int | None:
        return None


def _bare(host: Host, target: str) -> str:
    """A live path to open: a /proc one as it is (the hot path of reading processes: no pathlib)."""
    return target if target.startswith("/proc/") and ".." not in target else str(host.path(target))


def root_for(root: Path) -> LiveRoot | TreeRoot:
    return LiveRoot() if str(root) == "/" else TreeRoot(root)
