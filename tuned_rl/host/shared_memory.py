"""POSIX shared-memory segments (files in /dev/shm, a tmpfs): a segment opened without following
links, its shared memory policy read and set, and the processes that map it.

A tmpfs file keeps a *shared* memory policy per range of its pages, on the file itself: set it
with mbind(2) on a shared mapping of the file and every process that maps the file allocates the
segment's pages by it, and ``/proc/PID/numa_maps`` shows it for each mapping ("bind:0"). With
``MPOL_MF_MOVE_ALL`` (CAP_SYS_NICE) mbind also moves the pages already there, mapped by any process,
but only those present in the calling process's own mapping (mm/mempolicy.c do_mbind and
queue_pages_range; mm/shmem.c shmem_set_policy): ``set_policy`` first maps each resident page
(mincore(2), then a read of one byte of each), never a hole. The policy stays on the file after our
mapping is gone, until the file is removed or the host reboots (/dev/shm does not survive it).

A segment's name is text another user chose, so the file is opened with ``O_NOFOLLOW`` below the
root-owned /dev/shm, must be a regular file on that same file system, and is identified by its
inode number: a write checks that the file is still the one planned.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import re
import stat
from dataclasses import dataclass

from tuned_rl.host.cpus import format_cpu_list, parse_cpu_list
from tuned_rl.host.tasks import TaskGone
from tuned_rl.host.numa import node_mask
from tuned_rl.host.syscalls import _libc, syscall

SHM_DIRECTORY = "/dev/shm"
# A segment's name as shm_open(3) makes it: no "/" (one file right in /dev/shm), no space or control
# character; tuned-rl names nothing else.
SEGMENT_NAME = re.compile(r"^[A-Za-z0-9_.@:+,=\-]{1,255}$")

# include/uapi/linux/mempolicy.h; the names as /proc/PID/numa_maps prints them (mm/mempolicy.c policy_modes).
MPOL_DEFAULT, MPOL_PREFERRED, MPOL_BIND, MPOL_INTERLEAVE, MPOL_LOCAL, MPOL_PREFERRED_MANY = range(6)
MPOL_WEIGHTED_INTERLEAVE = 6
MODE_NAMES = {MPOL_DEFAULT: "default", MPOL_PREFERRED: "prefer", MPOL_BIND: "bind", MPOL_INTERLEAVE: "interleave",
              MPOL_LOCAL: "local", MPOL_PREFERRED_MANY: "prefer (many)", MPOL_WEIGHTED_INTERLEAVE: "weighted interleave"}
MODE_NUMBERS = {name: number for number, name in MODE_NAMES.items()}
MPOL_MODE_FLAGS = (1 << 15) | (1 << 14) | (1 << 13)  # MPOL_F_STATIC_NODES, MPOL_F_RELATIVE_NODES, MPOL_F_NUMA_BALANCING
MPOL_F_ADDR = 1 << 1      # get_mempolicy: the policy at an address
MPOL_MF_MOVE_ALL = 1 << 2  # mbind: move every page, whoever maps it
MASK_WORDS = 16            # 1,024 nodes: the kernel refuses a smaller mask than its node count
SAMPLES = 16               # offsets across the segment whose policies must agree

_MAP_FAILED = ctypes.c_void_p(-1).value
PROT_READ, MAP_SHARED = 0x1, 0x01


class SegmentError(OSError):
    """A segment tuned-rl will not touch, with why."""


class SegmentGone(TaskGone):
    """The segment was removed, or its name now belongs to another file: nothing of it to restore."""


@dataclass(frozen=True)
class SegmentPolicy:
    """A segment's shared memory policy ("default", "bind:0", "interleave:0-1"), its inode and size."""

    policy: str
    inode: int
    size: int
    owner: int = 0  # the file's owner (uid): another user's segment is bound only when the profile says so


def format_policy(mode: int, nodes: set[int]) -> str:
    """A policy as numa_maps prints it: "default", "local", "bind:0-1", "prefer:1"."""
    name = MODE_NAMES.get(mode, str(mode))
    return name if mode in (MPOL_DEFAULT, MPOL_LOCAL) or not nodes else f"{name}:{format_cpu_list(nodes)}"


