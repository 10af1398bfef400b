"""The ioctl timer: how long the target's threads spend in a driver's ioctl function (the second
field report timed DMA submission with ``kprobe:nvidia_ioctl`` / ``kretprobe``), each call's length
summed in a histogram in the kernel.

Two ways to catch the call, the first the kernel allows:

- **kprobe**: a kprobe on the function's entry and a kretprobe on its return (BCC's
  attach_kprobe / attach_kretprobe). Needs CONFIG_KPROBES: the kernel then lists a "kprobe" PMU
  in /sys/bus/event_source/devices.
- **syscall**: without kprobes, the ioctl(2) system call's tracepoints (syscalls:sys_enter_ioctl
  and sys_exit_ioctl), counted only when the file the call is on has the function as its
  ``file_operations.unlocked_ioctl`` (read through current->files, offsets from the kernel's BTF,
  compared with the function's address in /proc/kallsyms). The time is then the whole system
  call's: the driver's function and the few hundred ns of the call around it.

The function must be a text symbol of the running kernel or a loaded module (/proc/kallsyms, as
root); otherwise the timer is absent and says why.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from tuned_rl.rendering import format_table
from tuned_rl.host import Host
from tuned_rl.measure.probes.base import ProbeError
from tuned_rl.measure.probes.bpf import FINE_BUCKET_C, FINE_BUCKET_MIDDLES, recursion_misses
from tuned_rl.measure.probes.btf import BtfError, member_offset
from tuned_rl.measure.stats import format_us, quantile_ns

KPROBE_PMU = "/sys/bus/event_source/devices/kprobe"
SYSCALL_TRACEPOINT = "/sys/kernel/tracing/events/syscalls/sys_enter_ioctl"
DEFAULT_FUNCTION = "nvidia_ioctl"  # the NVIDIA driver's ioctl entry (nvidia.ko), the report's probe
NVIDIA_MODULE = "/sys/module/nvidia"

PROGRAM = r"""
#define FINE_BUCKETS 1024
FINE_BUCKET_C
struct call_counts { u64 counts[FINE_BUCKETS]; };
BPF_ARRAY(call_hist, struct call_counts, 1);
BPF_PERCPU_ARRAY(call_sum, u64, 1);
BPF_PERCPU_ARRAY(call_max, u64, 1);
BPF_PERCPU_ARRAY(call_lost, u64, 1);
BPF_HASH(watched, u32, u8, MAX_THREADS);
BPF_HASH(started, u32, u64, MAX_THREADS);

static __always_inline void call_began(u32 tid) {
    u64 now = bpf_ktime_get_ns();
    if (started.update(&tid, &now)) {
        int zero = 0;
        u64 *lost = call_lost.lookup(&zero);
        if (lost)
            (*lost)++;
    }
}

static __always_inline void call_ended(void) {
    u32 tid = bpf_get_current_pid_tgid();
    u64 *start = started.lookup(&tid);
    if (!start)
        return;
    u64 ns = bpf_ktime_get_ns() - *start;
    started.delete(&tid);
    int zero = 0;
    struct call_counts *hist = call_hist.lookup(&zero);
    if (hist)
        __sync_fetch_and_add(&hist->counts[fine_bucket_of(ns) & (FINE_BUCKETS - 1)], 1);
    u64 *sum = call_sum.lookup(&zero);
    if (sum)
        *sum += ns;
    u64 *longest = call_max.lookup(&zero);
    if (longest && ns > *longest)
        *longest = ns;
}

#ifdef KPROBE
int on_entry(struct pt_regs *ctx) {
    u32 tid = bpf_get_current_pid_tgid();
    if (watched.lookup(&tid))
        call_began(tid);
    return 0;
}

