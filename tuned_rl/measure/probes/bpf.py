"""The eBPF probe (BCC): run-queue latency of the watched threads, filtered in the kernel."""

from __future__ import annotations

import ctypes
import os
import platform
import struct
import time
from typing import Iterable

import numpy as np

from tuned_rl.host import Host
from tuned_rl.measure.probes.base import LatencyProbe, Obstacle, ProbeError, Waits
from tuned_rl.measure.probes.btf import BtfError, member_offset
from tuned_rl.measure.probes.granules import (GRANULE_BUCKETS, GRANULE_FIRST_BUCKET, GRANULE_NS, GRANULE_SHIFT,
                                               GRANULES, GranuleRing)

# A wait's histogram bucket: 16 per doubling of its length in ns (fine_bucket_range below).
FINE_BUCKET_C = r"""
// The index of the highest bit set (0 for 0 and 1).
static __always_inline u32 msb_of(u64 v) {
    u32 msb = 0;
    if (v >> 32) { v >>= 32; msb += 32; }
    if (v >> 16) { v >>= 16; msb += 16; }
    if (v >> 8) { v >>= 8; msb += 8; }
    if (v >> 4) { v >>= 4; msb += 4; }
    if (v >> 2) { v >>= 2; msb += 2; }
    if (v >> 1) { msb += 1; }
    return msb;
}

static __always_inline u32 fine_bucket_of(u64 ns) {
    u32 msb = msb_of(ns);
    if (msb < 4)
        return 64;
    u32 bucket = msb * 16 + (u32)((ns >> (msb - 4)) & 15);
    return bucket < FINE_BUCKETS ? bucket : FINE_BUCKETS - 1;
}
"""

