"""The attributing probe: the eBPF probe's run-queue latency, plus, for every microsecond a watched
thread waited, what held its CPU meanwhile, summed in the kernel per (CPU, holder).

BpfProbe's raw-tracepoint program (variant "raw", which sees wakeups), with its hooks filled in. Each CPU keeps a few
slots for watched threads queued on it (a wake-up opens one on the CPU the thread was queued on;
a preemption on the CPU it was preempted on). Whenever that CPU switches tasks or enters or
leaves an interrupt handler or a softirq, the time since its last such event is added, for
every open slot, to what held the CPU meanwhile: the task that ran (the idle task when none
did), the hard interrupt or the softirq. When the watched thread runs, its wait closes: the
wait's parts per holder are added to a second sum keyed by the wait's length (a log-linear
bucket, four per doubling), so that the holders of the longest waits can be read apart from the
rest. Time no slot saw (the thread moved to another CPU while it waited, a CPU with more waiting
threads than slots, a wait with more holders than a slot keeps) is counted as "not attributed",
so every microsecond of waiting is in the sums.

The local timer interrupt has no irq_handler tracepoint: its time counts for the task it
interrupted. A wait's slot is changed both on its own CPU and by a waker on another CPU without
a shared lock; the rare overlap costs a little accuracy, never a wait.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

import numpy as np

from tuned_rl.host.cpus import parse_cpu_list
from tuned_rl.measure.probes.base import ProbeError
from tuned_rl.measure.probes.bpf import COMMON, FINE_BUCKET_MIDDLES, RAW_BODY, BpfProbe, _raw_tracepoints_usable
from tuned_rl.measure.probes.btf import BtfError, member_offset

# Holder kinds, as the program numbers them.
IDLE, TASK, HARDIRQ, SOFTIRQ, NOT_ATTRIBUTED = 0, 1, 2, 3, 4
KIND_NAMES = {IDLE: "idle", TASK: "task", HARDIRQ: "irq", SOFTIRQ: "softirq", NOT_ATTRIBUTED: "not attributed"}
BUCKETS_PER_DOUBLING = 4

ATTRIBUTION = r"""
#define SLOTS 4
#define PARTS 4
#define HOLDER_IDLE 0
#define HOLDER_TASK 1
#define HOLDER_HARDIRQ 2
#define HOLDER_SOFTIRQ 3
#define HOLDER_NOT_ATTRIBUTED 4

struct holder_key { u32 cpu; u32 kind; u32 id; u32 pad; };
struct tail_key { u32 kind; u32 id; u32 bucket; u32 pad; };
struct holder_name { char comm[16]; u32 tgid; u32 policy; };
struct part { u32 kind; u32 id; u64 ns; };
struct slot { u32 tid; u32 pad; u64 since; u64 counted; struct part parts[PARTS]; };
struct cpu_state { u32 hardirq; u32 softirq; u64 last; struct slot slots[SLOTS]; };

BPF_ARRAY(cpu_states, struct cpu_state, MAX_CPUS);
BPF_HASH(held, struct holder_key, u64, 16384);         // ns of waiting, per (CPU, holder)
BPF_HASH(tail, struct tail_key, u64, 16384);           // ns of waiting, per (holder, wait-length bucket)
BPF_HASH(waits, u32, u64, 256);                        // waits closed, per wait-length bucket
BPF_HASH(idle_waits, u32, u64, 256);                   // of those, waits while only the idle task ran
BPF_HASH(holder_names, u32, struct holder_name, 16384);
BPF_HASH(waiting_on, u32, u32, MAX_THREADS);           // the CPU whose slot a waiting thread holds

// Four buckets per doubling: the bucket's lower bound is (4 + b % 4) << (b / 4 - 2) ns.
static __always_inline u32 bucket_of(u64 ns) {
    u32 msb = msb_of(ns);
    if (msb < 2)
        return 8;
    return msb * 4 + (u32)((ns >> (msb - 2)) & 3);
}

