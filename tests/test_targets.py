"""Targets: parsing, and finding a target's threads by pid, name and cgroup."""


from __future__ import annotations
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tuned_rl.host import Host, TaskGone
from tuned_rl.measure import measurement
from tuned_rl.measure.probes import Waits
from tuned_rl.measure.targets import Target, TargetError, resolve_tids


@pytest.mark.parametrize("text, kind, value", [("pid:12", "pid", "12"), ("name:^ray::", "name", "^ray::"),
                                               ("cgroup:/sys/fs/cgroup/cpu/rl", "cgroup", "/sys/fs/cgroup/cpu/rl"),
                                               ("unit:llm.service", "unit", "llm.service"), ("canary", "canary", "")])
def test_targets_parse(text, kind, value):
    assert Target.parse(text) == Target(kind, value) and str(Target.parse(text)) == text


@pytest.mark.parametrize("text, words", [("pod:1", "unknown target"), ("pid:x", "a number"), ("pid:", "needs a value"),
                                         ("name:(", "regular expression"), ("canary:1", "takes no value")])
def test_bad_targets_say_what_is_wrong(text, words):
    with pytest.raises(TargetError, match=words):
        Target.parse(text)


@pytest.fixture
def named_process():
    child = subprocess.Popen([sys.executable, "-c", "import threading, time\n"
                              "threading.Thread(target=time.sleep, args=(60,)).start(); time.sleep(60)",
                              "tuned-rl-target-test-marker"])
    yield child
    child.kill()
    child.wait()


def wait_for_threads(pid, count):
    for _ in range(200):
        if len(os.listdir(f"/proc/{pid}/task")) >= count:
            return
        import time
        time.sleep(0.01)


def test_a_pid_target_is_all_its_threads(named_process):
    wait_for_threads(named_process.pid, 2)
    tids = resolve_tids(Host(), Target("pid", str(named_process.pid)))
    assert named_process.pid in tids and len(tids) == 2


def test_a_name_target_matches_the_command_line_but_never_tuned_rl_itself(named_process):
    wait_for_threads(named_process.pid, 2)
    tids = resolve_tids(Host(), Target("name", "target-test-marker"))
    assert named_process.pid in tids and os.getpid() not in tids


def test_a_tuned_rl_command_naming_the_target_is_never_part_of_it(tree):
    from tuned_rl.measure.targets import is_target_process, name_matches
    tree.add_process(300, "llm-server", cmdline="/opt/llm-server --port 8000")
    tree.add_process(310, "python3", cmdline="/usr/bin/python3 -m tuned_rl.cli measure --target name:llm-server")
    tree.add_process(320, "tuned-rl", cmdline="/usr/bin/python3 /usr/bin/tuned-rl diagnose --target name:llm-server")
    tree.add_process(330, "tuned-rl", cmdline="tuned-rl measure --target name:llm-server")
    tree.add_process(340, "python3", cmdline="python3 serve.py --model llm-server")  # the workload too
    target = Target("name", "llm-server")
    assert name_matches(tree.host, target)[0] == [300, 340]
    assert [pid for pid in (300, 310, 320, 330, 340) if is_target_process(tree.host, target, tree.host.process(pid))] \
        == [300, 340]


def test_a_cgroup_target_reads_its_tasks(tree):
    directory = tree.cgroup("rl")
    tree.set(f"{directory}/tasks", "10\n11\n")
    assert resolve_tids(tree.host, Target("cgroup", directory)) == {10, 11}
    with pytest.raises(TargetError, match="does not exist"):
        resolve_tids(tree.host, Target("cgroup", "/sys/fs/cgroup/cpu/none"))


class CountingProbe:
    """Drains nothing; counts how often the target was looked up (through ``watch``)."""

    name = "counting"

    def __init__(self, follows_forks: bool):
        self.follows_forks, self.lost, self.lookups = follows_forks, 0, 0

    def watch(self, tids):
        self.lookups += 1

    def drain(self):
        return Waits.empty()


@pytest.mark.parametrize("follows_forks, at_most, at_least", [(True, 1, 0), (False, 99, 4)])
def test_a_name_target_is_looked_up_again_every_refresh_only_if_the_probe_cannot_follow_forks(
        follows_forks, at_most, at_least, monkeypatch):
    # A lookup reads every process's command line: a burst of tuned-rl's CPU the workload waits behind
    # (it took a quiet workload's measured p999 from about 0.15 ms to 0.85 ms here, at 4 a second).
    monkeypatch.setattr(measurement, "REFRESH_S", 0.02)
    monkeypatch.setattr(measurement, "RESCAN_S", 0.5)
    probe = CountingProbe(follows_forks)
    measurement.record_windows(probe, lambda: set(), windows=2, window_seconds=0.1)
    assert at_least <= probe.lookups <= at_most


def test_the_cheap_name_lookup_reads_comm_and_command_line(tree):
    tree.add_process(4242, "ray::actor", cmdline="python -m ray.actor --name rl-actor")
    assert tree.host.process_names(4242) == ("ray::actor", "python -m ray.actor --name rl-actor")
    assert resolve_tids(tree.host, Target.parse("name:rl-actor")) == {4242}
    with pytest.raises(TaskGone):
        tree.host.process_names(4343)