int on_return(struct pt_regs *ctx) {
    call_ended();
    return 0;
}
#else
// Whether the file behind fd has HANDLER as its unlocked_ioctl: current->files->fdt->fd[fd]->f_op.
static __always_inline int handled_by_function(u64 fd) {
    char *task = (char *)bpf_get_current_task();
    char *files = 0, *fdt = 0, *file = 0, *fops = 0;
    char **fds = 0;
    unsigned int max_fds = 0;
    u64 handler = 0;
    bpf_probe_read_kernel(&files, sizeof(files), task + FILES_OFFSET);
    if (!files)
        return 0;
    bpf_probe_read_kernel(&fdt, sizeof(fdt), files + FDT_OFFSET);
    if (!fdt)
        return 0;
    bpf_probe_read_kernel(&max_fds, sizeof(max_fds), fdt + MAX_FDS_OFFSET);
    if (fd >= max_fds)
        return 0;
    bpf_probe_read_kernel(&fds, sizeof(fds), fdt + FD_OFFSET);
    if (!fds)
        return 0;
    bpf_probe_read_kernel(&file, sizeof(file), fds + fd);
    if (!file)
        return 0;
    bpf_probe_read_kernel(&fops, sizeof(fops), file + F_OP_OFFSET);
    if (!fops)
        return 0;
    bpf_probe_read_kernel(&handler, sizeof(handler), fops + UNLOCKED_IOCTL_OFFSET);
    return handler == HANDLER;
}

TRACEPOINT_PROBE(syscalls, sys_enter_ioctl) {
    u32 tid = bpf_get_current_pid_tgid();
    if (watched.lookup(&tid) && handled_by_function(args->fd))
        call_began(tid);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_exit_ioctl) {
    call_ended();
    return 0;
}
#endif
""".replace("FINE_BUCKET_C\n", FINE_BUCKET_C)


class IoctlAbsent(ProbeError):
    """The function cannot be timed here (not in the kernel, or no way to catch it), with why."""


@dataclass(frozen=True)
class IoctlTimes:
    """The target's calls of the function, as the kernel summed them."""

    function: str
    how: str                 # "kprobe" or "syscall"
    counts: np.ndarray       # calls per fine bucket (bpf.FINE_BUCKET_MIDDLES)
    sum_ns: int
    longest_ns: int
    lost: int                # calls not timed (no room in the map; a skipped program run)

    @property
    def calls(self) -> int:
        return int(self.counts.sum())

    def to_dict(self) -> dict:
        """The report's figures: calls, total and mean time, p50/p99/p999 and the longest, in µs."""
        calls = self.calls
        figures = {"function": self.function, "how": self.how, "calls": calls, "lost": self.lost,
                   "total_ms": round(self.sum_ns / 1e6, 3)}
        if calls:
            figures.update(mean_us=round(self.sum_ns / calls / 1e3, 2),
                           **{f"{name}_us": round(min(quantile_ns(self.counts, FINE_BUCKET_MIDDLES, q),
                                                      self.longest_ns) / 1e3, 2)
                              for name, q in (("p50", 0.5), ("p99", 0.99), ("p999", 0.999))},
                           max_us=round(self.longest_ns / 1e3, 2))
        return figures


def kernel_symbol(host: Host, function: str) -> list[int]:
    """The addresses of the text symbol ``function`` in /proc/kallsyms (a module's too); [] if none."""
    addresses = []
    for line in host.read("/proc/kallsyms").splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] == function and fields[1] in ("t", "T"):
            addresses.append(int(fields[0], 16))
    return addresses


def how_to_time(host: Host, function: str) -> str:
    """"kprobe" or "syscall": how ``function`` can be timed on this kernel; IoctlAbsent saying why not."""
    if not function.isidentifier():
        raise IoctlAbsent(f"{function!r} is not a kernel function name")
    addresses = kernel_symbol(host, function)
    if not addresses:
        hint = (" (the nvidia module is not loaded)" if function == DEFAULT_FUNCTION and not host.exists(NVIDIA_MODULE)
                else "")
        raise IoctlAbsent(f"{function} is not a function of this kernel or its loaded modules (/proc/kallsyms){hint}")
    if set(addresses) == {0}:
        raise IoctlAbsent("/proc/kallsyms shows no addresses (kptr_restrict): run as root")
    if host.exists(KPROBE_PMU):
        return "kprobe"
    if not host.exists(SYSCALL_TRACEPOINT):
        raise IoctlAbsent("this kernel has neither kprobes (no kprobe PMU) nor the ioctl system call's tracepoints")
    if len(set(addresses)) > 1:
        raise IoctlAbsent(f"{function} names {len(set(addresses))} functions in /proc/kallsyms, and without kprobes "
                          "the timer matches one address")
    try:
        _file_offsets()
    except BtfError as err:
        raise IoctlAbsent(f"no kprobes, and the file offsets the system-call timer needs are unknown: {err}") from err
    return "syscall"


