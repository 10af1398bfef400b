"""apply / rollback / status on a temporary host tree: journaling, read-back, drift, stale boots."""


from __future__ import annotations
import json
import os

import pytest

from tuned_rl import Change, Key, Step, Table, hookimpl
from tuned_rl.core.agent import Agent
from tuned_rl.host import Host
from tuned_rl.core.journal import Journal
from tuned_rl.core.plugin_host import load_plugins
from tuned_rl.profiles.loader import load_profile

from helpers import CPU_MOUNT

RT = "/proc/sys/kernel/sched_rt_runtime_us"
RL = f"{CPU_MOUNT}/rl/cpu.rt_runtime_us"
RAISE_RL = '[rt_runtime]\nglobal_runtime_us = 960000\ncgroup = "rl"\ncgroup_runtime_us = 950000\n'


def test_apply_changes_the_values_and_rollback_restores_them(tree, cli, profile_file):
    tree.cgroup("rl", runtime=500000)
    original = tree.snapshot()
    status, out, _ = cli("apply", profile_file(RAISE_RL), "--json")
    assert status == 0
    report = json.loads(out)
    assert [s["outcome"] for s in report["steps"]] == ["applied", "applied"]
    assert report["steps"][1]["changes"] == [{"target": RL, "before": "500000", "after": "950000"}]
    assert tree.get(RT) == "960000" and tree.get(RL) == "950000"
    status, out, _ = cli("rollback", "--json")
    assert status == 0 and [c["outcome"] for c in json.loads(out)["changes"]] == ["restored", "restored"]
    assert tree.snapshot() == original


def test_status_tells_what_is_applied_and_what_drifted(tree, cli, profile_file):
    tree.cgroup("rl", runtime=500000)
    assert cli("status")[1].strip() == "nothing applied"
    cli("apply", profile_file(RAISE_RL))
    status = json.loads(cli("status", "--json")[1])
    assert status["profile"] == "p" and [c["state"] for c in status["changes"]] == ["holds", "holds"]
    tree.set(RL, "400000")  # somebody else changed it
    rows = {c["target"]: c for c in json.loads(cli("status", "--json")[1])["changes"]}
    assert rows[RL]["state"] == "drifted" and rows[RL]["current"] == "400000"
    assert "drifted" in cli("status")[1]
    assert "left" in cli("rollback")[1]  # the operator's 400000 stays: see the drift tests below
    assert json.loads(cli("status", "--json")[1]) == {"profile": None, "path": None, "digest": None, "applied_at": None,
                                                      "stale": False, "changes": [], "removed": [], "deferred": [],
                                                      "deferred_results": [], "awaiting": [], "verified": [],
                                                      "verified_p999_us": None, "watched": [],
                                                      "watch_plugin_failures": {}}
    assert tree.get(RL) == "400000" and tree.get(RT) == "950000"


def test_rollback_is_idempotent(tree, cli, profile_file):
    cli("apply", profile_file("[rt_runtime]\nglobal_runtime_us = 900000\n"))
    assert cli("rollback")[0] == 0
    status, out, _ = cli("rollback")
    assert status == 0 and out.strip() == "nothing to roll back"
    assert tree.get(RT) == "950000"


def test_rollback_keeps_a_value_someone_changed_since_and_says_so(tree, cli, profile_file):
    cli("apply", profile_file("[rt_runtime]\nglobal_runtime_us = 900000\n"))
    tree.set(RT, "123")  # an operator's change after the apply
    status, out, _ = cli("rollback", "--json")
    rows = {r["target"]: r for r in json.loads(out)["changes"]}
    assert status == 0 and rows[RT]["outcome"] == "left" and "--force" in rows[RT]["reason"]
    assert tree.get(RT) == "123"
    assert cli("status")[1].strip() == "nothing applied"  # the value is theirs now


def test_rollback_force_restores_the_original_over_a_drifted_value(tree, cli, profile_file):
    cli("apply", profile_file("[rt_runtime]\nglobal_runtime_us = 900000\n"))
    tree.set(RT, "123")
    status, out, _ = cli("rollback", "--force")
    assert status == 0 and "restored" in out and "set by someone since the apply" in out
    assert tree.get(RT) == "950000"


def test_apply_over_a_drifted_value_keeps_it_and_names_it(tree, cli, profile_file):
    cli("apply", profile_file("[rt_runtime]\nglobal_runtime_us = 900000\n"))
    tree.set(RT, "400000")
    status, out, _ = cli("apply", profile_file("[sysctl]\n\"vm.swappiness\" = 10\n", "other.toml"), "--json")
    notes = json.loads(out)["notes"]
    assert status == 0 and any(n.startswith(f"left {RT} as someone set it") and "'400000'" in n for n in notes)
    assert tree.get(RT) == "400000"