# Before COMMON, when the probe sums waits in the kernel (the default): each wait's length goes to
# a histogram (16 buckets per doubling, 4.4% wide; one array element, read in one lookup) and the
# longest to a per-CPU maximum. No event crosses to user space: per-event delivery kept tuned-rl's
# own process busy in bursts the workload waited behind (docs/measuring.md, "What measuring costs the workload").
#
# Each wait is also counted by when it *began*, so that it belongs to the arm it began in: a
# ring of histograms, one per interval of 2^GRANULE_SHIFT ns (33.6 ms) of CLOCK_MONOTONIC, the
# wait's start picking its slot, and one total per slot, so user space reads only the slots that
# changed. The counts only grow (u32, read as differences modulo 2^32); a slot stands for the
# most recent interval of its number when user space reads it, which it does every quarter of a
# second, while the ring spans 17 s. A wait that began more than 15 s before it is counted could
# be taken for a later interval's: it goes to `too_old` instead (its start is then unknown).
# The bucket is counted before the slot's total: a total seen changed means its buckets are.
# (A probe that only keeps the totals, watch's, compiles the ring out: NO_GRANULES.) ALARM_NS
# also counts, per CPU, each wait of at least that long and hands it to user space.
HISTOGRAM = r"""
#define NO_EVENTS 1
#define FINE_BUCKETS 1024
// GRANULE_SHIFT, GRANULES, GRANULE_BUCKETS, GRANULE_FIRST_BUCKET come from granules.py
#define TOO_OLD_GRANULES (GRANULES - 64)
struct latency_counts { u64 counts[FINE_BUCKETS]; };
struct granule_counts { u32 counts[GRANULE_BUCKETS]; };
struct granule_totals { u32 counts[GRANULES]; };
BPF_ARRAY(latency_hist, struct latency_counts, 1);
BPF_ARRAY(granule_hist, struct granule_counts, GRANULES);
BPF_ARRAY(granule_totals, struct granule_totals, 1);
BPF_ARRAY(too_old, struct granule_counts, 1);
BPF_PERCPU_ARRAY(latency_max, u64, 1);
BPF_PERCPU_ARRAY(latency_sum, u64, 1);                 // ns of all waits (a Prometheus histogram's _sum)

#ifdef ALARM_NS
// A wait of ALARM_NS or more: counted per CPU, and handed to user space (rare by definition).
struct long_wait { u32 tid; u32 cpu; u64 delta_ns; u64 start_ns; };
BPF_PERCPU_ARRAY(over_threshold, u64, 1);
BPF_PERCPU_ARRAY(long_waits_lost, u64, 1);
BPF_RINGBUF_OUTPUT(long_waits, 8);

static __always_inline void long_wait_seen(u32 tid, u64 ns, u64 start) {
    int zero = 0;
    u64 *count = over_threshold.lookup(&zero);
    if (count)
        (*count)++;
    struct long_wait *e = long_waits.ringbuf_reserve(sizeof(struct long_wait));
    if (!e) {
        u64 *lost = long_waits_lost.lookup(&zero);
        if (lost)
            (*lost)++;
        return;
    }
    e->tid = tid;
    e->cpu = bpf_get_smp_processor_id();
    e->delta_ns = ns;
    e->start_ns = start;
    long_waits.ringbuf_submit(e, 0);
}
#endif

FINE_BUCKET_C
static __always_inline void count_by_start(u32 bucket, u64 start) {
    int zero = 0;
    u32 fine = bucket - GRANULE_FIRST_BUCKET;
    fine = fine < GRANULE_BUCKETS ? fine : GRANULE_BUCKETS - 1;
    u64 granule = start >> GRANULE_SHIFT;
    if ((bpf_ktime_get_ns() >> GRANULE_SHIFT) - granule >= TOO_OLD_GRANULES) {
        struct granule_counts *old = too_old.lookup(&zero);
        if (old)
            __sync_fetch_and_add(&old->counts[fine & (GRANULE_BUCKETS - 1)], 1);
        return;
    }
    u32 slot = (u32)granule & (GRANULES - 1);
    struct granule_counts *hist = granule_hist.lookup(&slot);
    if (hist)
        __sync_fetch_and_add(&hist->counts[fine & (GRANULE_BUCKETS - 1)], 1);
    struct granule_totals *totals = granule_totals.lookup(&zero);
    if (totals)
        __sync_fetch_and_add(&totals->counts[slot & (GRANULES - 1)], 1);
}

static __always_inline void count_wait(u32 tid, u64 ns, u64 start) {
    int zero = 0;
    u32 bucket = fine_bucket_of(ns) & (FINE_BUCKETS - 1);
    struct latency_counts *hist = latency_hist.lookup(&zero);
    if (hist)
        __sync_fetch_and_add(&hist->counts[bucket], 1);
    u64 *longest = latency_max.lookup(&zero);
    if (longest && ns > *longest)
        *longest = ns;
    u64 *sum = latency_sum.lookup(&zero);
    if (sum)
        *sum += ns;
#ifdef ALARM_NS
    if (ns >= ALARM_NS)
        long_wait_seen(tid, ns, start);
#endif
#ifndef NO_GRANULES
    count_by_start(bucket, start);
#endif
}
#define ON_WAIT_LENGTH(tid, ns, start) count_wait(tid, ns, start)
"""
HISTOGRAM = HISTOGRAM.replace("FINE_BUCKET_C\n", FINE_BUCKET_C)
FINE_BUCKETS = 1024


def fine_bucket_range(bucket: int) -> tuple[int, int]:
    """(shortest wait, width) of a latency histogram bucket (16 per doubling)."""
    doubling, step = divmod(bucket, 16)
    if doubling < 4:
        return 0, 16
    return (16 + step) << (doubling - 4), 1 << (doubling - 4)


