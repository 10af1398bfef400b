"""What does the BPF probe cost the rest of the machine? Its programs' own CPU time, counted by the
kernel, and a fixed job timed without the probe and with each of its programs, under two loads.

    .venv/bin/python bench/probe_overhead.py [--load storm|20k|both] [--rounds 20]
        [--arms sched_info,empty-switch,raw,empty,classic,raw-events,classic-events,sched_info-events,attributing,watch]

- storm: hackbench (rt-tests, -p -g 1 -l 10000), 100,000-200,000 context switches a second
  on this VM, every one of which passes through the probe's sched_switch handler; the job is
  hackbench.
- 20k: cyclictest wakes two threads every 200 us (about 20,000 context switches a second,
  a busy inference node's rate) while the job, one CPU-bound loop per CPU, runs; the job's
  wall time is what the switches take from the machine.

A canary runs throughout (every arm carries the same load); "sched_info" (the default), "raw"
and "classic" attach the probe's programs to it (tuned_rl/measure/probes/bpf.py) as tuned-rl
runs them, each wait summed in a histogram in the kernel; "-events" arms hand each wait to user
space through the ring buffer instead (as tuned-rl did before), "attributing" diagnose's program
(the raw one, its waits summed in the kernel, plus attribution on every switch and on the four
interrupt and softirq tracepoints: tuned_rl/measure/probes/attribution.py), "watch" the program
`tuned-rl watch` keeps attached all the time (sched_info's, its totals only, each wait of 10 ms
or more counted and handed over: tuned_rl/measure/probes/continuous.py). "empty" attaches
programs that return at once to the raw program's five raw tracepoints, "empty-switch" to the
sched_info program's three, to calibrate. Each round times the arms in
rotated order. Printed per arm, as medians with quartiles over the rounds:

- its cost as the kernel counts it (bpf_prog_info run_time_ns and run_cnt, with run-time
  statistics enabled through BPF_ENABLE_STATS while the bench runs): nanoseconds per run, and
  the share of the machine's CPU time the programs took during the job. No other process's noise
  enters it, but the statistics' own clock reads do: "empty" shows how much (tens of ns a run on
  this VM), so a program less its empty arm is the program's own work. It leaves
  out the tracepoint's dispatch, which for a classic tracepoint includes filling a trace record;
- the job's time with the probe over its time without, in the same round: what a user would
  notice, and on this shared VM noisy (the same job varies by 10-40% from run to run).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import platform
import re
import struct
import statistics
import subprocess
import sys
import time

from tuned_rl.host import Host
from tuned_rl.measure.canary import Canary, CanarySpec
from tuned_rl.measure.probes.attribution import AttributingProbe
from tuned_rl.measure.probes.bpf import _BPF_SYSCALL, BPF_OBJ_GET_INFO_BY_FD, BpfProbe
from tuned_rl.measure.probes.continuous import ContinuousProbe

HACKBENCH = ["hackbench", "-p", "-g", "1", "-l", "10000"]  # 40 tasks: steadier than many groups on 2 CPUs
WAKER = ["cyclictest", "-q", "-t", "2", "-i", "200", "-D", "24h"]
LOOP = "for _ in range(100_000_000): pass"


def context_switches() -> int:
    with open("/proc/stat") as stat:
        return int(next(line for line in stat if line.startswith("ctxt")).split()[1])


def hackbench_seconds() -> float:
    out = subprocess.run(HACKBENCH, capture_output=True, text=True, check=True).stdout
    return float(re.search(r"Time:\s*([\d.]+)", out)[1])


def loops_seconds() -> float:
    """One CPU-bound loop per CPU, started together; the wall time until the last ends."""
    started = time.monotonic()
    jobs = [subprocess.Popen(["taskset", "-c", str(cpu), sys.executable, "-S", "-c", LOOP]) for cpu in (0, 1)]
    for job in jobs:
        job.wait()
    return time.monotonic() - started


BPF_ENABLE_STATS, BPF_STATS_RUN_TIME = 32, 0


def enable_run_time_stats() -> int:
    """The kernel counts each BPF program's run time while the returned fd stays open."""
    attr = ctypes.create_string_buffer(struct.pack("=I", BPF_STATS_RUN_TIME), 128)
    fd = ctypes.CDLL(None, use_errno=True).syscall(_BPF_SYSCALL[platform.machine()], BPF_ENABLE_STATS, attr, 128)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "BPF_ENABLE_STATS failed")
    return fd


def run_stats(probe: BpfProbe) -> tuple[int, int]:
    """(nanoseconds, runs) of all the probe's programs so far."""
    total_ns = total_runs = 0
    for function in probe._bpf.funcs.values():
        info = ctypes.create_string_buffer(256)
        attr = ctypes.create_string_buffer(struct.pack("=IIQ", function.fd, 256, ctypes.addressof(info)), 128)
        ctypes.CDLL(None).syscall(_BPF_SYSCALL[platform.machine()], BPF_OBJ_GET_INFO_BY_FD, attr, 128)
        run_time_ns, run_cnt = struct.unpack_from("=QQ", info.raw, 192)
        total_ns, total_runs = total_ns + run_time_ns, total_runs + run_cnt
    return total_ns, total_runs