def test_dry_run_writes_nothing_anywhere(tree, cli, profile_file, state_dir):
    tree.cgroup("rl", runtime=500000)
    before = tree.snapshot()
    status, out, _ = cli("apply", profile_file(RAISE_RL), "--dry-run", "--json")
    report = json.loads(out)
    assert status == 0 and report["dry_run"] is True
    assert [s["outcome"] for s in report["steps"]] == ["planned", "planned"]
    assert report["steps"][0]["changes"] == [{"target": RT, "before": "950000", "after": "960000"}]
    assert tree.snapshot() == before and not state_dir.exists()


def test_a_value_already_set_is_unchanged_and_not_journaled(tree, cli, profile_file, state_dir):
    status, out, _ = cli("apply", profile_file("[rt_runtime]\nglobal_runtime_us = 950000\n"), "--json")
    assert json.loads(out)["steps"][0]["outcome"] == "unchanged"
    assert Journal(state_dir).records() == []


def test_applying_another_profile_rolls_the_old_one_back_first(tree, cli, profile_file):
    tree.cgroup("rl", runtime=500000)
    cli("apply", profile_file(RAISE_RL, "first.toml"))
    dry = json.loads(cli("apply", profile_file("[rt_runtime]\nglobal_runtime_us = 900000\n"), "--dry-run",
                         "--json")[1])
    assert "first is applied" in dry["notes"][0]
    assert dry["steps"][0]["changes"][0]["before"] == "950000"  # what the rollback would restore
    status, out, _ = cli("apply", profile_file("[rt_runtime]\nglobal_runtime_us = 900000\n"))
    assert status == 0 and "rolled back previously applied profile first" in out
    assert tree.get(RL) == "500000" and tree.get(RT) == "900000"
    cli("rollback")
    assert tree.get(RT) == "950000"


def test_human_output_is_a_table_of_target_before_after(tree, cli, profile_file):
    tree.cgroup("rl", runtime=500000)
    out = cli("apply", profile_file(RAISE_RL), "--no-verify")[1]
    assert out.splitlines()[1].split() == ["PHASE", "STEP", "OUTCOME", "CHANGE"]
    assert f"{RL}: 500000 -> 950000" in out and "applied with --no-verify" in out


def test_records_of_an_earlier_boot_are_reported_not_replayed(tree, cli, profile_file, state_dir):
    cli("apply", profile_file("[rt_runtime]\nglobal_runtime_us = 900000\n"))
    tree.set("/proc/sys/kernel/random/boot_id", "99999999-new-boot")
    tree.set(RT, "950000")  # what the reboot did
    assert "earlier boot" in cli("status")[1]
    tree.set(RT, "940000")  # set by someone after the reboot: not ours to undo
    status, out, _ = cli("rollback")
    assert status == 0 and "earlier boot" in out and "not replayed" in out
    assert tree.get(RT) == "940000"
    assert Journal(state_dir).is_empty() and list((state_dir / "stale").iterdir())
    assert cli("status")[1].strip() == "nothing applied"


class RefusingHost(Host):
    """A host whose kernel silently keeps the old value of one file."""

    def __init__(self, root, refused):
        super().__init__(root)
        self.refused = refused

    def write(self, target, value):
        if target != self.refused:
            super().write(target, value)


def test_a_value_that_does_not_read_back_fails_the_step_and_reverts_it(tree, profile_file, state_dir):
    tree.cgroup("ray", runtime=100000)
    tree.cgroup("ray/actors", runtime=100000)
    refused = f"{CPU_MOUNT}/ray/actors/cpu.rt_runtime_us"
    agent = Agent(load_plugins(), RefusingHost(tree.root, refused), Journal(state_dir))
    profile = load_profile(profile_file('[rt_runtime]\ncgroup = "ray/actors"\ncgroup_runtime_us = 400000\n'
                                        'global_runtime_us = 900000\n'))
    before = tree.snapshot()
    report, status = agent.apply(profile)
    assert status == 1
    failed = report.steps[0]
    assert failed.outcome == "failed" and "reads back '100000'" in failed.reason and "reverted" in failed.reason
    assert report.steps[1].outcome == "skipped"
    assert tree.snapshot() == before  # the parent raised for it was put back
    assert Journal(state_dir).records() == []


class EinvalHost(Host):
    """A host whose kernel refuses one file's new value with EINVAL, as sysfs does."""

    def write(self, target, value):
        if target == RT:
            raise OSError(22, "Invalid argument", str(self.path(target)))
        super().write(target, value)