# A wait summed in a bucket stands for the middle of the bucket (at most 2.2% off); the top
# buckets (past 2^62 ns, a century) only keep the int64 arrays whole.
FINE_BUCKET_MIDDLES = np.array([min(lower + width // 2, 1 << 62)
                                for lower, width in map(fine_bucket_range, range(FINE_BUCKETS))], dtype=np.int64)

# What every program shares: the event a watched thread's wait becomes, and what is lost.
EVENTS = r"""
#define SLEEP_STATE_BITS 0xff
#ifndef ON_WAIT_LENGTH
#define ON_WAIT_LENGTH(tid, ns, start)
#endif

struct event { u32 tid; u32 pad; u64 delta_ns; u64 start_ns; };

#ifndef NO_EVENTS
BPF_RINGBUF_OUTPUT(events, RING_PAGES);  // not even allocated when waits are summed
#endif
BPF_PERCPU_ARRAY(lost, u64, 1);

static __always_inline void count_lost(void) {
    int zero = 0;
    u64 *count = lost.lookup(&zero);
    if (count)
        (*count)++;
}

// One wait of a watched thread, measured: summed, or handed to user space. ``start`` is when
// it began (bpf_ktime_get_ns(): CLOCK_MONOTONIC).
static __always_inline void wait_measured(u32 tid, u64 delta, u64 start) {
    ON_WAIT_LENGTH(tid, delta, start);
#ifndef NO_EVENTS
    struct event *e = events.ringbuf_reserve(sizeof(struct event));
    if (!e) {
        count_lost();
        return;
    }
    e->tid = tid;
    e->pad = 0;
    e->delta_ns = delta;
    e->start_ns = start;
    events.ringbuf_submit(e, 0);
#endif
}
"""

# What the programs that time waits themselves share: when a wait starts and ends.
COMMON = EVENTS + r"""
BPF_HASH(start, u32, u64, MAX_THREADS);

// A watched thread became runnable: its wait starts now.
static __always_inline void wait_starts(u32 tid) {
    u64 now = bpf_ktime_get_ns();
    if (start.update(&tid, &now))
        count_lost();
}

// A watched thread runs: the wait since it became runnable is one event.
static __always_inline void wait_ends(u32 tid) {
    u64 *since = start.lookup(&tid);
    if (!since)
        return;
    u64 began = *since;
    u64 delta = bpf_ktime_get_ns() - began;
    start.delete(&tid);
    wait_measured(tid, delta, began);
}
"""

# The bitmap of watched thread ids, for the BTF programs.
WATCHED = r"""
BPF_ARRAY(watched, u64, WORDS);                        // a bit per watched thread id

static __always_inline bool is_watched(u32 tid) {
    u32 index = tid >> 6;
    u64 *bits = watched.lookup(&index);
    return tid && bits && ((*bits >> (tid & 63)) & 1);
}

static __always_inline void watch_tid(u32 tid) {
    u32 index = tid >> 6;
    u64 *bits = watched.lookup(&index);
    if (!bits) {
        count_lost();
        return;
    }
    __sync_fetch_and_or(bits, 1ULL << (tid & 63));
}

static __always_inline void unwatch_tid(u32 tid) {
    u32 index = tid >> 6;
    u64 *bits = watched.lookup(&index);
    if (bits)
        __sync_fetch_and_and(bits, ~(1ULL << (tid & 63)));
}
"""

# Following forks and exits, for the BTF programs: a watched thread's new thread or child is
# watched too. Each program defines forked(task) and exited(tid) for what it keeps per thread.
FORKS_AND_EXITS = r"""
// args: struct task_struct *parent, struct task_struct *child. The parent is `current`.
RAW_TRACEPOINT_PROBE(sched_process_fork) {
    if (!is_watched((u32)bpf_get_current_pid_tgid()))
        return 0;
    u32 child = 0;
    bpf_probe_read_kernel(&child, sizeof(child), (void *)(ctx->args[1] + PID_OFFSET));
    watch_tid(child);
    forked(ctx->args[1]);
    return 0;
}

// The exiting task is `current`.
RAW_TRACEPOINT_PROBE(sched_process_exit) {
    u32 tid = (u32)bpf_get_current_pid_tgid();
    if (!is_watched(tid))
        return 0;
    unwatch_tid(tid);
    exited(tid);
    return 0;
}
"""

# The sched_info program (the default where BTF has the fields). The scheduler already times
# every wait of every task, whether or not anyone measures: a task queued to run gets a
# timestamp, and when it runs the wait is added to task_struct.sched_info.run_delay and
# sched_info.pcount goes up by one (CONFIG_SCHED_INFO; /proc/PID/schedstat shows both). So one
# program on sched_switch is enough, and it reads only `current` (the thread switched out): a
# watched thread's run_delay grew, since its last switch out, by exactly the one wait before it
# last ran. No program runs on wakeups, where the other programs spend half their runs at a
# switch storm, and an unwatched switch costs one inlined bitmap test. The offsets come from the
# running kernel's BTF. A wait reads when its thread is next switched out (a window late at most
# for a thread that runs for long); a thread's first switch out only sets its baseline.
#
# When the wait began: the thread has run since it ended, once (pcount grew by one), for as long
# as its se.sum_exec_runtime grew since its last switch out. So the wait began that run time and
# the wait itself before now. (The run time leaves out interrupts and time the hypervisor took,
# where the kernel accounts them apart: the start is then that much late, microseconds.)
SCHED_INFO_BODY = WATCHED + r"""
struct sched_counts { u64 pcount; u64 run_delay; u64 ran; };  // sched_info's first two fields; se.sum_exec_runtime
BPF_HASH(seen, u32, struct sched_counts, MAX_THREADS);

RAW_TRACEPOINT_PROBE(sched_switch) {
    u32 tid = (u32)bpf_get_current_pid_tgid();
    if (!is_watched(tid))
        return 0;
    u64 task = bpf_get_current_task();
    struct sched_counts now = {};
    bpf_probe_read_kernel(&now, 16, (void *)(task + SCHED_INFO_OFFSET));
    bpf_probe_read_kernel(&now.ran, sizeof(now.ran), (void *)(task + EXEC_RUNTIME_OFFSET));
    struct sched_counts *before = seen.lookup(&tid);
    if (!before) {
        if (seen.update(&tid, &now))
            count_lost();
        return 0;
    }
    if (now.pcount == before->pcount + 1) {
        u64 wait = now.run_delay - before->run_delay;
        wait_measured(tid, wait, bpf_ktime_get_ns() - (now.ran - before->ran) - wait);
    } else if (now.pcount > before->pcount + 1) {
        count_lost();  // a switch out was missed: the waits since cannot be told apart
    }
    *before = now;
    return 0;
}

// What this program keeps per thread, as threads are created and exit.
static __always_inline void forked(u64 task) {}
// The exiting thread's last switch out is then not measured.
static __always_inline void exited(u32 tid) { seen.delete(&tid); }
""" + FORKS_AND_EXITS
SCHED_INFO_PROGRAM = EVENTS + SCHED_INFO_BODY

# The raw-tracepoint program (diagnose's, whose attribution needs the wakeups, and the
# fallback where the BTF lacks sched_info). A raw tracepoint hands over its arguments
# as they are: no trace record is filled in first, as it is for a classic tracepoint, and
# the program has a recursion guard of its own (a classic tracepoint program shares the
# per-CPU guard of all tracing programs, and is skipped, uncounted, while another runs).
# Its arguments are task_struct pointers: a thread id is read at the offset the running
# kernel's BTF gives (PID_OFFSET), never one from headers that may belong to another build.
#
# Reading another task's memory is a helper call, and most tasks are not watched. So the
# program first tests the task *pointer* against a bitmap of watched tasks' pointers (an
# inlined array lookup; a hash collision only costs a read that then says no), and reads
# the thread id only on a hit. It learns a watched thread's pointer when the thread is
# switched out (then it is `current`, whose id costs no read) or created; a thread watched
# since before the probe started is measured from its first switch out.
#
# The hooks (ON_...) are empty here; the attributing probe (attribution.py) fills them in.
RAW_BODY = WATCHED + r"""
#ifndef ON_CPU_EVENT
#define ON_CPU_EVENT()
#define ON_WAKEUP(tid, task)
#define ON_PREEMPTED(tid)
#define ON_SLEEP(tid)
#define ON_RUNS(tid)
#endif
#define POINTER_BITS 20

BPF_ARRAY(pointers, u64, 1 << (POINTER_BITS - 6));     // a bit per hash of a watched task pointer

static __always_inline u32 pointer_slot(u64 task) {
    return (u32)((task * 0x9E3779B97F4A7C15ULL) >> (64 - POINTER_BITS));
}

static __always_inline bool maybe_watched(u64 task) {
    u32 slot = pointer_slot(task), index = slot >> 6;
    u64 *bits = pointers.lookup(&index);
    return bits && ((*bits >> (slot & 63)) & 1);
}

static __always_inline void remember(u64 task) {
    u32 slot = pointer_slot(task), index = slot >> 6;
    u64 *bits = pointers.lookup(&index);
    if (bits && !((*bits >> (slot & 63)) & 1))
        __sync_fetch_and_or(bits, 1ULL << (slot & 63));
}

// The thread id of a task that may be watched, or 0.
static __always_inline u32 watched_tid(u64 task) {
    if (!maybe_watched(task))
        return 0;
    u32 tid = 0;
    bpf_probe_read_kernel(&tid, sizeof(tid), (void *)(task + PID_OFFSET));
    return is_watched(tid) ? tid : 0;
}

RAW_TRACEPOINT_PROBE(sched_wakeup) {
    u32 tid = watched_tid(ctx->args[0]);
    if (tid) {
        wait_starts(tid);
        ON_WAKEUP(tid, ctx->args[0]);
    }
    return 0;
}

RAW_TRACEPOINT_PROBE(sched_wakeup_new) {
    u32 tid = watched_tid(ctx->args[0]);
    if (tid) {
        wait_starts(tid);
        ON_WAKEUP(tid, ctx->args[0]);
    }
    return 0;
}

// args: bool preempt, struct task_struct *prev, struct task_struct *next, unsigned int prev_state.
// prev is `current` here: its thread id costs no read.
RAW_TRACEPOINT_PROBE(sched_switch) {
    ON_CPU_EVENT();
    u32 prev = (u32)bpf_get_current_pid_tgid();
    if (is_watched(prev)) {
        remember(ctx->args[1]);
        if ((ctx->args[3] & SLEEP_STATE_BITS) == 0) {
            wait_starts(prev);  // preempted: runnable, waiting again
            ON_PREEMPTED(prev);
        } else {
            start.delete(&prev);  // going to sleep: a start left over is stale
            ON_SLEEP(prev);
        }
    }
    u32 tid = watched_tid(ctx->args[2]);
    if (tid) {
        wait_ends(tid);
        ON_RUNS(tid);
    }
    return 0;
}

// What this program keeps per thread, as threads are created and exit.
static __always_inline void forked(u64 task) { remember(task); }
static __always_inline void exited(u32 tid) { start.delete(&tid); }
""" + FORKS_AND_EXITS
RAW_PROGRAM = COMMON + RAW_BODY

# The classic-tracepoint program, for kernels without BTF or older than 5.18 (whose
# sched_switch has no prev_state argument). Only tracepoint arguments are read: their
# layout comes from tracefs format files, so mismatched headers do not matter.
#
# Filtering is on the *woken* task (args->pid) in sched_wakeup, not on `current`, which
# there is the waker; and on next_pid / prev_pid in sched_switch. A preempted task
# (prev_state has no sleep bit: "R" or "R+") is runnable again at once, so its wait
# until it runs again is measured too, as bcc's runqlat does.
CLASSIC_PROGRAM = COMMON + r"""
// A one-byte-per-slot prefilter (tid mod 65536): an array lookup is inlined, a
// hash lookup is a helper call, and nearly every switch on a busy machine is
// not the target's. Slots are only ever set, so a stale slot costs a hash lookup.
BPF_ARRAY(maybe, u8, 65536);
BPF_HASH(targets, u32, u8, MAX_THREADS);

static bool may_be_target(u32 tid) {
    int slot = tid & 0xffff;
    u8 *set = maybe.lookup(&slot);
    return set && *set;
}

static void mark_runnable(u32 tid) {
    if (tid != 0 && may_be_target(tid) && targets.lookup(&tid))
        wait_starts(tid);
}

TRACEPOINT_PROBE(sched, sched_wakeup) { mark_runnable(args->pid); return 0; }
TRACEPOINT_PROBE(sched, sched_wakeup_new) { mark_runnable(args->pid); return 0; }

TRACEPOINT_PROBE(sched, sched_switch) {
    u32 prev = args->prev_pid;
    if ((args->prev_state & SLEEP_STATE_BITS) == 0) {
        mark_runnable(prev);
    } else if (may_be_target(prev)) {
        start.delete(&prev);
    }
    u32 tid = args->next_pid;
    if (tid != 0 && may_be_target(tid))
        wait_ends(tid);
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
    _fields_ = [("tid", ctypes.c_uint32), ("pad", ctypes.c_uint32), ("delta_ns", ctypes.c_uint64),
                ("start_ns", ctypes.c_uint64)]


class EventBuffer:
    """Events copied raw as the ring buffer hands them over, decoded in one go when taken.

    The ring buffer calls back once per event; a callback that only copies 24 bytes keeps
    tuned-rl's own bursts of CPU short (after an eviction here: the workload's measured p999
    0.9-1.1 ms with a callback building Python integers, 0.2-0.4 ms with this).
    """

    EVENT_BYTES = ctypes.sizeof(_Event)
    DTYPE = np.dtype([("tid", "<u4"), ("pad", "<u4"), ("delta_ns", "<u8"), ("start_ns", "<u8")])

    def __init__(self, capacity: int = 65536):
        self.capacity = capacity
        self._data = bytearray(self.EVENT_BYTES * capacity)
        self._address = ctypes.addressof(ctypes.c_char.from_buffer(self._data))
        self._count = 0
        self._full: list[bytes] = []

    def add(self, data: int) -> None:
        """Copy one event from ``data`` (an address the ring buffer gave)."""
        if self._count == self.capacity:
            self._full.append(bytes(self._data))
            self._count = 0
        ctypes.memmove(self._address + self.EVENT_BYTES * self._count, data, self.EVENT_BYTES)
        self._count += 1

    def take(self) -> Waits:
        """Every wait added since the last take."""
        raw = b"".join(self._full) + bytes(memoryview(self._data)[: self.EVENT_BYTES * self._count])
        self._full, self._count = [], 0
        events = np.frombuffer(raw, dtype=self.DTYPE)
        return Waits(events["delta_ns"].astype(np.int64), events["start_ns"].astype(np.int64),
                     events["tid"].astype(np.int64))


class BpfProbe(LatencyProbe):
    """Waits summed in a histogram in the kernel (``summed``, the default), or each one delivered
    through a BPF ring buffer (with its thread id: for tests and benches); lost events counted in
    the kernel.

    ``variant`` says which program runs: "sched_info" (the scheduler's own wait counts, read
    on sched_switch only) where the kernel's BTF has them, else "raw" (raw tracepoints on
    wakeups and switches, offsets from BTF), else "classic". ``lost`` counts events the ring
    buffer or a map had no room for, waits that could not be told apart, and every run of a
    program the kernel skipped (its recursion misses, from bpf_prog_info).
    """

    name = "bpf"
    follows_forks = True

    def __init__(self, max_threads: int = 16384, ring_pages: int = 256, variant: str = "auto", summed: bool = True):
        self.max_threads, self.ring_pages, self.variant, self.summed = max_threads, ring_pages, variant, summed
        self._bpf = None
        self._watched: set[int] = set()
        self._events = EventBuffer()
        self._ring: GranuleRing | None = None
        self.start_resolution_ns = GRANULE_NS if summed else 1

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

        if self.variant == "auto":
            self.variant = ("sched_info" if _sched_info_usable() else
                            "raw" if _raw_tracepoints_usable() else "classic")
        cflags = [f"-DMAX_THREADS={self.max_threads}", f"-DRING_PAGES={self.ring_pages}", "-w",
                  f"-DGRANULE_SHIFT={GRANULE_SHIFT}", f"-DGRANULES={GRANULES}", f"-DGRANULE_BUCKETS={GRANULE_BUCKETS}",
                  f"-DGRANULE_FIRST_BUCKET={GRANULE_FIRST_BUCKET}"]
        if self.variant in ("raw", "sched_info"):
            cflags += [f"-DPID_OFFSET={member_offset('task_struct', 'pid')}", f"-DWORDS={_bitmap_words()}"]
        if self.variant == "sched_info":
            cflags += [f"-DSCHED_INFO_OFFSET={member_offset('task_struct', 'sched_info')}",
                       f"-DEXEC_RUNTIME_OFFSET={_exec_runtime_offset()}"]
        try:
            program, extra_cflags = self._program()
            if self.summed:
                program = HISTOGRAM + program
            self._bpf = BPF(text=program.encode(), cflags=cflags + extra_cflags)
        except Exception as err:  # BCC raises bare Exception on compile or load failure
            raise ProbeError(f"BPF program ({self.variant} tracepoints) failed to load: {err}") from err
        self.watch(tids)
        if self.summed:
            self._ring = GranuleRing(lambda: self._counts(b"granule_totals", 0),
                                     lambda slot: self._counts(b"granule_hist", slot),
                                     lambda: self._counts(b"too_old", 0), FINE_BUCKET_MIDDLES)
        else:
            self._bpf[b"events"].open_ring_buffer(self._on_event)

    def _program(self) -> tuple[str, list[str]]:
        """The program's text for this variant, and the compiler flags it adds."""
        programs = {"sched_info": SCHED_INFO_PROGRAM, "raw": RAW_PROGRAM, "classic": CLASSIC_PROGRAM}
        return programs[self.variant], []

    def watch(self, tids: Iterable[int]) -> None:
        new = set(tids) - self._watched
        self._watched |= new
        if self.variant in ("raw", "sched_info"):
            self._watch_bitmap(new)
            return
        targets, maybe = self._bpf[b"targets"], self._bpf[b"maybe"]
        for tid in new:
            maybe[ctypes.c_int(tid & 0xFFFF)] = ctypes.c_uint8(1)
            targets[ctypes.c_uint32(tid)] = ctypes.c_uint8(1)

    def _watch_bitmap(self, tids: set[int], watched_bits: bool = True) -> None:
        """Set (or, ``watched_bits`` False, clear) the bits of ``tids`` in the watched-threads bitmap."""
        watched = self._bpf[b"watched"]
        words: dict[int, int] = {}
        for tid in tids:
            words[tid >> 6] = words.get(tid >> 6, 0) | 1 << (tid & 63)
        for index, bits in words.items():
            key = ctypes.c_int(index)
            try:
                current = watched[key].value  # read first: the kernel sets and clears bits as tasks fork and exit
            except (KeyError, IndexError):
                continue  # a thread id beyond pid_max cannot exist
            watched[key] = ctypes.c_uint64(current | bits if watched_bits else current & ~bits & (2 ** 64 - 1))

    def drain(self) -> Waits:
        if self.summed:
            return self._ring.take(time.monotonic_ns())
        self._bpf.ring_buffer_consume()
        return self._events.take()

    def _counts(self, table: bytes, index: int) -> np.ndarray:
        """One element of a map of u32 counts, copied."""
        return np.frombuffer(self._bpf[table][ctypes.c_int(index)].counts, dtype=np.uint32).copy()

    def wait_counts(self) -> np.ndarray:
        """The kernel's histogram so far: waits per fine bucket (``summed`` only)."""
        counts = self._bpf[b"latency_hist"][ctypes.c_int(0)].counts
        return np.frombuffer(counts, dtype=np.uint64).astype(np.int64)

    def longest_wait_ns(self) -> int:
        """The longest wait so far, on any CPU (``summed`` only)."""
        return int(max(self._bpf[b"latency_max"][ctypes.c_int(0)]))

    @property
    def lost(self) -> int:
        if self._bpf is None:
            return 0
        counted = int(sum(self._bpf[b"lost"][ctypes.c_int(0)]))
        return counted + sum(recursion_misses(function.fd) for function in self._bpf.funcs.values())

    def stop(self) -> None:
        if self._bpf is not None:
            self._bpf.cleanup()
            self._bpf = None

    def _on_event(self, ctx, data, size) -> None:
        self._events.add(data)


