"""Process undo records on the live kernel: scheduling policy and cgroup membership come back."""

import os
from pathlib import Path


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
        return [Table("task", "test", {"on": Key(bool, "on")})]

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
    assert [c["state"] for c in agent.status()["changes"]] == ["holds", "holds"]
    result, status = agent.rollback()
    assert status == 0 and [c["outcome"] for c in result["changes"]] == ["restored", "restored"]
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
