"""The tracefs probe: the same sched events from a private trace instance, paired in user space."""

from __future__ import annotations

import bisect
import os
import re
import time
from typing import Iterable


from tuned_rl.host import Host
from tuned_rl.measure.tuned_rl_processes import runs_tuned_rl_as_root
from tuned_rl.measure.probes.base import LatencyProbe, Obstacle, ProbeError, Waits, read_available, to_waits

TRACING = "/sys/kernel/tracing"
EVENTS = ("sched_wakeup", "sched_wakeup_new", "sched_switch", "sched_process_fork")
# A kernel filter longer than this is refused; beyond it, filter in user space.
MAX_FILTER_TIDS = 64
REORDER_S = 0.05

INSTANCE = re.compile(r"^tuned-rl-(\d+)$")

# A trace_pipe line, parsed by its fixed layout, never by searching it: every comm in it (the
# task's, prev_comm, next_comm, comm, child_comm) is text a user chose, up to TASK_COMM_LEN - 1
# (15) bytes, and may hold spaces, "=", ": sched_" or " ==> ". The header is
# "<comm>-<pid> [<cpu>] <flags> <seconds>: <event>: " (a "(<tgid>)" column with record-tgid);
# the comm there is at most 16 characters, and no longer candidate can be followed by
# "-<digits> [". Each event's fields are matched whole, anchored at both ends, with each comm
# bounded: a name such as "x prev_state=R" or " 1.1: sched_q: " cannot fit a second parse.
_COMM = r".{0,16}"
_HEADER = re.compile(rf"^\s*{_COMM}-\d+\s+(?:\(\s*[\d-]+\)\s+)?\[\d+\]\s+(?:\S+\s+)?(\d+\.\d+): (\w+): (.*)$", re.S)
_WAKEUP = re.compile(rf"^comm=(?P<comm>{_COMM}) pid=(?P<pid>\d+) prio=(?P<prio>-?\d+)(?: success=\d+)?"
                     rf" target_cpu=(?P<target_cpu>\d+)$", re.S)
_FIELDS = {
    "sched_switch": re.compile(
        rf"^prev_comm=(?P<prev_comm>{_COMM}) prev_pid=(?P<prev_pid>\d+) prev_prio=(?P<prev_prio>-?\d+) "
        rf"prev_state=(?P<prev_state>\S+) ==> next_comm=(?P<next_comm>{_COMM}) next_pid=(?P<next_pid>\d+) "
        rf"next_prio=(?P<next_prio>-?\d+)$", re.S),
    "sched_wakeup": _WAKEUP,
    "sched_wakeup_new": _WAKEUP,
    "sched_process_fork": re.compile(
        rf"^comm=(?P<comm>{_COMM}) pid=(?P<pid>\d+) child_comm=(?P<child_comm>{_COMM}) "
        rf"child_pid=(?P<child_pid>\d+)$", re.S),
}