class EmptyPrograms:
    """Programs that return at once on the raw tracepoints a probe uses: the floor of any program there."""

    RAW = ("sched_wakeup", "sched_wakeup_new", "sched_switch", "sched_process_fork", "sched_process_exit")
    SCHED_INFO = ("sched_switch", "sched_process_fork", "sched_process_exit")

    def __init__(self, tracepoints: tuple[str, ...]):
        self.text = "".join(f"RAW_TRACEPOINT_PROBE({tp}) {{ return 0; }}\n" for tp in tracepoints)

    def start(self, tids) -> None:
        from bcc import BPF
        self._bpf = BPF(text=self.text.encode(), cflags=["-w"])

    def drain(self) -> None:
        pass

    def stop(self) -> None:
        self._bpf.cleanup()


def timed(arm: str, canary: Canary, job) -> tuple[float, int, int]:
    """The job's seconds, and the probe's program nanoseconds and runs meanwhile."""
    if arm == "none":
        return job(), 0, 0
    if arm == "empty":
        probe = EmptyPrograms(EmptyPrograms.RAW)
    elif arm == "empty-switch":
        probe = EmptyPrograms(EmptyPrograms.SCHED_INFO)
    elif arm == "attributing":
        probe = AttributingProbe()
    elif arm == "watch":
        probe = ContinuousProbe(alarm_ns=10_000_000)  # as `tuned-rl watch --alarm-ms 10` runs it all the time
    else:
        variant, _, delivery = arm.partition("-")
        probe = BpfProbe(variant=variant, summed=delivery != "events")
    probe.start(canary.tids())
    try:
        ns_before, runs_before = run_stats(probe)
        seconds = job()
        ns_after, runs_after = run_stats(probe)
        return seconds, ns_after - ns_before, runs_after - runs_before
    finally:
        if arm != "watch":
            probe.drain()
        probe.stop()


def run(load: str, rounds: int, arms: list[str]) -> None:
    job = hackbench_seconds if load == "storm" else loops_seconds
    waker = subprocess.Popen(WAKER, stdout=subprocess.DEVNULL) if load == "20k" else None
    arms = ["none", *arms]
    ratios: dict[str, list[float]] = {arm: [] for arm in arms[1:]}
    per_run: dict[str, list[float]] = {arm: [] for arm in arms[1:]}
    share: dict[str, list[float]] = {arm: [] for arm in arms[1:]}
    cpus = os.cpu_count()
    stats_fd = enable_run_time_stats()
    try:
        with Canary(CanarySpec(), Host()) as canary:
            started, before = time.monotonic(), context_switches()
            job()
            rate = (context_switches() - before) / (time.monotonic() - started)
            print(f"{load}: {rate:,.0f} context switches/s on the machine during the job", flush=True)
            for number in range(rounds):
                order = arms[number % len(arms):] + arms[:number % len(arms)]  # no arm always goes first
                results = {arm: timed(arm, canary, job) for arm in order}
                for arm in ratios:
                    seconds, ns, runs = results[arm]
                    ratios[arm].append(seconds / results["none"][0])
                    per_run[arm].append(ns / max(runs, 1))
                    share[arm].append(ns / (seconds * 1e9 * cpus))
                print(f"round {number + 1:2d}: " + ", ".join(
                    f"{arm} {results[arm][0]:.3f} s" + (f" ({per_run[arm][-1]:.0f} ns x {results[arm][2]:,} runs)"
                                                        if arm != "none" else "") for arm in arms), flush=True)
    finally:
        os.close(stats_fd)
        if waker:
            waker.terminate()
            waker.wait()
    for arm, floor in (("sched_info", "empty-switch"), ("watch", "empty-switch"), ("raw", "empty"),
                       ("attributing", "raw")):
        if arm in ratios and floor in ratios:
            net = [r - e for r, e in zip(per_run[arm], per_run[floor])]
            net_share = [r - e for r, e in zip(share[arm], share[floor])]
            print(f"{load}, {rounds} rounds, {arm} less {floor}: {_spread(net, '.0f')} ns a run, "
                  f"{_spread([100 * s for s in net_share], '.3f')}% of the machine's CPU", flush=True)
    for arm in ratios:
        print(f"{load}, {rounds} rounds, {arm}: programs {_spread(per_run[arm], '.0f')} ns a run, "
              f"{_spread([100 * s for s in share[arm]], '.3f')}% of the machine's CPU; job time with/without "
              f"{_spread(ratios[arm], '.4f')}", flush=True)


def _spread(values: list[float], form: str) -> str:
    """"median (quartiles low-high)"."""
    low, _, high = statistics.quantiles(values, n=4)
    return f"{statistics.median(values):{form}} (quartiles {low:{form}}-{high:{form}})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--load", choices=["storm", "20k", "both"], default="both")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--arms", default="sched_info,empty-switch,raw,empty,classic,attributing",
                        help="probes to time against none (attributing: diagnose's program)")
    args = parser.parse_args()
    for load in (["storm", "20k"] if args.load == "both" else [args.load]):
        run(load, args.rounds, args.arms.split(","))


if __name__ == "__main__":
    main()
