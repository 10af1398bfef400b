"""Process events from the kernel's netlink process connector: fork, exec, comm and uid changes, exit.

Why the connector, through a socket of our own rather than pyroute2's ``ProcEventSocket``: the
connector is in every Debian kernel (CONFIG_PROC_EVENTS), needs no BPF program or its
verification, and reports every exec, fork and name change with the pid at once. pyroute2's
class exists only from 0.7.3 on, and Debian 12 ships python3-pyroute2 0.7.2: tuned-rl installed
from the .deb would have no events. The protocol is four structs (linux/connector.h,
linux/cn_proc.h), so this module speaks it with ``socket`` and ``struct``.

An event the kernel could not queue is lost: the socket's receive buffer overflowed and the next
read fails with ENOBUFS. That is counted, and the caller rescans /proc (watcher.py), so a lost
event delays a process's placement, never skips it.
"""

from __future__ import annotations

import errno
import os
import select
import socket
import struct
import time
from dataclasses import dataclass

NETLINK_CONNECTOR = 11
CN_IDX_PROC = 1
CN_VAL_PROC = 1
PROC_CN_MCAST_LISTEN = 1
PROC_CN_MCAST_IGNORE = 2
NLMSG_DONE = 3

FORK, EXEC, UID, GID, SID, PTRACE, COMM, COREDUMP, EXIT = (
    0x1, 0x2, 0x4, 0x40, 0x80, 0x100, 0x200, 0x40000000, 0x80000000)
NAMES = {FORK: "fork", EXEC: "exec", UID: "uid", GID: "gid", SID: "sid", PTRACE: "ptrace", COMM: "comm",
         COREDUMP: "coredump", EXIT: "exit"}

WANTED = FORK | EXEC | UID | COMM  # what watch reads (watcher.KINDS_THAT_MATTER)
_NLMSGHDR = struct.Struct("=IHHII")     # len, type, flags, seq, pid
_CN_MSG = struct.Struct("=IIIIHH")      # idx, val, seq, ack, len, flags
_PROC_EVENT = struct.Struct("=IIQ")     # what, cpu, timestamp_ns (aligned: 16 bytes)
_TWO_PIDS = struct.Struct("=II")        # exec, comm, exit, uid: process_pid, process_tgid first
_FORK = struct.Struct("=IIII")          # parent_pid, parent_tgid, child_pid, child_tgid
RECEIVE_BUFFER = 4 << 20                # bytes: room for a storm of starts between two reads
LINGER_S = 0.003                        # after the first event, wait this long for those that follow
# At most this many events a read: each costs this process a recv and a parse (~7 µs), and another
# user's rename loop makes hundreds of thousands a second (it cost watch a whole CPU). Past the
# caller's pace the socket overflows, the kernel drops the rest, and a rescan answers (watcher.py).
READ_LIMIT = 500


class ProcEventsError(OSError):
    """The process connector cannot be used here (not root, or a kernel without it)."""


@dataclass(frozen=True)
class ProcEvent:
    """One event: ``kind`` ("fork", "exec", "comm", "uid", "exit", ...), the thread and process it
    is about (for a fork: the child), and the parent's for a fork."""

    kind: str
    pid: int
    tgid: int
    timestamp_ns: int
    parent_tgid: int = 0
    comm: str = ""