def _raw_tracepoints_usable() -> bool:
    """Raw sched_switch passes prev_state from Linux 5.18; the thread id offset needs BTF."""
    major, minor = (int(part) for part in platform.release().split(".")[:2])
    if (major, minor) < (5, 18):
        return False
    try:
        member_offset("task_struct", "pid")
    except BtfError:
        return False
    return True


def _sched_info_usable() -> bool:
    """The scheduler's own wait counts are readable: task_struct.sched_info (CONFIG_SCHED_INFO)
    starts with pcount and run_delay, as it has since Linux 2.6, and the thread id offset is known."""
    try:
        sched_info = member_offset("task_struct", "sched_info")
        layout = (member_offset("sched_info", "pcount"), member_offset("sched_info", "run_delay"))
        member_offset("task_struct", "pid")
        _exec_runtime_offset()
    except BtfError:
        return False
    return sched_info > 0 and layout == (0, 8)


def _exec_runtime_offset() -> int:
    """Where task_struct.se.sum_exec_runtime is: the thread's time on a CPU, in ns."""
    return member_offset("task_struct", "se") + member_offset("sched_entity", "sum_exec_runtime")


def _bitmap_words() -> int:
    """Enough 64-bit words for a bit per possible thread id.

    Read from the live kernel, not through a Host: the bitmap is the loaded BPF program's, in this
    kernel, whatever root a Host was given."""
    try:
        with open("/proc/sys/kernel/pid_max") as handle:
            pid_max = int(handle.read())
    except (OSError, ValueError):
        pid_max = 4 * 1024 * 1024  # the 64-bit kernel's limit
    return (pid_max + 63) // 64


BPF_OBJ_GET_INFO_BY_FD = 15
_BPF_SYSCALL = {"x86_64": 321, "aarch64": 280}
_PROG_INFO_SIZE = 256
_RECURSION_MISSES_AT = 208  # u64 recursion_misses in struct bpf_prog_info (Linux 5.12)


def recursion_misses(program_fd: int) -> int:
    """How many times the kernel skipped a program because it was already running on that CPU (0 if unknown)."""
    number = _BPF_SYSCALL.get(platform.machine())
    if number is None:
        return 0
    info = ctypes.create_string_buffer(_PROG_INFO_SIZE)
    attr = struct.pack("=IIQ", program_fd, _PROG_INFO_SIZE, ctypes.addressof(info))
    attr_buffer = ctypes.create_string_buffer(attr, 128)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(number, BPF_OBJ_GET_INFO_BY_FD, attr_buffer, 128) != 0:
        return 0
    info_len = struct.unpack_from("=I", attr_buffer.raw, 4)[0]
    if info_len < _RECURSION_MISSES_AT + 8:
        return 0  # a kernel before 5.12 does not count them
    return struct.unpack_from("=Q", info.raw, _RECURSION_MISSES_AT)[0]