class TracefsProbe(LatencyProbe):
    """Reads ``trace_pipe`` of ``instances/tuned-rl-<pid>``, filtered in the kernel by thread id.

    Timestamps are printed in microseconds, so latencies have 1 µs resolution.
    Lost events are the ring buffer's overruns and dropped events (``per_cpu/cpu*/stats``)
    plus wakeups whose switch onto a CPU never reached the buffer: on this VM's
    kernel, tracefs does not record sched_switch away from the idle task on CPU 1
    (the BPF probe sees those switches), so there a canary on CPU 1 is mostly lost
    events, and says so.
    """

    name = "tracefs"
    follows_forks = True

    def __init__(self, host: Host | None = None, buffer_kb: int = 4096):
        self.host = host or Host()
        self.buffer_kb = buffer_kb
        self.instance = f"{TRACING}/instances/tuned-rl-{os.getpid()}"
        self._fd: int | None = None
        self._watched: set[int] = set()
        self._runnable_since: dict[int, float] = {}
        self._partial = b""
        self._pending: list[tuple[float, str, dict]] = []
        self._unpaired = 0
        self._lost_at_stop = 0

    @classmethod
    def obstacles(cls, host: Host, canary: bool) -> list[Obstacle]:
        if not host.exists(f"{TRACING}/events/sched/sched_switch"):
            return [Obstacle("tracefs is not mounted", "mount -t tracefs nodev /sys/kernel/tracing")]
        if os.geteuid() != 0:
            return [Obstacle("not root: tracefs instances need root", "run tuned-rl as root")]
        return []

    def start(self, tids: Iterable[int]) -> None:
        try:
            os.mkdir(self.host.path(self.instance))
            self._write("trace_clock", "mono")
            self._write("buffer_size_kb", str(self.buffer_kb))
            self._watched = set(tids)
            self._set_filters()
            for event in EVENTS:
                self._write(f"events/sched/{event}/enable", "1")
            self._fd = os.open(self.host.path(f"{self.instance}/trace_pipe"), os.O_RDONLY | os.O_NONBLOCK)
        except OSError as err:
            self.stop()
            raise ProbeError(f"cannot set up {self.instance}: {err.strerror}") from err

    def watch(self, tids: Iterable[int]) -> None:
        new = set(tids) - self._watched
        if new:
            self._watched |= new
            self._set_filters()

    def drain(self) -> Waits:
        # trace_pipe merges the per-CPU buffers by timestamp, but only among events
        # already committed: a wakeup on one CPU can come out after the switch it
        # caused on another. Hold events back for REORDER_S and pair them in
        # timestamp order (trace_clock "mono" is time.monotonic()'s clock).
        self._pending += [event for line in self._read_lines() if (event := _parse(line))]
        self._pending.sort(key=lambda event: event[0])
        horizon = time.monotonic() - REORDER_S
        ready = bisect.bisect_right([event[0] for event in self._pending], horizon)  # (no key= before 3.10)
        tids, latencies, starts = [], [], []
        for event in self._pending[:ready]:
            self._handle(event, tids, latencies, starts)
        del self._pending[:ready]
        return to_waits(tids, latencies, starts)

    @property
    def lost(self) -> int:
        if self._fd is None:
            return self._lost_at_stop
        total = self._unpaired
        for stats in self.host.path(f"{self.instance}/per_cpu").glob("cpu*/stats"):
            fields = dict(line.split(":", 1) for line in stats.read_text().splitlines() if ":" in line)
            total += int(fields.get("overrun", "0")) + int(fields.get("dropped events", "0"))
        return total

    def stop(self) -> None:
        if not self.host.path(self.instance).exists():
            return
        if self._fd is not None:
            self._lost_at_stop = self.lost
            os.close(self._fd)
            self._fd = None
        _remove_instance(self.host, self.instance)

    # -- internals -------------------------------------------------------------

    def _set_filters(self) -> None:
        if not self._watched:
            filters = dict.fromkeys(EVENTS, "common_pid < 0")  # nothing yet
        elif len(self._watched) > MAX_FILTER_TIDS:
            filters = dict.fromkeys(EVENTS, "0")  # "0" clears a filter: everything, filtered below
        else:
            either = lambda field: " || ".join(f"{field} == {t}" for t in sorted(self._watched))  # noqa: E731
            filters = {"sched_wakeup": either("pid"), "sched_wakeup_new": either("pid"),
                       "sched_switch": f"{either('prev_pid')} || {either('next_pid')}",
                       "sched_process_fork": either("parent_pid")}
        for event, text in filters.items():
            self._write(f"events/sched/{event}/filter", text)

    def _read_lines(self) -> list[bytes]:
        data = self._partial + read_available(self._fd)
        lines = data.split(b"\n")
        self._partial = lines.pop()
        return lines

    def _handle(self, event: tuple[float, str, dict], tids: list[int], latencies: list[int],
                starts: list[int]) -> None:
        timestamp, name, fields = event
        if name in ("sched_wakeup", "sched_wakeup_new"):
            self._mark(int(fields["pid"]), timestamp)
        elif name == "sched_process_fork":
            if int(fields["pid"]) in self._watched:
                self.watch([int(fields["child_pid"])])
        elif name == "sched_switch":
            prev = int(fields["prev_pid"])
            if self._runnable_since.pop(prev, None) is not None:
                self._unpaired += 1  # it ran, but the switch that put it on a CPU never reached us
            if fields["prev_state"].startswith("R"):  # preempted: runnable again at once
                self._mark(prev, timestamp)
            tid = int(fields["next_pid"])
            since = self._runnable_since.pop(tid, None)
            if since is not None:
                tids.append(tid)
                latencies.append(round((timestamp - since) * 1e9))
                starts.append(round(since * 1e9))  # trace_clock "mono": time.monotonic_ns()'s clock

    def _mark(self, tid: int, timestamp: float) -> None:
        if tid in self._watched and tid != 0:
            if tid in self._runnable_since:
                self._unpaired += 1  # woken twice without a switch in between that we saw
            self._runnable_since[tid] = timestamp

    def _write(self, relative: str, value: str) -> None:
        self.host.write(f"{self.instance}/{relative}", value)


def _parse(line: bytes) -> tuple[float, str, dict] | None:
    """(timestamp, event name, fields) of one trace_pipe line, or None for anything else."""
    header = _HEADER.match(line.decode(errors="replace"))
    if not header or header[2] not in _FIELDS:
        return None
    fields = _FIELDS[header[2]].match(header[3])
    if not fields:
        return None
    return float(header[1]), header[2], fields.groupdict()


def remove_leftover_instances(host: Host) -> list[str]:
    """Remove the trace instances of tuned-rl runs that were killed (their pid is gone, or is no
    tuned-rl now): left alone, they would record sched events for good. Returns their paths."""
    try:
        entries = sorted(host.path(f"{TRACING}/instances").iterdir())
    except OSError:
        return []  # no tracefs here, or not root: there is nothing this run could remove
    removed = []
    for entry in entries:
        match = INSTANCE.match(entry.name)
        if match is None or _is_running_tuned_rl(host, int(match.group(1))):
            continue
        instance = f"{TRACING}/instances/{entry.name}"
        try:
            _remove_instance(host, instance)
        except OSError:
            continue  # another tuned-rl removed it meanwhile
        removed.append(instance)
    return removed


def _is_running_tuned_rl(host: Host, pid: int) -> bool:
    """The instance's pid is this process, or still a tuned-rl run by root (whose instance it is)."""
    if pid == os.getpid():
        return True
    try:
        return runs_tuned_rl_as_root(host.process(pid))
    except LookupError:
        return False


def _remove_instance(host: Host, instance: str) -> None:
    for event in EVENTS:
        try:
            host.write(f"{instance}/events/sched/{event}/enable", "0")
        except OSError:
            pass
    os.rmdir(host.path(instance))