static __always_inline void add_held(u32 cpu, u32 kind, u32 id, u64 ns) {
    struct holder_key key = {cpu, kind, id, 0};
    u64 zero = 0;
    u64 *sum = held.lookup_or_try_init(&key, &zero);
    if (!sum) {
        count_lost();
        return;
    }
    if (*sum == 0 && kind == HOLDER_TASK) {  // first seen: its name, while it is `current`
        struct holder_name name = {};
        bpf_get_current_comm(&name.comm, sizeof(name.comm));
        name.tgid = bpf_get_current_pid_tgid() >> 32;
        bpf_probe_read_kernel(&name.policy, sizeof(name.policy),
                              (void *)((u64)bpf_get_current_task() + POLICY_OFFSET));
        holder_names.update(&id, &name);
    }
    __sync_fetch_and_add(sum, ns);
}

static __always_inline void add_tail(u32 kind, u32 id, u32 bucket, u64 ns) {
    struct tail_key key = {kind, id, bucket, 0};
    u64 zero = 0;
    u64 *sum = tail.lookup_or_try_init(&key, &zero);
    if (sum)
        __sync_fetch_and_add(sum, ns);
    else
        count_lost();
}

// The time since this CPU's last event goes to what held it: for each open slot, the part
// of it after the slot opened.
static __always_inline struct cpu_state *flush(u32 cpu, u64 now) {
    struct cpu_state *s = cpu_states.lookup(&cpu);
    if (!s)
        return 0;
    u32 kind = HOLDER_TASK, id = (u32)bpf_get_current_pid_tgid();
    if (s->hardirq) {
        kind = HOLDER_HARDIRQ;
        id = s->hardirq - 1;
    } else if (s->softirq) {
        kind = HOLDER_SOFTIRQ;
        id = s->softirq - 1;
    } else if (id == 0) {
        kind = HOLDER_IDLE;
    }
    u64 total = 0;
    #pragma unroll
    for (int i = 0; i < SLOTS; i++) {
        struct slot *w = &s->slots[i];
        if (!w->tid)
            continue;
        if (kind == HOLDER_TASK && id == w->tid) {  // it runs, so it no longer waits: a stale slot
            u32 tid = w->tid;
            w->tid = 0;
            waiting_on.delete(&tid);
            continue;
        }
        u64 from = w->since > s->last ? w->since : s->last;
        if (now <= from)
            continue;
        u64 d = now - from;
        total += d;
        w->counted += d;
        int placed = 0;
        #pragma unroll
        for (int j = 0; j < PARTS; j++) {
            if (!placed && w->parts[j].ns && w->parts[j].kind == kind && w->parts[j].id == id) {
                w->parts[j].ns += d;
                placed = 1;
            }
        }
        #pragma unroll
        for (int j = 0; j < PARTS; j++) {
            if (!placed && !w->parts[j].ns) {
                w->parts[j].kind = kind;
                w->parts[j].id = id;
                w->parts[j].ns = d;
                placed = 1;
            }
        }
    }
    s->last = now;
    if (total)
        add_held(cpu, kind, id, total);
    return s;
}

static __always_inline void open_slot(u32 cpu, u32 tid, u64 now) {
    if (waiting_on.lookup(&tid))
        return;  // woken again while it waits: the wait goes on
    struct cpu_state *s = cpu_states.lookup(&cpu);
    if (!s)
        return;
    #pragma unroll
    for (int i = 0; i < SLOTS; i++) {
        struct slot *w = &s->slots[i];
        if (!w->tid) {
            __builtin_memset(w->parts, 0, sizeof(w->parts));
            w->since = now;
            w->counted = 0;
            w->tid = tid;
            waiting_on.update(&tid, &cpu);
            return;
        }
    }
    // No free slot: the wait is measured but not attributed (its time is not in the sums).
    count_lost();
}

