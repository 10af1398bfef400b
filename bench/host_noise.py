"""A contended hypervisor, emulated inside this VM: to try a kernel test's bar on a noisy machine.

On a busy host the hypervisor takes a virtual CPU away for milliseconds at a time (the steal
time /proc/stat counts), and wakes a halted one late. A fresh CI machine of this kind read a
quiet workload p999 of 0.8-2.8 ms, with 20-240 ms stolen from a CPU in 10 s, where a quiet hour
here reads 0.03-0.1 ms; a bar set on the quiet machine then fails on the noisy one. Nothing in
the guest can move such a stall, so neither can this one: two small BPF programs take the CPU
in the kernel, where no cpuset, affinity or scheduling policy reaches.

- A busy CPU is taken away: a per-CPU ``cpu-clock`` timer fires every millisecond while the CPU
  runs something (it does not fire in idle), and with ``--steal-share`` / mean length chance,
  the program spins for a length drawn uniformly from ``--steal-ms LOW-HIGH``.
- A halted CPU wakes late: when a CPU leaves idle (``power:cpu_idle``, state -1), with
  ``--wake-chance`` the program spins ``--wake-ms LOW-HIGH`` before the idle loop can run
  what woke it.

A program may loop about 4,000 times (the verifier's limit on one path), so a long spin tail-calls
the same program again (at most 33 times: about 4 ms here); the report says what was taken.

    sudo .venv/bin/python bench/host_noise.py [--steal-share 0.02] [--steal-ms 1-4] [--wake-chance 0.01]
                                              [--wake-ms 0.5-2.5] [--seconds N | -- COMMAND ...]

With a command (a test, a scenario), the noise lasts as long as it runs, and its exit status is
returned; while a classic tracepoint or perf program spins, other such programs on that CPU are
skipped (the kernel's shared recursion guard): tuned-rl's default probes use raw tracepoints.
"""

from __future__ import annotations

import argparse
import ctypes
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass

SPIN = r"""
struct spin { u64 until; u64 taken_ns; u64 times; };  // per CPU: the spin under way, and totals

// A spin under way, or one begun now with a chance of ``ppm`` in a million (when ``may_begin``).
static __always_inline bool spinning(struct spin *spin, bool may_begin, u32 ppm, u64 low_ns, u64 high_ns) {
    if (spin->until == 0) {
        if (!may_begin || bpf_get_prandom_u32() % 1000000 >= ppm)
            return false;
        spin->until = bpf_ktime_get_ns() + low_ns + bpf_get_prandom_u32() % (high_ns - low_ns + 1);
        spin->times++;
    }
    return true;
}

// Spin toward the deadline, at most 4,000 clock reads; true while it is still ahead (then the
// caller tail-calls its program again); else the spin is over.
static __always_inline bool spun_short(struct spin *spin) {
    u64 now = bpf_ktime_get_ns(), began = now;
#pragma clang loop unroll(disable)
    for (int i = 0; i < 4000; i++) {
        now = bpf_ktime_get_ns();
        if (now >= spin->until)
            break;
    }
    spin->taken_ns += now - began;
    if (now < spin->until)
        return true;
    spin->until = 0;
    return false;
}

BPF_PROG_ARRAY(steal_again, 1);
BPF_PERCPU_ARRAY(steal, struct spin, 1);

int take_busy_cpu(struct bpf_perf_event_data *ctx) {
    int zero = 0;
    struct spin *spin = steal.lookup(&zero);
    if (spin && spinning(spin, true, STEAL_PPM, STEAL_LOW_NS, STEAL_HIGH_NS) && spun_short(spin)) {
        steal_again.call(ctx, 0);
        spin->until = 0;  // no tail call left: the spin ends here
    }
    return 0;
}

BPF_PROG_ARRAY(wake_again, 1);
BPF_PERCPU_ARRAY(wake, struct spin, 1);

TRACEPOINT_PROBE(power, cpu_idle) {
    int zero = 0;
    struct spin *spin = wake.lookup(&zero);
    if (spin && spinning(spin, args->state == (u32)-1, WAKE_PPM, WAKE_LOW_NS, WAKE_HIGH_NS) && spun_short(spin)) {
        wake_again.call(args, 0);
        spin->until = 0;
    }
    return 0;
}
"""

