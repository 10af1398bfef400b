"""The eBPF probe (BCC): run-queue latency of the watched threads, filtered in the kernel."""

from __future__ import annotations

import ctypes
import os
import platform
from typing import Iterable

import numpy as np

from tuned_rl.host import Host
from tuned_rl.measure.probes.base import LatencyProbe, Obstacle, ProbeError

# Only tracepoint arguments are read: with headers that do not match the running
# kernel (this VM's case), task_struct offsets would be wrong, tracepoint
# layouts (from tracefs format files) are not.
#
# Filtering is on the *woken* task (args->pid) in sched_wakeup, not on
# `current`, which there is the waker; and on next_pid / prev_pid in
# sched_switch. A preempted task (prev_state has no sleep bit: "R" or "R+")
# is runnable again at once, so its wait until it runs again is measured too,
# as bcc's runqlat does.
PROGRAM = r"""
#define SLEEP_STATE_BITS 0xff

struct event { u32 tid; u32 pad; u64 delta_ns; };

// A one-byte-per-slot prefilter (tid mod 65536): an array lookup is inlined, a
// hash lookup is a helper call, and nearly every switch on a busy machine is
// not the target's. Slots are only ever set, so a stale slot costs a hash lookup.
BPF_ARRAY(maybe, u8, 65536);
BPF_HASH(targets, u32, u8, MAX_THREADS);
BPF_HASH(start, u32, u64, MAX_THREADS);
BPF_RINGBUF_OUTPUT(events, RING_PAGES);
BPF_PERCPU_ARRAY(lost, u64, 1);

static void count_lost(void) {
    int zero = 0;
    u64 *count = lost.lookup(&zero);
    if (count)
        (*count)++;
}

static bool may_be_target(u32 tid) {
    int slot = tid & 0xffff;
    u8 *set = maybe.lookup(&slot);
    return set && *set;
}

static void mark_runnable(u32 tid) {
    if (tid == 0 || !may_be_target(tid) || !targets.lookup(&tid))
        return;
    u64 now = bpf_ktime_get_ns();
    if (start.update(&tid, &now))
        count_lost();
}

TRACEPOINT_PROBE(sched, sched_wakeup) { mark_runnable(args->pid); return 0; }
TRACEPOINT_PROBE(sched, sched_wakeup_new) { mark_runnable(args->pid); return 0; }

TRACEPOINT_PROBE(sched, sched_switch) {
    u32 prev = args->prev_pid;
    if ((args->prev_state & SLEEP_STATE_BITS) == 0) {
        mark_runnable(prev);
    } else if (may_be_target(prev)) {
        // Going to sleep: it was running, so a start left over is stale (a wakeup that
        // found it still on a CPU). Dropping it keeps a missed wakeup from being timed
        // from that stale start.
        start.delete(&prev);
    }
    u32 tid = args->next_pid;
    if (tid == 0 || !may_be_target(tid))
        return 0;
    u64 *since = start.lookup(&tid);
    if (!since)
        return 0;
    u64 delta = bpf_ktime_get_ns() - *since;
    start.delete(&tid);
    struct event *e = events.ringbuf_reserve(sizeof(struct event));
    if (!e) {
        count_lost();
        return 0;
    }
    e->tid = tid;
    e->pad = 0;
    e->delta_ns = delta;
    events.ringbuf_submit(e, 0);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_fork) {
    u32 parent = args->parent_pid;
    if (!may_be_target(parent) || !targets.lookup(&parent))
        return 0;
    u32 child = args->child_pid;
    u8 yes = 1;
    int slot = child & 0xffff;
    maybe.update(&slot, &yes);
    if (targets.update(&child, &yes))
        count_lost();
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exit) {
    u32 tid = args->pid;
    targets.delete(&tid);
    start.delete(&tid);
    return 0;
}
"""


class _Event(ctypes.Structure):
    _fields_ = [("tid", ctypes.c_uint32), ("pad", ctypes.c_uint32), ("delta_ns", ctypes.c_uint64)]


class BpfProbe(LatencyProbe):
    """Per-event values through a BPF ring buffer; lost events counted in the kernel."""

    name = "bpf"
    follows_forks = True

    def __init__(self, max_threads: int = 16384, ring_pages: int = 256):
        self.max_threads, self.ring_pages = max_threads, ring_pages
        self._bpf = None
        self._watched: set[int] = set()
        self._tids: list[int] = []
        self._latencies: list[int] = []

    @classmethod
    def obstacles(cls, host: Host, canary: bool) -> list[Obstacle]:
        found = []
        if os.geteuid() != 0:
            found.append(Obstacle("not root: loading BPF programs needs CAP_BPF and CAP_PERFMON",
                                  "run tuned-rl as root"))
        try:
            import bcc  # noqa: F401
        except ImportError:
            found.append(Obstacle("the BCC Python bindings are not importable",
                                  "apt-get install python3-bpfcc, and use a venv made with "
                                  "/usr/bin/python3 -m venv --system-site-packages (PyPI's 'bcc' is another package)"))
        release = platform.release()
        if not host.exists(f"/lib/modules/{release}/build/include"):
            found.append(Obstacle(f"no kernel headers at /lib/modules/{release}/build: BCC compiles against them",
                                  f"apt-get install linux-headers-{release} (or linux-headers-amd64 and link "
                                  f"/lib/modules/{release}/build to it: tools/setup.sh does)"))
        if not host.exists("/sys/kernel/tracing/events/sched/sched_switch"):
            found.append(Obstacle("tracefs is not mounted: tracepoints cannot be attached",
                                  "mount -t tracefs nodev /sys/kernel/tracing"))
        return found

    def start(self, tids: Iterable[int]) -> None:
        from bcc import BPF  # imported here: the other probes must work without BCC

        try:
            self._bpf = BPF(text=PROGRAM.encode(), cflags=[f"-DMAX_THREADS={self.max_threads}",
                                                  f"-DRING_PAGES={self.ring_pages}", "-w"])
        except Exception as err:  # BCC raises bare Exception on compile or load failure
            raise ProbeError(f"BPF program failed to load: {err}") from err
        self.watch(tids)
        self._bpf[b"events"].open_ring_buffer(self._on_event)

    def watch(self, tids: Iterable[int]) -> None:
        targets, maybe = self._bpf[b"targets"], self._bpf[b"maybe"]
        new = set(tids) - self._watched
        self._watched |= new
        for tid in new:
            maybe[ctypes.c_int(tid & 0xFFFF)] = ctypes.c_uint8(1)
            targets[ctypes.c_uint32(tid)] = ctypes.c_uint8(1)

    def drain(self) -> tuple[np.ndarray, np.ndarray]:
        self._bpf.ring_buffer_consume()
        tids, latencies = self._tids, self._latencies
        self._tids, self._latencies = [], []
        return np.asarray(tids, dtype=np.int64), np.asarray(latencies, dtype=np.int64)

    @property
    def lost(self) -> int:
        if self._bpf is None:
            return 0
        return int(sum(self._bpf[b"lost"][ctypes.c_int(0)]))

    def stop(self) -> None:
        if self._bpf is not None:
            self._bpf.cleanup()
            self._bpf = None

    def _on_event(self, ctx, data, size) -> None:
        event = ctypes.cast(data, ctypes.POINTER(_Event)).contents
        self._tids.append(event.tid)
        self._latencies.append(event.delta_ns)
