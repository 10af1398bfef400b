"""Who the target waited behind: the probe's per-(CPU, holder) sums, ranked by share of the wait.

Pure: takes the attribution the probe read, the target's measured latencies, and what the host
said about each holder (looked up while it still ran), and returns ranked holders. Threads of
one process are one holder; interrupts are one holder per IRQ line, softirqs one per vector.

"Worst 1%" is the longest waits, read from the probe's length buckets (four per doubling): from
the bucket boundary next to the p99 that leaves the share of waits beyond it closest to 1%. The
report says which share that is (on this VM, 0.6% to 2%).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tuned_rl.measure.probes.attribution import Attribution, bucket_lower_ns, bucket_of

LONG_WAIT_NS = 1_000_000  # an idle-only wait this long is not a CPU waking from idle: the host, or a throttle
SOFTIRQ_NAMES = ("HI", "TIMER", "NET_TX", "NET_RX", "BLOCK", "IRQ_POLL", "TASKLET", "SCHED", "HRTIMER", "RCU")


@dataclass
class HolderInfo:
    """What the host said about a task holder's process (empty fields if it had exited)."""

    pid: int
    comm: str
    cmdline: str = ""
    user: str = ""
    cgroup: str = ""        # its cpu cgroup (v1) or its v2 cgroup
    policy: str = ""
    kernel_thread: bool = False
    is_target: bool = False
    is_tuned_rl: bool = False
    bound: bool = False     # a per-CPU kernel thread the kernel will not move (kworker/N, ksoftirqd/N)


@dataclass
class Holder:
    """One thing that held a CPU while the target waited on it."""

    kind: str                  # task, idle, irq, softirq, not attributed
    key: str                   # "pid 1234", "irq 36", "softirq NET_RX", "idle", "not attributed"
    name: str                  # comm, IRQ name, vector name
    wait_ns: int = 0
    tail_ns: int = 0
    share_of_wait: float = 0.0
    share_of_tail: float = 0.0
    cpus: dict[int, int] = field(default_factory=dict)  # CPU -> ns held there
    info: HolderInfo | None = None

    @property
    def role(self) -> str:
        """What the holder is to the target: the target itself, tuned-rl, a kernel thread, or other."""
        if self.info is None:
            return "" if self.kind != "task" else "exited"
        if self.info.is_target:
            return "target"
        if self.info.is_tuned_rl:
            return "tuned-rl"
        return "kernel thread" if self.info.kernel_thread else "other"

    def to_dict(self) -> dict:
        data = {"kind": self.kind, "holder": self.key, "role": self.role, "name": self.name, "wait_ms": round(self.wait_ns / 1e6, 3),
                "tail_ms": round(self.tail_ns / 1e6, 3), "share_of_wait": round(self.share_of_wait, 4),
                "share_of_worst_1pct": round(self.share_of_tail, 4),
                "cpus": {str(c): round(ns / 1e6, 3) for c, ns in sorted(self.cpus.items())}}
        if self.info is not None:
            data.update({"pid": self.info.pid, "cmdline": self.info.cmdline, "user": self.info.user,
                         "cgroup": self.info.cgroup, "policy": self.info.policy,
                         "kernel_thread": self.info.kernel_thread, "is_target": self.info.is_target})
        return data


@dataclass
class Ranking:
    holders: list[Holder]
    wait_ns: int
    tail_ns: int
    tail_from_ns: int          # the shortest wait counted in the tail
    waits: int
    idle_only_waits: int       # waits during which only the idle task ran on the CPU
    idle_only_tail_waits: int
    tail_waits: int
    idle_only_long_waits: int = 0  # of them, waits of LONG_WAIT_NS or more

    def to_dict(self) -> dict:
        return {"wait_ms": round(self.wait_ns / 1e6, 3), "worst_1pct_ms": round(self.tail_ns / 1e6, 3),
                "worst_1pct_from_us": round(self.tail_from_ns / 1e3, 1), "waits": self.waits,
                "tail_waits": self.tail_waits, "idle_only_waits": self.idle_only_waits,
                "idle_only_tail_waits": self.idle_only_tail_waits, "idle_only_waits_1ms": self.idle_only_long_waits,
                "holders": [h.to_dict() for h in self.holders]}


def holder_identity(kind: str, ident: int, attribution: Attribution, irq_names: dict[int, str]
                    ) -> tuple[str, str, int | None]:
    """(key, name, process id or None) of a holder record."""
    if kind == "task":
        name = attribution.names.get(ident, {})
        pid = int(name.get("tgid") or ident)
        return f"pid {pid}", name.get("comm", "?"), pid
    if kind == "irq":
        return f"irq {ident}", irq_names.get(ident, ""), None
    if kind == "softirq":
        vector = SOFTIRQ_NAMES[ident] if ident < len(SOFTIRQ_NAMES) else str(ident)
        return f"softirq {vector}", vector, None
    return kind, kind, None


def _tail_from(attribution: Attribution) -> int:
    """Where the worst waits begin: the bucket boundary next to the p99 that leaves the share of
    waits beyond it closest to 1% (the bucket holding the p99 in, or out)."""
    p99 = attribution.latency_percentile_ns(99, beyond=True)
    if not p99:
        return 0
    total = sum(attribution.waits.values()) or 1
    candidates = [bucket_lower_ns(bucket_of(p99)), bucket_lower_ns(bucket_of(p99) + 1)]

    def share_beyond(start: int) -> float:
        return sum(n for b, n in attribution.waits.items() if bucket_lower_ns(b) >= start) / total
    return min(candidates, key=lambda start: (abs(share_beyond(start) - 0.01), start))


def rank(attribution: Attribution, infos: dict[int, HolderInfo], irq_names: dict[int, str]) -> Ranking:
    """Holders in order of their share of the target's worst-1% wait time, then of all its wait time."""
    tail_from = _tail_from(attribution)
    holders: dict[str, Holder] = {}

    def holder(kind: str, ident: int) -> Holder:
        key, name, pid = holder_identity(kind, ident, attribution, irq_names)
        if key not in holders:
            holders[key] = Holder(kind, key, name, info=infos.get(pid) if pid is not None else None)
        return holders[key]

    for record in attribution.held:
        entry = holder(record.kind, record.id)
        entry.wait_ns += record.ns
        entry.cpus[record.cpu] = entry.cpus.get(record.cpu, 0) + record.ns
    for record in attribution.tail:
        if bucket_lower_ns(record.bucket) >= tail_from:
            holder(record.kind, record.id).tail_ns += record.ns
    wait = sum(h.wait_ns for h in holders.values())
    tail = sum(h.tail_ns for h in holders.values())
    for entry in holders.values():
        entry.share_of_wait = entry.wait_ns / wait if wait else 0.0
        entry.share_of_tail = entry.tail_ns / tail if tail else 0.0
    ordered = sorted(holders.values(), key=lambda h: (-h.tail_ns, -h.wait_ns, h.key))
    in_tail = [b for b in attribution.waits if bucket_lower_ns(b) >= tail_from]
    return Ranking(ordered, wait, tail, tail_from, sum(attribution.waits.values()),
                   sum(attribution.idle_waits.values()),
                   sum(n for b, n in attribution.idle_waits.items() if b in in_tail),
                   sum(attribution.waits[b] for b in in_tail),
                   sum(n for b, n in attribution.idle_waits.items() if bucket_lower_ns(b) >= LONG_WAIT_NS))