def parse(data: bytes) -> list[ProcEvent]:
    """The proc events in one datagram of netlink messages (others are skipped)."""
    events, offset = [], 0
    while offset + _NLMSGHDR.size <= len(data):
        length, kind, _, _, _ = _NLMSGHDR.unpack_from(data, offset)
        if length < _NLMSGHDR.size or offset + length > len(data):
            break
        body = offset + _NLMSGHDR.size
        offset += (length + 3) & ~3
        if kind != NLMSG_DONE or length < _NLMSGHDR.size + _CN_MSG.size + _PROC_EVENT.size:
            continue
        idx, val, _, _, _, _ = _CN_MSG.unpack_from(data, body)
        if (idx, val) != (CN_IDX_PROC, CN_VAL_PROC):
            continue
        event = body + _CN_MSG.size
        what, _, timestamp = _PROC_EVENT.unpack_from(data, event)
        payload = event + _PROC_EVENT.size
        if what == FORK and payload + _FORK.size <= len(data):
            _, parent_tgid, child_pid, child_tgid = _FORK.unpack_from(data, payload)
            events.append(ProcEvent("fork", child_pid, child_tgid, timestamp, parent_tgid))
        elif what in NAMES and payload + _TWO_PIDS.size <= len(data):
            pid, tgid = _TWO_PIDS.unpack_from(data, payload)
            comm = ""
            if what == COMM:
                raw = data[payload + _TWO_PIDS.size:payload + _TWO_PIDS.size + 16]
                comm = raw.split(b"\0", 1)[0].decode(errors="replace")
            events.append(ProcEvent(NAMES[what], pid, tgid, timestamp, comm=comm))
    return events


class ProcEventSource:
    """A subscribed process-connector socket: ``read(timeout)`` returns the events waiting and
    counts the overflows (``lost``: the number of times events were dropped, each an unknown number)."""

    read_limit = READ_LIMIT

    def __init__(self):
        self.lost = 0
        try:
            self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, NETLINK_CONNECTOR)
        except OSError as err:
            raise ProcEventsError(err.errno, f"no netlink process connector: {err.strerror}") from err
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
            self.sock.bind((0, CN_IDX_PROC))
            self.filtered = self._listen_filtered()
        except OSError as err:
            self.sock.close()
            raise ProcEventsError(err.errno, f"cannot subscribe to process events: {err.strerror} (needs root: "
                                             "CAP_NET_ADMIN)") from err

    def fileno(self) -> int:
        return self.sock.fileno()

    def read(self, timeout: float) -> list[ProcEvent]:
        """The events queued now (at most about ``read_limit``), waiting up to ``timeout`` seconds for the first."""
        events = []
        ready, _, _ = select.select([self.sock], [], [], timeout)
        if ready:
            time.sleep(LINGER_S)  # a fork's exec follows within moments: read both, act once
        while ready and len(events) < self.read_limit:
            try:
                data = self.sock.recv(65536, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            except OSError as err:
                if err.errno == errno.ENOBUFS:  # the kernel dropped events: the caller rescans
                    self.lost += 1
                    continue
                raise
            events += parse(data)
        return events

    def close(self) -> None:
        try:
            self._control(PROC_CN_MCAST_IGNORE)
        except OSError:
            pass
        self.sock.close()

    def __enter__(self) -> "ProcEventSource":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _listen_filtered(self) -> bool:
        """Subscribe to the events watch reads only (fork, exec, uid, comm: not exit, gid, sid, ptrace,
        coredump), which Linux 6.6 filters in the kernel (struct proc_input's event_type), so that a
        fork storm queues half as many; an older kernel takes no such request, and then every event
        is subscribed to. Whether the filter took is checked with a fork of our own."""
        self._control(PROC_CN_MCAST_LISTEN, WANTED)
        child = os.fork()
        if child == 0:
            os._exit(0)
        os.waitpid(child, 0)
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            if not select.select([self.sock], [], [], max(0.0, deadline - time.monotonic()))[0]:
                break
            try:
                if any(e.kind == "fork" and e.tgid == child for e in parse(self.sock.recv(65536, socket.MSG_DONTWAIT))):
                    return True
            except BlockingIOError:
                continue
        self._control(PROC_CN_MCAST_LISTEN)
        return False

    def _control(self, operation: int, events: int | None = None) -> None:
        payload = struct.pack("=I", operation) if events is None else struct.pack("=II", operation, events)
        message = _CN_MSG.pack(CN_IDX_PROC, CN_VAL_PROC, 0, 0, len(payload), 0) + payload
        header = _NLMSGHDR.pack(_NLMSGHDR.size + len(message), NLMSG_DONE, 0, 0, os.getpid())
        self.sock.send(header + message)