#ifdef ALARM_ATTRIBUTED_NS
// A wait of ALARM_ATTRIBUTED_NS or more, handed to user space with what held its CPU meanwhile.
struct attributed_wait { u32 tid; u32 cpu; u64 length_ns; u64 end_ns; u64 counted_ns; struct part parts[PARTS]; };
BPF_RINGBUF_OUTPUT(attributed_waits, 8);

static __always_inline void report_long_wait(u32 tid, u32 cpu, u64 length, u64 now, struct slot *w) {
    struct attributed_wait *e = attributed_waits.ringbuf_reserve(sizeof(struct attributed_wait));
    if (!e) {
        count_lost();
        return;
    }
    e->tid = tid;
    e->cpu = cpu;
    e->length_ns = length;
    e->end_ns = now;
    e->counted_ns = w->counted;
    __builtin_memcpy(e->parts, w->parts, sizeof(e->parts));
    attributed_waits.ringbuf_submit(e, 0);
}
#define ON_LONG_WAIT(tid, cpu, length, now, w) \
    if (length >= ALARM_ATTRIBUTED_NS) report_long_wait(tid, cpu, length, now, w)
#else
#define ON_LONG_WAIT(tid, cpu, length, now, w)
#endif

// The thread's wait ends (it runs) or is dropped (it goes to sleep from a stale wake-up).
static __always_inline void close_slot(u32 tid, u64 now, int ran) {
    u32 *on = waiting_on.lookup(&tid);
    if (!on)
        return;
    u32 cpu = *on;
    waiting_on.delete(&tid);
    struct cpu_state *s = cpu_states.lookup(&cpu);
    if (!s)
        return;
    #pragma unroll
    for (int i = 0; i < SLOTS; i++) {
        struct slot *w = &s->slots[i];
        if (w->tid != tid)
            continue;
        w->tid = 0;
        if (!ran || now <= w->since)
            return;
        u64 length = now - w->since;
        u32 bucket = bucket_of(length);
        ON_LONG_WAIT(tid, cpu, length, now, w);
        u64 attributed = 0;
        int only_idle = 1;
        #pragma unroll
        for (int j = 0; j < PARTS; j++) {
            if (w->parts[j].ns) {
                add_tail(w->parts[j].kind, w->parts[j].id, bucket, w->parts[j].ns);
                attributed += w->parts[j].ns;
                if (w->parts[j].kind != HOLDER_IDLE)
                    only_idle = 0;
            }
        }
        if (only_idle && attributed) {
            u64 zero = 0;
            u64 *idle = idle_waits.lookup_or_try_init(&bucket, &zero);
            if (idle)
                __sync_fetch_and_add(idle, 1);
        }
        if (length > attributed)
            add_tail(HOLDER_NOT_ATTRIBUTED, 0, bucket, length - attributed);
        if (length > w->counted)
            add_held(cpu, HOLDER_NOT_ATTRIBUTED, 0, length - w->counted);
        u64 zero = 0;
        u64 *count = waits.lookup_or_try_init(&bucket, &zero);
        if (count)
            __sync_fetch_and_add(count, 1);
        return;
    }
}

#define ON_CPU_EVENT() flush(bpf_get_smp_processor_id(), bpf_ktime_get_ns())
#define ON_PREEMPTED(tid) open_slot(bpf_get_smp_processor_id(), tid, bpf_ktime_get_ns())
#define ON_SLEEP(tid) close_slot(tid, 0, 0)
#define ON_RUNS(tid) close_slot(tid, bpf_ktime_get_ns(), 1)

// Woken: queued on the CPU the task now names, unless it is still running (a wake-up of a
// task on its way to sleep, which never waited).
static __always_inline void woken(u32 tid, u64 task) {
    int on_cpu = 0;
    u32 cpu = 0;
    bpf_probe_read_kernel(&on_cpu, sizeof(on_cpu), (void *)(task + ON_CPU_OFFSET));
    if (on_cpu)
        return;
    bpf_probe_read_kernel(&cpu, sizeof(cpu), (void *)(task + CPU_OFFSET));
    open_slot(cpu, tid, bpf_ktime_get_ns());
}
#define ON_WAKEUP(tid, task) woken(tid, task)