def _file_offsets() -> dict[str, int]:
    return {"FILES_OFFSET": member_offset("task_struct", "files"), "FDT_OFFSET": member_offset("files_struct", "fdt"),
            "MAX_FDS_OFFSET": member_offset("fdtable", "max_fds"), "FD_OFFSET": member_offset("fdtable", "fd"),
            "F_OP_OFFSET": member_offset("file", "f_op"),
            "UNLOCKED_IOCTL_OFFSET": member_offset("file_operations", "unlocked_ioctl")}


class IoctlTimer:
    """Times the watched threads' calls of ``function``: ``start(tids)``, ``watch(tids)``, ``times()``, ``stop()``."""

    def __init__(self, host: Host, function: str = DEFAULT_FUNCTION, max_threads: int = 16384):
        self.host, self.function, self.max_threads = host, function, max_threads
        self.how = how_to_time(host, function)
        self._bpf = None
        self._watched: set[int] = set()

    def describe(self) -> str:
        if self.how == "kprobe":
            return f"{self.function}: kprobe on its entry and kretprobe on its return"
        return (f"{self.function}: this kernel has no kprobes, so the ioctl(2) calls on files whose unlocked_ioctl "
                f"is {self.function} are timed whole (syscalls:sys_enter_ioctl/sys_exit_ioctl)")

    def start(self, tids: Iterable[int]) -> None:
        from bcc import BPF  # imported here: the rest of tuned-rl works without BCC

        cflags = [f"-DMAX_THREADS={self.max_threads}", "-w"]
        if self.how == "kprobe":
            cflags.append("-DKPROBE")
        else:
            [address] = set(kernel_symbol(self.host, self.function))
            cflags += [f"-DHANDLER={address}ULL", *(f"-D{k}={v}" for k, v in _file_offsets().items())]
        try:
            self._bpf = BPF(text=PROGRAM.encode(), cflags=cflags)
            if self.how == "kprobe":
                self._bpf.attach_kprobe(event=self.function.encode(), fn_name=b"on_entry")
                self._bpf.attach_kretprobe(event=self.function.encode(), fn_name=b"on_return",
                                           maxactive=max(64, 2 * os.cpu_count()))
        except Exception as err:  # BCC raises bare Exception on compile, load or attach failure
            self.stop()
            raise ProbeError(f"the ioctl timer ({self.describe()}) failed to load: {err}") from err
        self.watch(tids)

    def watch(self, tids: Iterable[int]) -> None:
        watched = self._bpf[b"watched"]
        for tid in set(tids) - self._watched:
            watched[ctypes.c_uint32(tid)] = ctypes.c_uint8(1)
            self._watched.add(tid)

    def times(self) -> IoctlTimes:
        zero = ctypes.c_int(0)
        counts = np.frombuffer(self._bpf[b"call_hist"][zero].counts, dtype=np.uint64).astype(np.int64)
        misses = sum(recursion_misses(function.fd) for function in self._bpf.funcs.values())
        return IoctlTimes(self.function, self.how, counts, int(sum(self._bpf[b"call_sum"][zero])),
                          int(max(self._bpf[b"call_max"][zero])), int(sum(self._bpf[b"call_lost"][zero])) + misses)

    def stop(self) -> None:
        if self._bpf is not None:
            self._bpf.cleanup()
            self._bpf = None



def attach_timer(stack, host: Host, function: str, tids: set[int], tid_source):
    """Start an IoctlTimer on ``tids``, stopped when ``stack`` closes; returns it and a tid source
    that also has the timer watch each thread it returns (a thread the target starts later)."""
    timer = IoctlTimer(host, function)
    timer.start(tids)
    stack.callback(timer.stop)

    def watching_source() -> set[int]:
        found = tid_source()
        timer.watch(found)
        return found
    return timer, watching_source


def format_times(figures: dict) -> list[str]:
    """The timer's figures (``IoctlTimes.to_dict``, or ``{"function", "absent"}``) as table lines."""
    if "absent" in figures:
        return [f"ioctl timer: {figures['function']} is not timed: {figures['absent']}"]
    if not figures["calls"]:
        return [f"ioctl timer: the target made no {figures['function']} call ({figures['how']})"]
    row = (figures["function"], str(figures["calls"]), f"{figures['total_ms']:.1f}ms",
           *(format_us(figures[k]) for k in ("mean_us", "p50_us", "p99_us", "p999_us", "max_us")),
           str(figures["lost"]), figures["how"])
    return format_table(("IOCTL", "CALLS", "TOTAL", "MEAN", "P50", "P99", "P999", "MAX", "LOST", "HOW"), [row])