def parse_policy(text: str) -> tuple[int, set[int]]:
    """The mode and nodes of a policy ``format_policy`` wrote; ValueError for anything else."""
    name, _, nodes = text.partition(":")
    if name not in MODE_NUMBERS:
        raise ValueError(f"unknown memory policy {text!r}")
    mode = MODE_NUMBERS[name]
    parsed = parse_cpu_list(nodes) if nodes else set()
    if (mode in (MPOL_DEFAULT, MPOL_LOCAL)) != (not parsed):
        raise ValueError(f"memory policy {text!r}: {name} takes {'no' if parsed else 'a list of'} nodes")
    return mode, parsed


def segment_path(name_or_path: str) -> str:
    """``/dev/shm/NAME`` for a segment name tuned-rl may touch; SegmentError otherwise."""
    name = name_or_path[len(SHM_DIRECTORY) + 1:] if name_or_path.startswith(SHM_DIRECTORY + "/") else ""
    if not SEGMENT_NAME.match(name) or name in (".", ".."):
        raise SegmentError(errno.EINVAL, f"{name_or_path!r} is not a segment file right in {SHM_DIRECTORY}")
    return f"{SHM_DIRECTORY}/{name}"


class _Mapping:
    """The segment opened without following links and mapped shared, read-only, for its policy."""

    def __init__(self, path: str, inode: int | None = None):
        path = segment_path(path)
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
        except FileNotFoundError as err:
            raise SegmentGone(f"{path} was removed") from err
        self.address = None
        try:
            info = os.fstat(self.fd)
            if not stat.S_ISREG(info.st_mode) or info.st_dev != os.stat(SHM_DIRECTORY).st_dev:
                raise SegmentError(errno.EINVAL, f"{path} is not a regular file of the {SHM_DIRECTORY} file system")
            if inode is not None and info.st_ino != inode:
                raise SegmentGone(f"{path} is another file now (inode {info.st_ino}, tuned-rl's was {inode})")
            self.inode, self.size, self.owner = info.st_ino, info.st_size, info.st_uid
            self.length = -(-max(self.size, 1) // os.sysconf("SC_PAGE_SIZE")) * os.sysconf("SC_PAGE_SIZE")
            if self.size:
                address = _mapping_calls().mmap(None, self.length, PROT_READ, MAP_SHARED, self.fd, 0)
                if address in (None, _MAP_FAILED):
                    code = ctypes.get_errno()
                    raise OSError(code, f"mmap {path}: {os.strerror(code)}")
                self.address = address
        except BaseException:
            self.close()
            raise

    def policy_at(self, offset: int) -> str:
        mode = (ctypes.c_int * 1)()
        mask, maxnode = node_mask([0], MASK_WORDS)
        syscall("get_mempolicy", mode, mask, maxnode, self.address + offset, MPOL_F_ADDR)
        bits = 8 * ctypes.sizeof(ctypes.c_ulong)
        nodes = {word * bits + bit for word in range(MASK_WORDS) for bit in range(bits) if mask[word] >> bit & 1}
        return format_policy(mode[0] & ~MPOL_MODE_FLAGS, nodes)

    def close(self) -> None:
        if self.address is not None:
            _mapping_calls().munmap(ctypes.c_void_p(self.address), self.length)
            self.address = None
        os.close(self.fd)


@functools.lru_cache(maxsize=None)
def _mapping_calls():
    """The C library with mmap(2) and munmap(2) declared (their pointers and sizes are not ints)."""
    libc = _libc()
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
    return libc


def read_policy(path: str) -> SegmentPolicy:
    """The segment's shared policy, the same at ``SAMPLES`` offsets across it (SegmentError if not:
    one policy per segment is what tuned-rl records and restores). An empty segment reads "default"."""
    mapping = _Mapping(path)
    try:
        if mapping.address is None:
            return SegmentPolicy("default", mapping.inode, 0, mapping.owner)
        page = os.sysconf("SC_PAGE_SIZE")
        pages = mapping.length // page
        offsets = sorted({page * (i * (pages - 1) // (SAMPLES - 1)) for i in range(SAMPLES)})
        policies = {mapping.policy_at(offset) for offset in offsets}
        if len(policies) > 1:
            raise SegmentError(errno.EINVAL, f"{path} has more than one memory policy over its pages "
                                             f"({', '.join(sorted(policies))}); tuned-rl keeps one per segment")
        return SegmentPolicy(policies.pop(), mapping.inode, mapping.size, mapping.owner)
    finally:
        mapping.close()


def set_policy(path: str, policy: str, inode: int) -> None:
    """Give the whole segment (the file ``inode``, as planned) ``policy``; a bind moves its pages too."""
    mode, nodes = parse_policy(policy)
    mapping = _Mapping(path, inode)
    try:
        if mapping.address is None:
            return  # an empty file has no pages to hold a policy
        if mode == MPOL_DEFAULT:
            # mbind leaves a range alone whose mapping's own policy already equals the new one, and
            # a fresh mapping's is the default: give it another first, so that the default then
            # replaces the file's policy (mm/mempolicy.c mbind_range).
            syscall("mbind", mapping.address, mapping.length, MPOL_LOCAL, None, 0, 0)
        mask, maxnode = node_mask(nodes, MASK_WORDS) if nodes else (None, 0)
        flags = MPOL_MF_MOVE_ALL if mode == MPOL_BIND else 0
        if mode == MPOL_BIND:
            map_resident_pages(mapping)
        syscall("mbind", mapping.address, mapping.length, mode, mask, maxnode, flags)
    finally:
        mapping.close()


def resident_page_indexes(mapping: "_Mapping") -> list[int]:
    """The pages of the segment in memory now (mincore(2) on a file mapping reports the file's page
    cache, whether or not this mapping has touched them): the ones a bind has to move."""
    page = os.sysconf("SC_PAGE_SIZE")
    vector = (ctypes.c_ubyte * (mapping.length // page))()
    if _mapping_calls().mincore(ctypes.c_void_p(mapping.address), mapping.length, vector) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"mincore: {os.strerror(code)}")
    return [index for index, byte in enumerate(vector) if byte & 1]


def map_resident_pages(mapping: "_Mapping") -> int:
    """Read one byte of each resident page through tuned-rl's mapping, so that it is mapped here:
    mbind(MPOL_MF_MOVE_ALL) queues for migration only the pages present in the calling process's
    own mapping (mm/mempolicy.c queue_pages_range), and a fresh mapping has none, so the pages
    already there stayed where they were while the plan said they moved. Holes are not touched (a
    read there would allocate a page). Returns how many pages it mapped."""
    page = os.sysconf("SC_PAGE_SIZE")
    indexes = resident_page_indexes(mapping)
    for index in indexes:
        ctypes.string_at(mapping.address + index * page, 1)
    return len(indexes)


def mapped_segments(host, pids=None) -> dict[str, list[int]]:
    """The segments in /dev/shm that processes (of ``pids``, or all) map, each with its processes'
    pids, from /proc/PID/maps (which escapes a newline in a name, so a name read here is one line)."""
    found: dict[str, list[int]] = {}
    prefix = " " + SHM_DIRECTORY + "/"
    for pid in (host.pids() if pids is None else pids):
        try:
            text = host.read_proc(f"{pid}/maps")
        except OSError:
            continue
        for path in {line[line.index(prefix) + 1:] for line in text.splitlines() if prefix in line}:
            found.setdefault(path, []).append(pid)
    return found


def resident_pages(host, path: str, pids) -> dict[int, int]:
    """The segment's pages per node as the mapping process that maps most of them counts them
    (numa_maps counts the pages a process has mapped: each mapping sees its own share)."""
    best: dict[int, int] = {}
    field = "file=" + path
    for pid in pids:
        try:
            text = host.read_proc(f"{pid}/numa_maps")
        except OSError:
            continue
        pages: dict[int, int] = {}
        for line in text.splitlines():
            fields = line.split()
            if field not in fields:
                continue
            for item in fields[2:]:
                node, _, count = item[1:].partition("=")
                if item.startswith("N") and node.isdigit() and count.isdigit():
                    pages[int(node)] = pages.get(int(node), 0) + int(count)
        if sum(pages.values()) > sum(best.values()):
            best = pages
    return best