TIMER_PERIOD_NS = 1_000_000  # the busy CPU's chance comes once a millisecond


@dataclass
class Noise:
    """What to take: a busy CPU's share, and a waking CPU's chance, with their lengths in ms."""

    steal_share: float = 0.02
    steal_ms: tuple[float, float] = (1.0, 4.0)
    wake_chance: float = 0.01
    wake_ms: tuple[float, float] = (0.5, 2.5)

    def cflags(self) -> list[str]:
        mean_ms = sum(self.steal_ms) / 2
        steal_ppm = round(min(1.0, self.steal_share / mean_ms * TIMER_PERIOD_NS / 1e6) * 1e6)
        ns = lambda ms: int(ms * 1e6)  # noqa: E731
        return [f"-DSTEAL_PPM={steal_ppm}", f"-DSTEAL_LOW_NS={ns(self.steal_ms[0])}",
                f"-DSTEAL_HIGH_NS={ns(self.steal_ms[1])}", f"-DWAKE_PPM={round(self.wake_chance * 1e6)}",
                f"-DWAKE_LOW_NS={ns(self.wake_ms[0])}", f"-DWAKE_HIGH_NS={ns(self.wake_ms[1])}"]


@contextmanager
def host_noise(noise: Noise = Noise()):
    """The noise, while the block runs; yields a function that says what was taken so far."""
    from bcc import BPF, PerfSWConfig, PerfType
    bpf = BPF(text=SPIN, cflags=noise.cflags())
    try:
        for program, array, kind in (("take_busy_cpu", "steal_again", BPF.PERF_EVENT),
                                     ("tracepoint__power__cpu_idle", "wake_again", BPF.TRACEPOINT)):
            bpf[array][ctypes.c_int(0)] = ctypes.c_int(bpf.load_func(program, kind).fd)
        bpf.attach_perf_event(ev_type=PerfType.SOFTWARE, ev_config=PerfSWConfig.CPU_CLOCK, fn_name="take_busy_cpu",
                              sample_period=TIMER_PERIOD_NS)
        started = time.monotonic()

        def taken() -> str:
            steal, wake = (bpf[table][ctypes.c_int(0)] for table in ("steal", "wake"))
            return f"in {time.monotonic() - started:.0f} s: " + "; ".join(
                f"cpu{cpu} {steal[cpu].taken_ns / 1e6:.0f} ms taken while busy ({steal[cpu].times} times), wakes "
                f"delayed {wake[cpu].taken_ns / 1e6:.0f} ms ({wake[cpu].times} times)" for cpu in range(len(steal)))
        yield taken
    finally:
        bpf.cleanup()


def _range(text: str) -> tuple[float, float]:
    low, _, high = text.partition("-")
    low_ms, high_ms = float(low), float(high or low)
    if not 0 < low_ms <= high_ms <= 4:
        raise argparse.ArgumentTypeError("LOW-HIGH in ms, 0 < LOW <= HIGH <= 4 (a spin is at most about 4 ms)")
    return low_ms, high_ms


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steal-share", type=float, default=Noise.steal_share,
                        help="share of a busy CPU's time taken (default %(default)s)")
    parser.add_argument("--steal-ms", type=_range, default=Noise.steal_ms, help="each take's length, LOW-HIGH ms")
    parser.add_argument("--wake-chance", type=float, default=Noise.wake_chance,
                        help="chance that a CPU leaving idle is delayed (default %(default)s)")
    parser.add_argument("--wake-ms", type=_range, default=Noise.wake_ms, help="each delay's length, LOW-HIGH ms")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long, without a command")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...: run it under the noise")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    noise = Noise(args.steal_share, args.steal_ms, args.wake_chance, args.wake_ms)
    with host_noise(noise) as taken:
        status = subprocess.call(command) if command else (time.sleep(args.seconds) or 0)
        print(f"host noise {taken()}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
