"""Steps over many live tasks: tasks that exit before they are changed are counted, not fatal."""


from __future__ import annotations
import json
import os
import subprocess

import pytest

from tuned_rl import Change, Key, Step, Table, hookimpl
from tuned_rl.core.agent import Agent
from tuned_rl.core.journal import Journal
from tuned_rl.core.plugin_host import load_plugins
from tuned_rl.host import Host
from tuned_rl.profiles.loader import load_profile

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or len(os.sched_getaffinity(0)) < 2,
                                reason="needs root and two CPUs")


class PinAndBatch:
    """Owns [pin]: pins every given process to CPU 0 and makes it SCHED_BATCH. After planning it
    kills the processes in ``exit_after_plan``, as if they had exited before the step wrote."""

    def __init__(self, processes, exit_after_plan):
        self.processes, self.exit_after_plan = processes, exit_after_plan

    @hookimpl
    def tuned_rl_tables(self):
        return [Table("pin", "test", {"on": Key(bool, "on")}, phase="placement")]

    @hookimpl
    def tuned_rl_plan(self, profile, host):
        if profile.get("pin") is None:
            return []
        changes = []
        for process in self.processes:
            info = host.process(process.pid)
            changes += [Change("affinity", "", info.affinity, "0", info.task),
                        Change("sched", "", info.sched, "SCHED_BATCH:0", info.task)]
        for process in self.exit_after_plan:
            process.kill()
            process.wait()
        return [Step("pin", f"pin {len(self.processes)} processes", changes)]


@pytest.fixture
def sleepers():
    processes = [subprocess.Popen(["sleep", "600"]) for _ in range(200)]
    yield processes
    for process in processes:
        process.kill()
    for process in processes:
        process.wait()


def state_of(pid):
    return os.sched_getaffinity(pid), os.sched_getscheduler(pid), os.sched_getparam(pid).sched_priority


def test_a_step_over_200_processes_of_which_50_exit_completes_and_rolls_back_the_rest(sleepers, profile_file,
                                                                                       state_dir):
    survivors = sleepers[50:]
    original = {p.pid: state_of(p.pid) for p in survivors}
    agent = Agent(load_plugins(extra=[("pin", PinAndBatch(sleepers, sleepers[:50]))]), Host(), Journal(state_dir))
    report, status = agent.apply(load_profile(profile_file("[pin]\non = true\n")))
    step = report.to_dict()["steps"][0]
    assert status == 0 and step["outcome"] == "applied" and step["gone"] == 50, step["reason"]
    assert len(step["changes"]) == 300  # affinity and policy of each of the 150
    assert "50 tasks exited before they were changed" in report.to_text()
    assert all(state_of(p.pid)[:2] == ({0}, os.SCHED_BATCH) for p in survivors)
    [record] = Journal(state_dir).records()
    assert len(record.changes) == 300 and record.state == "done"
    result, status = agent.rollback()
    assert status == 0 and {r.outcome for r in result.changes} == {"restored"}
    assert {p.pid: state_of(p.pid) for p in survivors} == original
    assert Journal(state_dir).is_empty()


def test_processes_that_exit_after_the_apply_are_reported_gone_by_status_and_rollback(sleepers, profile_file,
                                                                                      state_dir):
    agent = Agent(load_plugins(extra=[("pin", PinAndBatch(sleepers[:10], []))]), Host(), Journal(state_dir))
    assert agent.apply(load_profile(profile_file("[pin]\non = true\n")))[1] == 0
    for process in sleepers[:4]:
        process.kill()
        process.wait()
    states = [c.state for c in agent.status().changes]
    assert states.count("gone") == 8 and states.count("holds") == 12
    result, status = agent.rollback()
    outcomes = [r.outcome for r in result.changes]
    assert status == 0 and outcomes.count("gone") == 8 and outcomes.count("restored") == 12
    assert json.loads(result.to_json())["changes"]  # the report renders as plain JSON