def test_a_write_the_kernel_refuses_fails_the_step_and_stops_the_run(tree, profile_file, state_dir):
    tree.cgroup("rl", runtime=500000)
    agent = Agent(load_plugins(), EinvalHost(tree.root), Journal(state_dir))
    before = tree.snapshot()
    report, status = agent.apply(load_profile(profile_file(RAISE_RL)))
    assert status == 1
    assert [s.outcome for s in report.steps] == ["failed", "skipped"]
    assert "refused '960000': Invalid argument" in report.steps[0].reason
    assert tree.snapshot() == before and Journal(state_dir).records() == []


# -- process undo records ---------------------------------------------------------

class PinPlugin:
    """A throw-away plugin pinning one process to CPU 0 (process-kind undo records)."""

    def __init__(self, pid):
        self.pid = pid

    @hookimpl
    def tuned_rl_tables(self):
        return [Table("pin", "test", {"cpu": Key(int, "cpu")}, phase="placement")]

    @hookimpl
    def tuned_rl_plan(self, profile, host):
        task = host.task(self.pid)
        return [Step("pin", "pin the canary", [Change("affinity", "", host.get_affinity(task), "0", task)])]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_process_changes_are_journaled_and_undone(sleeper, profile_file, state_dir):
    plugins = load_plugins(extra=[("pin", PinPlugin(sleeper.pid))])
    agent = Agent(plugins, Host(), Journal(state_dir))
    original = os.sched_getaffinity(sleeper.pid)
    report, status = agent.apply(load_profile(profile_file("[pin]\ncpu = 0\n")))
    assert status == 0 and report.steps[0].outcome == "applied"
    assert report.steps[0].changes[0].target.startswith(f"pid {sleeper.pid} (python")
    assert report.steps[0].changes[0].target.endswith(") affinity")
    assert os.sched_getaffinity(sleeper.pid) == {0}
    assert agent.status().changes[0].state == "holds"
    result, status = agent.rollback()
    assert status == 0 and result.changes[0].outcome == "restored"
    assert os.sched_getaffinity(sleeper.pid) == original


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_a_process_that_exited_is_reported_gone_not_touched(sleeper, profile_file, state_dir):
    agent = Agent(load_plugins(extra=[("pin", PinPlugin(sleeper.pid))]), Host(), Journal(state_dir))
    agent.apply(load_profile(profile_file("[pin]\ncpu = 0\n")))
    sleeper.kill()
    sleeper.wait()
    assert agent.status().changes[0].state == "gone"
    result, status = agent.rollback()
    assert status == 0 and result.changes[0].outcome == "gone"
    assert Journal(state_dir).is_empty()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_a_reused_pid_is_never_touched(sleeper, profile_file, state_dir):
    agent = Agent(load_plugins(extra=[("pin", PinPlugin(sleeper.pid))]), Host(), Journal(state_dir))
    agent.apply(load_profile(profile_file("[pin]\ncpu = 0\n")))
    journal = Journal(state_dir)
    record = journal.records()[0]
    task = record.changes[0].task
    impostor = Change("affinity", "", "0-1", "0", task.__class__(task.pid, task.start_time - 1, "old"))
    journal.replace(record, [impostor])  # as if the journaled process had exited and its pid were reused
    result, _ = agent.rollback()
    assert result.changes[0].outcome == "gone"
    assert os.sched_getaffinity(sleeper.pid) == {0}  # the live process kept what it has


def test_a_host_missing_a_file_is_a_clear_error_not_a_traceback(tree, cli, profile_file):
    tree.host.path("/proc/sys/kernel/sched_rt_period_us").unlink()
    status, out, err = cli("apply", profile_file("[rt_runtime]\nglobal_runtime_us = 900000\n"), "--dry-run")
    assert status == 1 and "cannot read the host" in err and "sched_rt_period_us" in err


def test_status_and_rollback_show_a_person_the_unusual_rows_and_count_the_rest(tree, cli, profile_file):
    names = [f"vm.param{i}" for i in range(50)]
    for name in names:
        tree.set(f"/proc/sys/vm/param{name[8:]}", "1")
    cli("apply", profile_file("[sysctl]\n" + "".join(f'"{n}" = 2\n' for n in names)))
    tree.set("/proc/sys/vm/param49", "7")  # someone else's change
    out = cli("status")[1]
    assert "/proc/sys/vm/param49" in out and "drifted" in out
    assert "... and 10 more: 10 holds (--json lists every change)" in out
    assert len(json.loads(cli("status", "--json")[1])["changes"]) == 50
    out = cli("rollback")[1]
    assert "... and 10 more: 10 restored (--json lists every change)" in out
