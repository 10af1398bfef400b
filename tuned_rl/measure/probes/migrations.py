"""Each target thread's CPU migrations, and the run-queue waits that followed one, counted in the kernel.

The second field report's CUDA-stream threads moved between cores; its fix was pinning them. Two
raw tracepoints, for the watched threads only (a hash of thread ids that user space fills):

- ``sched_migrate_task`` (the task, its new CPU): one more migration for the thread, and a mark
  that it moved since it last ran;
- ``sched_switch``, for the thread switched out (``prev``, whose scheduler counts are current):
  its ``sched_info.run_delay`` grew by the wait that preceded this run, and ``pcount`` by the
  runs. That wait goes to the thread's histogram (one bucket per doubling of ns), and to a second
  one if the thread had moved before it (then the mark is cleared). The first switch seen of a
  thread only takes its counts as the base.

Offsets (task_struct.pid, task_struct.sched_info) come from the running kernel's BTF.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Iterable

from tuned_rl.measure.probes.base import ProbeError
from tuned_rl.measure.probes.btf import member_offset
from tuned_rl.measure.probes.bpf import FINE_BUCKET_C, recursion_misses

DOUBLINGS = 64

PROGRAM = r"""
#define DOUBLINGS 64
#define FINE_BUCKETS 1024
struct thread_moves {
    u64 migrations;
    u64 last_delay;
    u64 last_runs;
    u32 primed;
    u32 moved;
    u32 waits[DOUBLINGS];
    u32 after_move[DOUBLINGS];
};
BPF_HASH(threads, u32, struct thread_moves, MAX_THREADS);

FINE_BUCKET_C
static __always_inline u32 doubling_of(u64 v) {
    return msb_of(v) & (DOUBLINGS - 1);
}

RAW_TRACEPOINT_PROBE(sched_migrate_task) {
    u32 tid = 0;
    bpf_probe_read_kernel(&tid, sizeof(tid), (char *)ctx->args[0] + PID_OFFSET);
    struct thread_moves *t = threads.lookup(&tid);
    if (!t)
        return 0;
    __sync_fetch_and_add(&t->migrations, 1);
    t->moved = 1;
    return 0;
}

RAW_TRACEPOINT_PROBE(sched_switch) {
    char *prev = (char *)ctx->args[1];
    u32 tid = 0;
    bpf_probe_read_kernel(&tid, sizeof(tid), prev + PID_OFFSET);
    struct thread_moves *t = threads.lookup(&tid);
    if (!t)
        return 0;
    u64 runs = 0, delay = 0;
    bpf_probe_read_kernel(&runs, sizeof(runs), prev + SCHED_INFO_OFFSET);
    bpf_probe_read_kernel(&delay, sizeof(delay), prev + SCHED_INFO_OFFSET + 8);
    if (!t->primed) {
        t->primed = 1;
        t->last_runs = runs;
        t->last_delay = delay;
        t->moved = 0;
        return 0;
    }
    u64 arrived = runs - t->last_runs;
    u64 waited = delay - t->last_delay;
    t->last_runs = runs;
    t->last_delay = delay;
    if (arrived == 0)
        return 0;
    u32 bucket = doubling_of(waited / arrived);
    __sync_fetch_and_add(&t->waits[bucket], (u32)arrived);
    if (t->moved) {
        __sync_fetch_and_add(&t->after_move[bucket], 1);
        t->moved = 0;
    }
    return 0;
}
""".replace("FINE_BUCKET_C\n", FINE_BUCKET_C)


@dataclass(frozen=True)
class ThreadMoves:
    """One thread's migrations and waits (per doubling: bucket k holds waits of 2^k .. 2^(k+1) ns)."""

    tid: int
    migrations: int
    waits: tuple[int, ...]
    after_move: tuple[int, ...]

    def to_dict(self) -> dict:
        return {"tid": self.tid, "migrations": self.migrations,
                "waits": {str(k): n for k, n in enumerate(self.waits) if n},
                "after_move": {str(k): n for k, n in enumerate(self.after_move) if n}}

    @classmethod
    def from_dict(cls, data: dict) -> "ThreadMoves":
        def spread(counts: dict) -> tuple[int, ...]:
            return tuple(int(counts.get(str(k), 0)) for k in range(DOUBLINGS))
        return cls(int(data["tid"]), int(data["migrations"]), spread(data["waits"]), spread(data["after_move"]))


class MigrationProbe:
    """Counts the watched threads' migrations: ``start(tids)``, ``watch(tids)``, ``moves()``, ``stop()``."""

    def __init__(self, max_threads: int = 4096):
        self.max_threads = max_threads
        self._bpf = None
        self._watched: set[int] = set()
        self.untracked = 0  # threads beyond max_threads

    def start(self, tids: Iterable[int]) -> None:
        from bcc import BPF  # imported here: the rest of tuned-rl works without BCC
        cflags = [f"-DMAX_THREADS={self.max_threads}", "-w",
                  f"-DPID_OFFSET={member_offset('task_struct', 'pid')}",
                  f"-DSCHED_INFO_OFFSET={member_offset('task_struct', 'sched_info')}"]
        try:
            self._bpf = BPF(text=PROGRAM.encode(), cflags=cflags)
        except Exception as err:  # BCC raises bare Exception on compile or load failure
            raise ProbeError(f"the migration counter failed to load: {err}") from err
        self.watch(tids)

    def watch(self, tids: Iterable[int]) -> None:
        threads = self._bpf[b"threads"]
        for tid in set(tids) - self._watched:
            if len(self._watched) >= self.max_threads:
                self.untracked += 1
                continue
            threads[ctypes.c_uint32(tid)] = threads.Leaf()
            self._watched.add(tid)

    def moves(self) -> list[ThreadMoves]:
        found = []
        for key, leaf in self._bpf[b"threads"].items():
            found.append(ThreadMoves(int(key.value), int(leaf.migrations), tuple(int(n) for n in leaf.waits),
                                     tuple(int(n) for n in leaf.after_move)))
        return sorted(found, key=lambda m: m.tid)

    @property
    def lost(self) -> int:
        return self.untracked + sum(recursion_misses(f.fd) for f in self._bpf.funcs.values()) if self._bpf else 0

    def stop(self) -> None:
        if self._bpf is not None:
            self._bpf.cleanup()
            self._bpf = None