// An interrupt handler or softirq starts (value: its number + 1) or ends (0) on this CPU: the time
// until then goes to what held the CPU, the time after to the handler.
static __always_inline void handler(int hard, u32 value) {
    struct cpu_state *s = flush(bpf_get_smp_processor_id(), bpf_ktime_get_ns());
    if (!s)
        return;
    if (hard)
        s->hardirq = value;
    else
        s->softirq = value;
}

// args: int irq, struct irqaction *action (, int ret) / unsigned int vec_nr.
RAW_TRACEPOINT_PROBE(irq_handler_entry) { handler(1, (u32)ctx->args[0] + 1); return 0; }
RAW_TRACEPOINT_PROBE(irq_handler_exit) { handler(1, 0); return 0; }
RAW_TRACEPOINT_PROBE(softirq_entry) { handler(0, (u32)ctx->args[0] + 1); return 0; }
RAW_TRACEPOINT_PROBE(softirq_exit) { handler(0, 0); return 0; }
"""


@dataclass(frozen=True)
class HeldRecord:
    """Wait time of the watched threads while one holder had one CPU."""

    cpu: int
    kind: str  # idle, task, irq, softirq, not attributed
    id: int    # thread id, IRQ number or softirq vector (0 for idle and not attributed)
    ns: int


@dataclass(frozen=True)
class TailRecord:
    """Wait time one holder took in waits of one length bucket."""

    kind: str
    id: int
    bucket: int
    ns: int


@dataclass
class Attribution:
    """What the probe's sums held when it was read."""

    held: list[HeldRecord]
    tail: list[TailRecord]
    waits: dict[int, int]           # closed waits per bucket
    idle_waits: dict[int, int]      # of those, waits during which only the idle task ran on the CPU
    names: dict[int, dict]          # thread id -> {"comm", "tgid", "policy"} as first seen holding a CPU
    latencies: dict[int, int] = field(default_factory=dict)  # every wait's length: fine bucket -> count
    longest_ns: int = 0

    def latency_percentile_ns(self, percent: float, beyond: bool = False) -> int:
        """A percentile of the waits' lengths: the middle of the fine bucket it falls in.

        ``beyond``: the first wait past that share of them (99: where the worst 1% begins).
        """
        total = sum(self.latencies.values())
        if not total:
            return 0
        wanted, seen = total * percent / 100, 0
        for bucket in sorted(self.latencies):
            seen += self.latencies[bucket]
            if seen > wanted or (seen >= wanted and not beyond):
                middle = int(FINE_BUCKET_MIDDLES[bucket])
                return min(middle, self.longest_ns) if self.longest_ns else middle
        return self.longest_ns

    def latency_summary(self) -> dict:
        """As `measure` reports it (n, p50_us, p99_us, p999_us, max_us), from the kernel's histogram."""
        return {"n": sum(self.latencies.values()),
                **{f"{name}_us": round(self.latency_percentile_ns(p) / 1000, 1)
                   for name, p in (("p50", 50), ("p99", 99), ("p999", 99.9))},
                "max_us": round(self.longest_ns / 1000, 1)}

    def to_dict(self) -> dict:
        return {"held": [vars(r) for r in self.held], "tail": [vars(r) for r in self.tail],
                "waits": {str(k): v for k, v in self.waits.items()},
                "idle_waits": {str(k): v for k, v in self.idle_waits.items()},
                "latencies": {str(k): v for k, v in self.latencies.items()}, "longest_ns": self.longest_ns,
                "names": {str(k): v for k, v in self.names.items()}}

    @classmethod
    def from_dict(cls, data: dict) -> "Attribution":
        return cls([HeldRecord(**r) for r in data["held"]], [TailRecord(**r) for r in data["tail"]],
                   {int(k): v for k, v in data["waits"].items()},
                   {int(k): v for k, v in data.get("idle_waits", {}).items()},
                   {int(k): v for k, v in data["names"].items()},
                   {int(k): v for k, v in data.get("latencies", {}).items()}, data.get("longest_ns", 0))


