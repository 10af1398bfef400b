"""Process undo records on the live kernel: scheduling policy and cgroup membership come back."""


from __future__ import annotations
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tuned_rl import Change, Key, Step, Table, hookimpl
from tuned_rl.core.agent import Agent
from tuned_rl.host import Host
from tuned_rl.core.journal import Journal
from tuned_rl.core.plugin_host import load_plugins
from tuned_rl.profiles.loader import load_profile

CPU = "/sys/fs/cgroup/cpu"


class TaskPlugin:
    """Owns [task]: makes one process SCHED_FIFO 10 and moves it into a cgroup."""

    def __init__(self, pid, cgroup):
        self.pid, self.cgroup = pid, cgroup

    @hookimpl
    def tuned_rl_tables(self):
        return [Table("task", "test", {"on": Key(bool, "on")}, phase="placement")]

    @hookimpl
    def tuned_rl_plan(self, profile, host):
        task = host.task(self.pid)
        return [Step("task", "make the canary FIFO in its cgroup", [
            Change("cgroup", CPU, host.get_cgroup(task, CPU), f"/{self.cgroup}", task),
            Change("sched", "", host.get_sched(task), "SCHED_FIFO:10", task),
        ])]


def cgroup_of(pid: int) -> str:
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    return next(line.split(":", 2)[2] for line in lines if line.split(":")[1] == "cpu")


def test_policy_and_cgroup_of_a_process_are_applied_and_rolled_back(rt_cgroup, sleeper, profile_file, state_dir):
    original = (os.sched_getscheduler(sleeper.pid), cgroup_of(sleeper.pid))
    agent = Agent(load_plugins(extra=[("task", TaskPlugin(sleeper.pid, rt_cgroup))]), Host(), Journal(state_dir))
    report, status = agent.apply(load_profile(profile_file("[task]\non = true\n")))
    assert status == 0, report.steps[0].reason
    assert os.sched_getscheduler(sleeper.pid) == os.SCHED_FIFO
    assert os.sched_getparam(sleeper.pid).sched_priority == 10
    assert cgroup_of(sleeper.pid) == f"/{rt_cgroup}"
    assert [c.state for c in agent.status().changes] == ["holds", "holds"]
    result, status = agent.rollback()
    assert status == 0 and [c.outcome for c in result.changes] == ["restored", "restored"]
    assert (os.sched_getscheduler(sleeper.pid), cgroup_of(sleeper.pid)) == original


def test_a_fifo_task_in_a_cgroup_without_budget_is_refused_and_reverted(rt_cgroup, sleeper, profile_file,
                                                                         state_dir):
    # A SCHED_FIFO task cannot join a cgroup whose RT budget is 0: the kernel says no.
    Path(f"{CPU}/{rt_cgroup}/cpu.rt_runtime_us").write_text("0")
    os.sched_setscheduler(sleeper.pid, os.SCHED_FIFO, os.sched_param(5))
    cgroup_before = cgroup_of(sleeper.pid)
    agent = Agent(load_plugins(extra=[("task", TaskPlugin(sleeper.pid, rt_cgroup))]), Host(), Journal(state_dir))
    report, status = agent.apply(load_profile(profile_file("[task]\non = true\n")))
    assert status == 1 and report.steps[0].outcome == "failed"
    assert cgroup_of(sleeper.pid) == cgroup_before
    assert os.sched_getparam(sleeper.pid).sched_priority == 5


FORKER = """
import os, signal, time
children = []
def fork(*_):
    pid = os.fork()
    if pid == 0:
        time.sleep(600)
        os._exit(0)
    children.append(pid)
    print(pid, flush=True)
signal.signal(signal.SIGUSR1, fork)
print("ready", flush=True)
while True:
    time.sleep(1)
"""


class OfflinePlugin:
    """Owns [offline]: creates a cgroup (with a setting, where given) and moves one process into it."""

    def __init__(self, pid, mount, name, settings):
        self.pid, self.mount, self.name, self.settings = pid, mount, name, settings

    @hookimpl
    def tuned_rl_tables(self):
        return [Table("offline", "test", {"on": Key(bool, "on")}, phase="cgroups")]

    @hookimpl
    def tuned_rl_plan(self, profile, host):
        task = host.task(self.pid)
        return [Step("offline", "evict the job", [
            Change("cgroup_dir", f"{self.mount}/{self.name}", None, self.settings),
            Change("process_cgroup", self.mount, host.get_cgroup(task, self.mount), f"/{self.name}", task),
        ])]


def cgroup_in(pid: int, key: str) -> str:
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    return next(line.split(":", 2)[2] for line in lines if line.split(":")[1] == key)


@pytest.mark.parametrize("mount, key, settings", [
    (CPU, "cpu", {"cpu.shares": "2"}),
    ("/sys/fs/cgroup/unified", "", {}),  # cgroup v2 (no controllers enabled on this machine)
])
def test_a_created_cgroup_takes_a_process_and_its_later_children_back_out(mount, key, settings, profile_file,
                                                                         state_dir):
    if os.geteuid() != 0 or not Path(mount, "cgroup.procs").exists():
        pytest.skip(f"needs root and {mount}")
    job = subprocess.Popen([sys.executable, "-c", FORKER], stdout=subprocess.PIPE, text=True)
    name, child = f"tuned-rl-test-offline-{os.getpid()}", None
    try:
        assert job.stdout.readline().strip() == "ready"
        original = cgroup_in(job.pid, key)
        agent = Agent(load_plugins(extra=[("offline", OfflinePlugin(job.pid, mount, name, settings))]), Host(),
                      Journal(state_dir))
        report, status = agent.apply(load_profile(profile_file("[offline]\non = true\n")))
        assert status == 0, report.steps[0].reason
        assert cgroup_in(job.pid, key) == f"/{name}"
        assert all(Path(mount, name, k).read_text().strip() == v for k, v in settings.items())
        os.kill(job.pid, signal.SIGUSR1)  # the job forks after the apply: its child starts in the cgroup
        child = int(job.stdout.readline())
        assert cgroup_in(child, key) == f"/{name}"
        result, status = agent.rollback()
        assert status == 0, result
        assert cgroup_in(job.pid, key) == original and cgroup_in(child, key) == original
        assert not Path(mount, name).exists()
    finally:
        if child is not None:
            os.kill(child, signal.SIGKILL)
        job.kill()
        job.wait()
        if Path(mount, name).exists():
            for pid in Path(mount, name, "cgroup.procs").read_text().split():
                Path(mount, "cgroup.procs").write_text(pid)
            Path(mount, name).rmdir()
