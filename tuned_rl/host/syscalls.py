"""System calls the standard library lacks (ioprio_get/set, set_mempolicy, migrate_pages,
mbind, get_mempolicy), through
ctypes, by number for this machine's architecture. The C library is loaded once."""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import platform

# arch/x86/entry/syscalls/syscall_64.tbl; include/uapi/asm-generic/unistd.h (aarch64); the
# powerpc and s390 tables for ioprio.
NUMBERS = {
    "x86_64": {"ioprio_set": 251, "ioprio_get": 252, "set_mempolicy": 238, "migrate_pages": 256,
               "mbind": 237, "get_mempolicy": 239},
    "aarch64": {"ioprio_set": 30, "ioprio_get": 31, "set_mempolicy": 237, "migrate_pages": 238,
                "mbind": 235, "get_mempolicy": 236},
    "ppc64le": {"ioprio_set": 273, "ioprio_get": 274},
    "s390x": {"ioprio_set": 282, "ioprio_get": 283},
}


@functools.lru_cache(maxsize=None)
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def syscall(name: str, *args) -> int:
    """Call ``name`` with ``args`` (ints, or ctypes arrays passed by pointer); its result, or
    OSError (ProcessLookupError for ESRCH) with the kernel's errno."""
    number = NUMBERS.get(platform.machine(), {}).get(name)
    if number is None:
        raise OSError(errno.ENOSYS, f"{name}: unknown system call number on {platform.machine()}")
    result = _libc().syscall(number, *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    if result < 0:
        code = ctypes.get_errno()
        if code == errno.ESRCH:
            raise ProcessLookupError(code, os.strerror(code))
        raise OSError(code, f"{name}: {os.strerror(code)}")
    return result