def bucket_lower_ns(bucket: int) -> int:
    """The shortest wait in a bucket (the program's bucket_of, inverted)."""
    doubling, step = divmod(bucket, BUCKETS_PER_DOUBLING)
    return (BUCKETS_PER_DOUBLING + step) << (doubling - 2) if doubling >= 2 else 0


def bucket_of(ns: int) -> int:
    """The program's bucket of a wait of ``ns`` (for tests and thresholds)."""
    msb = max(ns, 1).bit_length() - 1
    if msb < 2:
        return 8
    return msb * 4 + ((ns >> (msb - 2)) & 3)


@dataclass(frozen=True)
class AttributedWait:
    """One long wait of a watched thread, and what held its CPU meanwhile (``parts``: (kind, id, ns),
    at most four holders; the rest of the wait, if any, was not attributed)."""

    tid: int
    cpu: int
    wait_ns: int
    end_ns: int  # CLOCK_MONOTONIC
    parts: tuple[tuple[str, int, int], ...]

    @property
    def not_attributed_ns(self) -> int:
        return max(0, self.wait_ns - sum(ns for _, _, ns in self.parts))


class _Part(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_uint32), ("id", ctypes.c_uint32), ("ns", ctypes.c_uint64)]


class _AttributedWaitRecord(ctypes.Structure):
    _fields_ = [("tid", ctypes.c_uint32), ("cpu", ctypes.c_uint32), ("length_ns", ctypes.c_uint64),
                ("end_ns", ctypes.c_uint64), ("counted_ns", ctypes.c_uint64), ("parts", _Part * 4)]