def test_a_unit_target_asks_systemctl_once_per_few_seconds_not_once_per_process(tree, monkeypatch):
    """watch asks is_target_process of each process any user starts: a unit target forked `systemctl
    show` 2-4 times each. Now one call serves UNIT_CACHE_S, and membership is the process's own cgroup."""
    import subprocess as real_subprocess
    from tuned_rl.host.processes import ProcessInfo
    from tuned_rl.measure import targets
    calls = []

    def systemctl(argv, **kwargs):
        calls.append(argv)
        return real_subprocess.CompletedProcess(argv, 0, "/system.slice/llm.service\n", "")
    monkeypatch.setattr(targets.subprocess, "run", systemctl)
    monkeypatch.setattr(targets, "_CONTROL_GROUPS", {})
    target = targets.Target("unit", "llm.service")

    def process(pid, path):
        return ProcessInfo(pid, pid, 1, 100, "python3", "python3 serve.py", 0, "SCHED_OTHER", 0, 0, "0-1",
                           {"name=systemd": path, "cpu": "/"})
    found = [targets.is_target_process(tree.host, target, process(1000 + n, path))
             for n in range(300) for path in ("/system.slice/llm.service", "/system.slice/llm.service/worker",
                                              "/system.slice/llm.service-evil", "/user.slice/user-1000.slice")]
    assert found == [True, True, False, False] * 300
    assert len(calls) == 1, calls[:3]


def _in_namespace(tree, pid: int, namespace: str) -> None:
    (tree.root / "proc" / str(pid) / "ns").mkdir(parents=True, exist_ok=True)
    (tree.root / "proc" / str(pid) / "ns" / "pid").symlink_to(namespace)


def test_a_root_process_in_a_container_named_like_the_workload_is_not_it_unless_the_profile_says(tree, cli,
                                                                                                 profile_file):
    """A tenant's container running as root without a user namespace named itself like the workload
    (live: `unshare --pid --fork --mount-proc`, named infer_actor, was moved onto the workload's CPU).
    By default only the host's pid namespace holds the target; the plan names the look-alike and why."""
    from tuned_rl.measure.targets import is_target_process, name_matches, target_from_table
    tree.add_process(1, "systemd", ppid=0, start_time=1)
    tree.add_process(300, "infer_actor", cmdline="python3 actor.py")
    tree.add_process(400, "infer_actor", cmdline="python3 actor.py", start_time=2000)
    _in_namespace(tree, 1, "pid:[4026531836]")
    _in_namespace(tree, 300, "pid:[4026531836]")
    _in_namespace(tree, 400, "pid:[4026532611]")  # the container's
    host = tree.host
    target = target_from_table({"name": "^infer_actor$"})[0]
    matched, lookalikes = name_matches(host, target)
    assert matched == [300] and [(pid, why) for pid, _, why in lookalikes] == [
        (400, "is in another pid namespace (pid:[4026532611]: a container's), and [target] containers is false")]
    assert [pid for pid in (300, 400) if is_target_process(host, target, host.process(pid))] == [300]
    both = target_from_table({"name": "^infer_actor$", "containers": True})[0]
    assert name_matches(host, both)[0] == [300, 400] and is_target_process(host, both, host.process(400))
    profile = profile_file('[target]\nname = "^infer_actor$"\n\n[sysctl]\n"kernel.sched_rt_runtime_us" = 900000\n')
    notes = json.loads(cli("apply", profile, "--dry-run", "--json")[1])["notes"]
    assert any(n.startswith("not the target: pid 400 (infer_actor)") and "another pid namespace" in n for n in notes), notes


def test_within_narrows_a_name_target_to_a_cgroup_and_below(tree):
    from tuned_rl.measure.targets import is_target_process, name_matches, target_from_table
    tree.add_process(300, "vllm", cgroups={"name=systemd": "/system.slice/llm.service"})
    tree.add_process(310, "vllm", cgroups={"name=systemd": "/system.slice/llm.service/engine"})
    tree.add_process(320, "vllm", cgroups={"name=systemd": "/system.slice/llm.service-copy"})
    tree.add_process(330, "vllm", cgroups={"name=systemd": "/kubepods.slice/pod1/vllm"})
    target = target_from_table({"name": "^vllm$", "within": "/system.slice/llm.service"})[0]
    matched, lookalikes = name_matches(tree.host, target)
    assert matched == [300, 310] and [pid for pid, _, _ in lookalikes] == [320, 330]
    assert "is in cgroup /kubepods.slice/pod1/vllm, not within /system.slice/llm.service" in lookalikes[1][2]
    assert [p for p in (300, 310, 320, 330) if is_target_process(tree.host, target, tree.host.process(p))] == [300, 310]


@pytest.mark.parametrize("table, says", [({"pid": 5, "containers": True}, "containers goes with a name target"),
                                         ({"unit": "x.service", "within": "/a"}, "within goes with a name target"),
                                         ({"name": "x", "within": "system.slice"}, "starts with /")])
def test_containers_and_within_are_checked(tree, table, says):
    from tuned_rl.measure.targets import target_problems
    assert any(says in p.message for p in target_problems(table, tree.host)), target_problems(table, tree.host)
