"""Where tuned-rl may write: the kernel's tuning files, the cgroup mounts, and the few configuration
files its plugins manage. A planned change or a journal record naming anything else is refused."""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from tuned_rl.host.shared_memory import SEGMENT_NAME, SHM_DIRECTORY

KERNEL_FILES = ("/proc/sys/", "/proc/irq/", "/sys/")
# systemd drop-ins (a directory "<unit>.d" and the .conf files in it), and irqbalance's settings.
CONFIG_FILE = re.compile(r"^/(etc|run)/systemd/system/[A-Za-z0-9@_.:\-]+\.d(/[A-Za-z0-9_.\-]+\.conf)?$"
                         r"|^/etc/default/irqbalance$|^/etc/sysconfig/irqbalance$")



def refusal(path: str, cgroup_mounts: list[str]) -> str | None:
    """Why tuned-rl must not write ``path`` (None if it may)."""
    pure = PurePosixPath(path)
    if not pure.is_absolute() or ".." in pure.parts:
        return f"{path!r} is not an absolute path without '..'"
    if path.startswith(KERNEL_FILES) or CONFIG_FILE.match(path):
        return None
    if path.startswith(SHM_DIRECTORY + "/") and SEGMENT_NAME.match(path[len(SHM_DIRECTORY) + 1:]):
        return None  # a shared-memory segment, whose memory policy [numa] sets (the file is never written)
    if any(path == m or path.startswith(m.rstrip("/") + "/") for m in cgroup_mounts):
        return None
    return (f"{path} is outside the places tuned-rl writes (/proc/sys, /proc/irq, /sys, the cgroup mounts, "
            "systemd drop-ins, irqbalance's settings, a /dev/shm segment's memory policy)")