class AttributingProbe(BpfProbe):
    """BpfProbe's program, its waits summed in the kernel, with per (CPU, holder) sums of the
    watched threads' wait time. ``drain`` returns nothing: read ``attribution()``.

    ``alarm_ns``: also hand each wait of at least that long to user space with its holders
    (``attributed_waits()``). watch keeps the probe loaded but detached (``detach``), and attaches
    it only around the worst waits (``attach``, which first forgets what the probe kept)."""

    name = "bpf"

    def __init__(self, max_threads: int = 16384, ring_pages: int = 256, alarm_ns: int | None = None):
        super().__init__(max_threads, ring_pages, variant="raw", summed=True)
        self.alarm_ns = alarm_ns
        self._attributed: list[AttributedWait] = []
        self._detached: list[tuple[bytes, bytes]] = []

    def start(self, tids) -> None:
        if not _raw_tracepoints_usable():
            raise ProbeError("attributing wait time needs raw tracepoints and the kernel's BTF "
                             "(Linux 5.18 or later with /sys/kernel/btf/vmlinux)")
        super().start(tids)
        if self.alarm_ns is not None:
            self._bpf[b"attributed_waits"].open_ring_buffer(self._on_attributed)

    def _program(self) -> tuple[str, list[str]]:
        try:
            cflags = [f"-DCPU_OFFSET={_task_cpu_offset()}", f"-DON_CPU_OFFSET={member_offset('task_struct', 'on_cpu')}",
                      f"-DPOLICY_OFFSET={member_offset('task_struct', 'policy')}", f"-DMAX_CPUS={_possible_cpus()}"]
        except BtfError as err:
            raise ProbeError(f"cannot attribute wait time on this kernel: {err}") from err
        if self.alarm_ns is not None:
            cflags.append(f"-DALARM_ATTRIBUTED_NS={int(self.alarm_ns)}ULL")
        return COMMON + ATTRIBUTION + RAW_BODY, cflags

    @property
    def attached(self) -> bool:
        return not self._detached

    def detach(self) -> None:
        """Stop its programs running (they stay loaded: attaching again takes milliseconds, not a compile)."""
        fds = self._bpf.raw_tracepoint_fds
        for tracepoint in list(fds):
            self._detached.append((tracepoint, b"raw_tracepoint__" + tracepoint))
            self._bpf.detach_raw_tracepoint(tp=tracepoint)

    def attach(self, tids) -> None:
        """Forget every sum, slot and watched thread, watch ``tids``, and run the programs again."""
        for table in (b"cpu_states", b"held", b"tail", b"waits", b"idle_waits", b"holder_names", b"waiting_on",
                      b"start", b"latency_hist", b"latency_max"):
            self._bpf[table].clear()
        tids = set(tids)
        self._watch_bitmap(self._watched - tids, watched_bits=False)  # exited while no program ran: ids reused
        self._watched &= tids
        self.watch(tids)
        self._attributed = []
        for tracepoint, function in self._detached:
            self._bpf.attach_raw_tracepoint(tp=tracepoint, fn_name=function)
        self._detached = []

    def _on_attributed(self, ctx, data, size) -> None:
        record = ctypes.cast(data, ctypes.POINTER(_AttributedWaitRecord)).contents
        parts = tuple((KIND_NAMES.get(p.kind, str(p.kind)), int(p.id), int(p.ns)) for p in record.parts if p.ns)
        self._attributed.append(AttributedWait(int(record.tid), int(record.cpu), int(record.length_ns),
                                               int(record.end_ns), parts))

    def attributed_waits(self) -> list[AttributedWait]:
        """The long waits handed over since the last call, with their holders (a poll that does not block)."""
        if self._bpf is None or self.alarm_ns is None:
            return []
        self._bpf.ring_buffer_consume()
        taken, self._attributed = self._attributed, []
        return taken

    def holder_names(self) -> dict[int, dict]:
        """Thread id -> {"comm", "tgid", "policy"} of each task seen holding a CPU since the last attach."""
        return {k.value: {"comm": v.comm.decode(errors="replace"), "tgid": v.tgid, "policy": v.policy}
                for k, v in self._bpf[b"holder_names"].items()}

    def attribution(self) -> Attribution:
        """The sums so far (read while the probe runs, or before stop)."""
        kinds = KIND_NAMES
        held = [HeldRecord(k.cpu, kinds.get(k.kind, str(k.kind)), k.id, v.value)
                for k, v in self._bpf[b"held"].items() if v.value]
        tail = [TailRecord(kinds.get(k.kind, str(k.kind)), k.id, k.bucket, v.value)
                for k, v in self._bpf[b"tail"].items() if v.value]
        waits = {k.value: v.value for k, v in self._bpf[b"waits"].items()}
        idle_waits = {k.value: v.value for k, v in self._bpf[b"idle_waits"].items()}
        names = self.holder_names()
        counts = self.wait_counts()
        latencies = {int(bucket): int(counts[bucket]) for bucket in np.flatnonzero(counts)}
        return Attribution(held, tail, waits, idle_waits, names, latencies, self.longest_wait_ns())


def _task_cpu_offset() -> int:
    """Where a task's CPU is: task_struct.cpu, or thread_info.cpu inside it (x86)."""
    try:
        return member_offset("task_struct", "cpu")
    except BtfError:
        return member_offset("task_struct", "thread_info") + member_offset("thread_info", "cpu")


def _possible_cpus() -> int:
    """How many CPU numbers this kernel may use (the per-CPU array's size).

    Read from the live kernel, not through a Host: the BPF program it sizes runs in this kernel,
    whatever root a Host was given."""
    try:
        with open("/sys/devices/system/cpu/possible") as handle:
            return max(parse_cpu_list(handle.read())) + 1
    except (OSError, ValueError):
        return 1024


__all__ = ["AttributedWait", "AttributingProbe", "Attribution", "HeldRecord", "TailRecord", "bucket_lower_ns", "bucket_of"]
