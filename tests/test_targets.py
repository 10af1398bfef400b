"""Targets: parsing, and finding a target's threads by pid, name and cgroup."""


from __future__ import annotations
import os
import subprocess
import sys

import pytest

from tuned_rl.host import Host
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


def test_a_cgroup_target_reads_its_tasks(tree):
    directory = tree.cgroup("rl")
    tree.set(f"{directory}/tasks", "10\n11\n")
    assert resolve_tids(tree.host, Target("cgroup", directory)) == {10, 11}
    with pytest.raises(TargetError, match="does not exist"):
        resolve_tids(tree.host, Target("cgroup", "/sys/fs/cgroup/cpu/none"))
