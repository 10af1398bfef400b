"""diagnose without the kernel: recorded attribution from the lab's two cases replayed, and the
rules, buckets, machine detection and profile writing on data made by hand."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:
    import tomli as tomllib

from tuned_rl.core.plugin_host import load_plugins
from tuned_rl.diagnose import facts
from tuned_rl.measure import holder_lookup
from tuned_rl.diagnose.findings import Evidence, find_causes
from tuned_rl.measure.holders import HolderInfo, rank
from tuned_rl.diagnose.profile_writer import write_profile
from tuned_rl.diagnose.run import replay
from tuned_rl.measure.probes.attribution import Attribution, HeldRecord, TailRecord, bucket_lower_ns, bucket_of
from tuned_rl.measure.probes.bpf import fine_bucket_range
from tuned_rl.measure.targets import Target
from tuned_rl.profiles.loader import load_profile

DATA = Path(__file__).parent / "data"
OFFLINE_JOB = "tuned-rl-lab-offline-job"  # bench/scenarios/lab.py: in every CPU hog's command line


def recorded(name: str) -> dict:
    return json.loads((DATA / f"diagnose_{name}.json").read_text())


# -- the lab's recordings ---------------------------------------------------------------------

def test_recorded_noisy_neighbour_names_the_jobs_as_the_top_holders_of_the_worst_waits():
    diagnosis = replay(recorded("noisy"))
    top = diagnosis.ranking.holders[:3]
    assert all(OFFLINE_JOB in h.info.cmdline for h in top), [h.key for h in top]
    jobs = sum(h.share_of_tail for h in diagnosis.ranking.holders if h.info and OFFLINE_JOB in h.info.cmdline)
    assert jobs >= 0.8
    # Every microsecond of waiting is in the sums: the holders' worst-1% shares add up to all of it.
    assert sum(h.share_of_tail for h in diagnosis.ranking.holders) == pytest.approx(1.0)
    assert diagnosis.findings[0].cause == "offline-jobs" and diagnosis.findings[0].table == "offline_eviction"


def test_the_profile_written_for_the_noisy_neighbour_evicts_the_jobs_and_spares_the_workload(tmp_path, tree):
    recording = recorded("noisy")
    diagnosis = replay(recording)
    text = write_profile("diagnosed", diagnosis.target, None, diagnosis.findings, diagnosis.latency)
    tables = tomllib.loads(text)
    assert tables["target"] == {"name": diagnosis.target.value}
    eviction = tables["offline_eviction"]
    assert eviction["policy"] == "SCHED_IDLE"
    patterns = [re.compile(m.get("cmdline") or m["name"]) for m in eviction["match"]]
    jobs = [h for h in recording["holders"].values() if OFFLINE_JOB in h["cmdline"]]
    workload = [h for h in recording["holders"].values() if h["is_target"]]
    assert jobs and workload
    assert all(any(p.search(j["cmdline"]) for p in patterns) for j in jobs)
    assert not any(p.search(w["cmdline"]) for p in patterns for w in workload)
    assert "# Finding (offline-jobs)" in text and "# Finding (virtual-machine)" in text
    path = tmp_path / "diagnosed.toml"
    path.write_text(text)
    assert load_plugins().validate(load_profile(path), tree.host) == []


def test_recorded_rt_throttling_names_the_cgroup_and_its_budget(tmp_path, tree):
    recording = recorded("rt")
    diagnosis = replay(recording)
    throttling = next(f for f in diagnosis.findings if f.cause == "rt-throttling")
    assert throttling.table == "rt_runtime"
    assert throttling.settings == {"cgroup": "/tuned-rl-lab-diagnose-rt", "cgroup_runtime_us": 950000}
    assert any("cpu.rt_runtime_us 500000 of cpu.rt_period_us 1000000" in line for line in throttling.evidence)
    # A throttled CPU runs the idle task: the VM finding must not blame those waits on the host.
    vm = next(f for f in diagnosis.findings if f.cause == "virtual-machine")
    assert any("RT throttling found above explains them" in line for line in vm.evidence)
    text = write_profile("diagnosed", diagnosis.target, None, diagnosis.findings, diagnosis.latency)
    assert tomllib.loads(text)["rt_runtime"] == throttling.settings
    tree.cgroup("tuned-rl-lab-diagnose-rt", runtime=500000)
    path = tmp_path / "diagnosed.toml"
    path.write_text(text)
    assert load_plugins().validate(load_profile(path), tree.host) == []


def test_recordings_say_this_host_is_a_firecracker_guest_with_steal_measured():
    for name in ("noisy", "rt"):
        vm = next(f for f in replay(recorded(name)).findings if f.cause == "virtual-machine")
        assert vm.table is None
        assert "KVM (Firecracker)" in vm.evidence[0]
        assert any(line.startswith("steal time during the") for line in vm.evidence)
        assert "dedicated (pinned) cores" in vm.advice


# -- ranking on data made by hand -------------------------------------------------------------

def _attribution(held, tail, latencies, names=None, waits=None) -> Attribution:
    return Attribution([HeldRecord(*h) for h in held], [TailRecord(*t) for t in tail], waits or {}, {},
                       names or {}, latencies, max(fine_bucket_range(b)[0] for b in latencies))


def test_the_worst_1pct_is_read_apart_from_the_rest():
    # 990 short waits (10 us) all behind pid 20; 10 long waits (5 ms) all behind pid 30.
    short, long = 10_000, 5_000_000
    fine = {_fine(short): 990, _fine(long): 10}
    attribution = _attribution(
        held=[(0, "task", 20, 990 * short), (0, "task", 30, 10 * long)],
        tail=[("task", 20, bucket_of(short), 990 * short), ("task", 30, bucket_of(long), 10 * long)],
        latencies=fine, names={20: {"comm": "a", "tgid": 20}, 30: {"comm": "b", "tgid": 30}})
    ranking = rank(attribution, {}, {})
    assert [h.key for h in ranking.holders] == ["pid 30", "pid 20"]
    assert ranking.holders[0].share_of_tail == 1.0
    assert ranking.holders[1].share_of_wait == pytest.approx(990 * short / (990 * short + 10 * long))


def _fine(ns: int) -> int:
    msb = ns.bit_length() - 1
    return msb * 16 + ((ns >> (msb - 4)) & 15)


@pytest.mark.parametrize("ns", [4, 100, 999, 1000, 65_536, 1_234_567, 400_000_000])
def test_a_wait_falls_inside_its_buckets(ns):
    lower = bucket_lower_ns(bucket_of(ns))
    assert lower <= ns < bucket_lower_ns(bucket_of(ns) + 1) or ns < 4
    fine_lower, width = fine_bucket_range(_fine(ns)) if ns >= 16 else (0, 16)
    assert fine_lower <= ns < fine_lower + width


def test_percentiles_from_the_kernel_histogram():
    attribution = _attribution([], [], {_fine(1000): 500, _fine(2000): 490, _fine(300_000): 10})
    assert attribution.latency_percentile_ns(50) == pytest.approx(1000, rel=0.05)
    assert attribution.latency_percentile_ns(99.9) == pytest.approx(300_000, rel=0.05)
    assert attribution.latency_summary()["n"] == 1000


# -- the rules on evidence made by hand -------------------------------------------------------

def _evidence(held, machine=None, threads=None, kernel=(), bound=(), **extra) -> Evidence:
    """Evidence from (CPU, kind, id, ns) records; task ids in ``kernel`` are kernel threads (``bound``: per-CPU)."""
    latencies = {_fine(1_000_000): 100}
    tail = [(kind, ident, bucket_of(1_000_000), ns) for _, kind, ident, ns in held]
    names = {ident: {"comm": f"c{ident}", "tgid": ident} for _, kind, ident, _ in held if kind == "task"}
    attribution = _attribution(held, tail, latencies, names)
    infos = {ident: HolderInfo(ident, f"c{ident}", "" if ident in kernel else f"job {ident}", "root", "/",
                               "SCHED_OTHER:0", kernel_thread=ident in kernel, bound=ident in bound)
             for _, kind, ident, _ in held if kind == "task"}
    return Evidence("name:w", threads or [facts.TargetThread(5, 5, "w", "SCHED_OTHER", 0, "/", "0-1")],
                    rank(attribution, infos, {36: "virtio0"}), {"p999_us": 1000}, 10.0, {0, 1},
                    machine or facts.Machine(False, cpus=2), {0: 0.0, 1: 0.0}, [], **extra)


def test_interrupts_on_the_target_cpus_recommend_irq_isolation_leaving_a_housekeeping_cpu():
    findings = find_causes(_evidence([(1, "irq", 36, 300), (1, "softirq", 3, 200), (1, "idle", 0, 500)]))
    irq = next(f for f in findings if f.cause == "interrupts")
    assert irq.table == "irq_isolation" and irq.settings == {"latency_cpus": "1"}
    assert "irq 36 (virtio0)" in irq.evidence[0]


def test_kernel_threads_on_the_target_cpus_recommend_cpu_isolation(tree, tmp_path):
    held = [(1, "task", 77, 300), (1, "task", 9, 100), (1, "task", 8, 600)]
    findings = find_causes(_evidence(held, kernel={77, 9}, bound={9}))
    found = next(f for f in findings if f.cause == "kernel-threads")
    assert found.table == "cpu_isolation" and found.settings == {"latency_cpus": "1"}
    assert "pid 77 (c77): 30% of the worst-1% wait" in found.evidence[0]
    assert "pid 9 (c9, bound to its CPU)" in found.evidence[1] and "isolcpus and nohz_full" in found.advice
    assert [f.cause for f in findings if f.cause == "offline-jobs"] == ["offline-jobs"]  # pid 8, not the threads
    assert all("c77" not in line for f in findings if f.cause == "offline-jobs" for line in f.evidence)
    canary = find_causes(_evidence(held, kernel={77, 9}, named_target=False))
    assert next(f for f in canary if f.cause == "kernel-threads").table is None
    # The profile it writes, beside the eviction, validates on a host like this one.
    for target, value in [("/sys/fs/cgroup/cpuset/cpuset.cpus", "0-1"), ("/sys/fs/cgroup/cpuset/cpuset.mems", "0"),
                          ("/proc/cmdline", "root=/dev/vda1")]:
        tree.set(target, value)
    path = tmp_path / "p.toml"
    path.write_text(write_profile("d", Target("name", "^w$"), None, findings, {}))
    assert set(tomllib.loads(path.read_text())) == {"profile", "target", "offline_eviction", "cpu_isolation"}
    assert load_plugins().validate(load_profile(path), tree.host) == []


def test_a_few_kernel_thread_wakeups_make_no_finding():
    held = [(1, "task", 77, 50), (1, "idle", 0, 950)]
    assert not [f for f in find_causes(_evidence(held, kernel={77})) if f.cause == "kernel-threads"]


def test_small_shares_make_no_finding():
    evidence = _evidence([(0, "task", 7, 10), (0, "idle", 0, 990)])
    assert [f.cause for f in find_causes(evidence)] == []


def test_rt_threads_in_the_root_group_get_fifo_removal_for_a_named_workload_only():
    threads = [facts.TargetThread(5, 5, "w", "SCHED_FIFO", 50, "/", "0-1")]
    root = facts.RtBudget("/", "/sys/fs/cgroup/cpu", 950000, 1000000, 950000, 1000000)
    named = find_causes(_evidence([(0, "idle", 0, 900), (0, "task", 7, 100)], threads=threads,
                                  rt_budgets={"/": root}))
    rt = next(f for f in named if f.cause == "rt-throttling")
    assert rt.table == "sched_fifo" and rt.settings == {"nice": -20}
    canary = _evidence([(0, "idle", 0, 900)], threads=threads, rt_budgets={"/": root}, named_target=False)
    rt = next(f for f in find_causes(canary) if f.cause == "rt-throttling")
    assert rt.table is None and "needs a [target] naming the workload" in rt.advice


def test_memory_away_from_the_cpus_node_recommends_numa_on_a_two_node_host():
    machine = facts.Machine(False, cpus=4, nodes=2)
    memory = {5: {"pages": {0: 100, 1: 900}, "cpu_nodes": [0]}}
    numa = next(f for f in find_causes(_evidence([(0, "idle", 0, 1)], machine=machine, memory=memory))
                if f.cause == "numa")
    assert numa.settings == {"node": 1} and "10% of its 1000 resident pages" in numa.evidence[0]
    one_node = _evidence([(0, "idle", 0, 1)], memory=memory)
    assert not [f for f in find_causes(one_node) if f.cause == "numa"]


def test_memory_away_from_the_gpus_node_recommends_binding_to_the_gpu():
    machine = facts.Machine(False, cpus=4, nodes=2)
    memory = {5: {"pages": {0: 950, 1: 50}, "cpu_nodes": [0]}}   # local to its CPUs, far from its GPU
    numa = next(f for f in find_causes(_evidence([(0, "idle", 0, 1)], machine=machine, memory=memory,
                                                 gpu=("0000:3b:00.0", 1))) if f.cause == "numa")
    assert numa.settings == {"gpu": "0000:3b:00.0"}
    assert "5% of its 1000 resident pages on node 1, the GPU's" in numa.evidence[0]
    assert not [f for f in find_causes(_evidence([(0, "idle", 0, 1)], machine=machine, memory=memory))
                if f.cause == "numa"]


def test_the_profile_written_for_a_gpu_finding_validates_and_plans(tree, tmp_path):
    for target, value in [("/sys/devices/system/cpu/online", "0-3"), ("/sys/devices/system/node/online", "0-1"),
                          ("/sys/devices/system/node/node0/cpulist", "0-1"),
                          ("/sys/devices/system/node/node1/cpulist", "2-3"),
                          ("/sys/bus/pci/devices/0000:3b:00.0/numa_node", "1"),
                          ("/proc/100/numa_maps", "7f00 default anon=950 N0=950")]:
        tree.set(target, value)
    tree.add_process(100, "model", affinity="0-3")
    evidence = _evidence([(0, "idle", 0, 1)], machine=facts.Machine(False, cpus=4, nodes=2),
                         memory={100: {"pages": {0: 950}, "cpu_nodes": [0, 1]}}, gpu=("0000:3b:00.0", 1))
    path = tmp_path / "p.toml"
    path.write_text(write_profile("d", Target("name", "^model$"), None, find_causes(evidence), evidence.latency))
    profile = load_profile(path)
    assert profile.get("numa") == {"gpu": "0000:3b:00.0"}
    plugins = load_plugins()
    assert plugins.validate(profile, tree.host) == []
    assert plugins.plan(profile, tree.host)


def test_diagnose_checks_the_gpu_before_measuring(cli, tree):
    tree.set("/sys/bus/pci/devices/0000:af:00.0/numa_node", "-1")
    status, out, err = cli("diagnose", "--target", "name:x", "--gpu", "0000:af:00.0")
    assert status == 2 and "--gpu:" in err and "firmware does not say" in err
    status, out, err = cli("diagnose", "--target", "name:x", "--gpu", "nvidia0")
    assert status == 2 and "the NVIDIA driver is not loaded" in err


# -- the machine, read from a tree ------------------------------------------------------------

def test_a_firecracker_guest_is_recognised_from_its_files(tree):
    tree.set("/proc/cpuinfo", "processor\t: 0\nflags\t\t: fpu sse hypervisor\n")
    tree.set("/sys/devices/system/clocksource/clocksource0/available_clocksource", "tsc kvm-clock")
    tree.host.path("/sys/bus/platform/devices/AMZNC10C:00").mkdir(parents=True)
    for cpu in (0, 1):
        tree.set(f"/sys/devices/system/cpu/cpu{cpu}/topology/physical_package_id", "0")
        tree.set(f"/sys/devices/system/cpu/cpu{cpu}/topology/core_id", str(cpu))
    machine = facts.machine(tree.host)
    assert (machine.virtual, machine.hypervisor, machine.product) == (True, "KVM", "Firecracker")
    assert (machine.sockets, machine.cores_per_socket, machine.nodes) == (1, 2, 1)


def test_bare_metal_is_not_called_a_virtual_machine(tree):
    tree.set("/proc/cpuinfo", "processor\t: 0\nflags\t\t: fpu sse\n")
    tree.set("/sys/class/dmi/id/sys_vendor", "Dell Inc.")
    tree.set("/sys/class/dmi/id/product_name", "PowerEdge R750")
    machine = facts.machine(tree.host)
    assert not machine.virtual
    assert not [f for f in find_causes(_evidence([(0, "idle", 0, 1)], machine=machine))
                if f.cause == "virtual-machine"]


def test_interrupts_between_two_readings_count_the_target_cpus_only(tree):
    head = "           CPU0       CPU1\n"
    tree.set("/proc/interrupts", head + " 36:  10  20  PCI-MSIX  virtio0-input\nLOC:  5  5  Local timer\n")
    before = holder_lookup.interrupt_counts(tree.host)
    tree.set("/proc/interrupts", head + " 36:  15  120  PCI-MSIX  virtio0-input\nLOC:  9  5  Local timer\n")
    rows = facts.interrupts_between(before, holder_lookup.interrupt_counts(tree.host), {1})
    assert rows == [{"irq": "36", "name": "virtio0-input", "count": 100, "per_cpu": {"1": 100}, "movable": True}]


# -- the command line -------------------------------------------------------------------------

def test_diagnose_refuses_to_write_over_a_file_before_measuring(cli, tmp_path):
    existing = tmp_path / "p.toml"
    existing.write_text("keep me")
    status, out, err = cli("diagnose", "--target", "name:x", "--write-profile", existing)
    assert status == 2 and "the file exists" in err and existing.read_text() == "keep me"
    status, out, err = cli("diagnose", "--target", "name:x", "--save-raw", tmp_path / "no" / "raw.json")
    assert status == 2 and "no directory" in err


def test_diagnose_of_a_workload_that_is_not_running_says_so(cli, tmp_path):
    status, out, err = cli("diagnose", "--target", "name:^no-such-workload$", "--write-profile", tmp_path / "p.toml")
    assert status == 1 and "has no threads now: start the workload first" in err
    assert not (tmp_path / "p.toml").exists()


def test_replay_of_a_target_by_pid_warns_in_the_profile():
    diagnosis = replay(recorded("noisy"), Target("pid", "1234"))
    text = write_profile("d", diagnosis.target, None, diagnosis.findings, diagnosis.latency)
    assert "A pid changes when the workload restarts" in text and tomllib.loads(text)["target"] == {"pid": 1234}


def test_a_hog_named_like_a_system_daemon_yields_a_matcher_that_spares_the_daemon(tree, cli, profile_file):
    # A user's CPU hog calls itself sshd; root's sshd runs too. The written profile must evict the hog only.
    held = [(1, "task", 700, 900), (1, "task", 5, 100)]
    evidence = _evidence(held)
    hog = next(h for h in evidence.ranking.holders if h.key == "pid 700")
    hog.info = HolderInfo(700, "sshd", "sshd: burn -c 0", "nobody", "/", "SCHED_OTHER:0")
    findings = find_causes(evidence)
    text = write_profile("diagnosed", Target("name", "^w$"), None, findings, evidence.latency)
    [matcher] = [m for m in tomllib.loads(text)["offline_eviction"]["match"] if m["user"] == "nobody"]
    assert matcher == {"user": "nobody", "name": "^sshd$", "cmdline": "^sshd:\\ burn\\ \\-c\\ 0$"}
    tree.set("/etc/passwd", "root:x:0:0::/root:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n")
    tree.add_process(300, "sshd", cmdline="sshd: /usr/sbin/sshd -D [listener]")
    tree.add_process(700, "sshd", uid=65534, cmdline="sshd: burn -c 0")
    tree.add_process(701, "sshd", uid=65534, cmdline="sshd: /usr/sbin/sshd -D [listener]")
    dry = json.loads(cli("apply", profile_file(text), "--dry-run", "--json")[1])
    eviction = next(s for s in dry["steps"] if s["plugin"] == "offline_eviction")
    assert [c["target"].split()[1] for c in eviction["changes"] if "process_cgroup" in c["target"]] == ["700"]


def test_control_characters_in_a_holders_name_are_escaped_in_the_profile_and_it_still_parses():
    held = [(1, "task", 700, 900), (1, "task", 5, 100)]
    evidence = _evidence(held)
    hog = next(h for h in evidence.ranking.holders if h.key == "pid 700")
    hog.name = "x\n[sysctl]\x1b[2J"
    hog.info = HolderInfo(700, hog.name, "x\n[sysctl]\x1b[2J \"q\"", "nobody", "/a\nb", "SCHED_OTHER:0")
    text = write_profile("diagnosed", Target("name", "^w$"), None, find_causes(evidence), evidence.latency)
    tables = tomllib.loads(text)
    assert "sysctl" not in tables and "\x1b" not in text
    [matcher] = [m for m in tables["offline_eviction"]["match"] if m["user"] == "nobody"]
    assert re.search(matcher["cmdline"], "x\n[sysctl]\x1b[2J \"q\"") and re.search(matcher["name"], hog.name)


def test_the_report_shows_the_ioctl_timer_or_why_it_is_absent_and_old_recordings_still_replay():
    from tuned_rl.diagnose.report import format_diagnosis
    recording = recorded("noisy")
    assert "ioctl" not in recording  # recorded before the timer existed
    assert replay(recording).to_dict()["ioctl"] is None
    absent = {"function": "nvidia_ioctl", "absent": "the nvidia module is not loaded (name another function with "
                                                   "--ioctl)"}
    result = replay({**recording, "ioctl": absent}).to_dict()
    assert result["ioctl"] == absent
    assert "ioctl timer: nvidia_ioctl is not timed: the nvidia module is not loaded" in "\n".join(
        format_diagnosis(result))
    timed = {"function": "tty_ioctl", "how": "syscall", "calls": 50, "lost": 0, "total_ms": 120.0, "mean_us": 2400.0,
             "p50_us": 2200.0, "p99_us": 4000.0, "p999_us": 4100.0, "max_us": 4100.0}
    lines = format_diagnosis(replay({**recording, "ioctl": timed}).to_dict())
    assert any(line.split()[:3] == ["tty_ioctl", "50", "120.0ms"] for line in lines)


def _moves(tid: int, migrations: int, worst_after: int, other: int = 1000):
    from tuned_rl.measure.probes.migrations import DOUBLINGS, ThreadMoves
    waits, after = [0] * DOUBLINGS, [0] * DOUBLINGS
    waits[12], waits[22] = other, worst_after + 5  # 4 µs waits, and ~4 ms ones
    after[22] = worst_after
    return ThreadMoves(tid, migrations, tuple(waits), tuple(after))


def test_threads_that_move_are_named_pinned_by_name_and_merged_with_the_kernel_threads_table(tree):
    recording = recorded("noisy")
    diagnosis = replay(recording)
    k = diagnosis.evidence.tail_doubling()
    assert 0 < k <= 22
    threads = [dict(t) for t in recording["target_threads"]]
    threads[0].update(tid=901, comm="stream-0\n[evil]")  # a thread name is another user's text
    threads.append({**threads[0], "tid": 902, "comm": "stream-1"})
    threads.append({**threads[0], "tid": 903, "comm": "idle-one"})
    moves = [_moves(901, 400, 30).to_dict(), _moves(902, 300, 20).to_dict(), _moves(903, 2, 0).to_dict()]
    recorded_moves = {**recording, "target_threads": threads, "migrations": moves}
    result = replay(recorded_moves).to_dict()
    [finding] = [f for f in result["findings"] if f["cause"] == "migrations"]
    assert finding["table"] == "cpu_isolation" and set(finding["settings"]["pin"]) == {
        "^stream\\-0\\\n\\[evil\\]$", "^stream\\-1$"}  # idle-one barely moved: not pinned
    assert finding["evidence"][0].startswith("stream-0\\n[evil] (tid 901): 400 migrations in")
    assert [r["tid"] for r in result["migrations"]] == [901, 902, 903]
    findings = replay(recorded_moves).findings
    findings.append(type(findings[0])("kernel-threads", "kernel threads", ["k"], "cpu_isolation",
                                      {"latency_cpus": "1"}, "move them"))
    text = write_profile("d", Target("name", "^w$"), None, findings, diagnosis.latency)
    tables = tomllib.loads(text)  # one [cpu_isolation], with the pins as its subtable
    assert tables["cpu_isolation"]["pin"]["^stream\\-1$"] == tables["cpu_isolation"]["latency_cpus"]
    assert "# (its keys are in [cpu_isolation] above)" in text


@pytest.mark.parametrize("online, pins, shared", [
    ([0, 1, 2, 3], ["1", "2", "3"], None),                   # a CPU of its own each, not all on CPU 1
    ([0, 1], ["1", "1", "1"], "3 threads for 1 latency CPU: some share one"),
])
def test_each_thread_that_moves_is_pinned_to_a_cpu_of_its_own_or_told_they_share(online, pins, shared):
    recording = recorded("noisy")
    threads = [{**recording["target_threads"][0], "tid": 900 + n, "comm": f"stream-{n}", "affinity": "0-3"}
               for n in range(3)]
    moves = [_moves(900 + n, 400 - n, 30).to_dict() for n in range(3)]
    diagnosis = replay({**recording, "online_cpus": online, "target_threads": threads, "migrations": moves})
    [finding] = [f for f in diagnosis.findings if f.cause == "migrations"]
    assert [finding.settings["pin"][f"^stream\\-{n}$"] for n in range(3)] == pins
    assert (shared in finding.advice) if shared else "share" not in finding.advice, finding.advice
    text = write_profile("d", Target("name", "^w$"), None, [finding], diagnosis.latency)
    assert tomllib.loads(text)["cpu_isolation"]["pin"] == {f"^stream\\-{n}$": pins[n] for n in range(3)}


def test_threads_that_move_rarely_or_with_no_worst_wait_after_are_no_finding():
    recording = recorded("noisy")
    threads = [{**recording["target_threads"][0], "tid": 901, "comm": "stream-0"}]
    for moves in ([_moves(901, 400, 0)], [_moves(901, 3, 30)]):
        findings = replay({**recording, "target_threads": threads, "migrations": [m.to_dict() for m in moves]}).findings
        assert not [f for f in findings if f.cause == "migrations"]
    assert replay(recording).to_dict()["migrations"] is None  # recorded before migrations were counted
