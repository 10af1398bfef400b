"""SIGKILL at every point of a step, then `tuned-rl rollback` in a new process: every value is back."""


from __future__ import annotations
import json

import pytest

from tuned_rl.core.journal import Journal

from helpers import kill_at, run_cli

# Three changes in two steps: global budget; cgroup parent raised, then the cgroup.
PROFILE = '[rt_runtime]\nglobal_runtime_us = 960000\ncgroup = "ray/actors"\ncgroup_runtime_us = 500000\n'
POINTS = ["journaled:1", "journaled:2"] + [f"written:{n}" for n in (1, 2, 3)]  # a record per step, a write per change


@pytest.fixture
def crash_tree(tree):
    tree.cgroup("ray", runtime=100000)
    tree.cgroup("ray/actors", runtime=100000)
    return tree


@pytest.mark.parametrize("point", POINTS)
def test_sigkill_during_apply_then_rollback_restores_everything(point, crash_tree, profile_file, state_dir):
    original = crash_tree.snapshot()
    kill_at(point, "apply", profile_file(PROFILE), root=crash_tree.root, state_dir=state_dir)
    assert Journal(state_dir).records(), "the undo record must be on disk before the write"
    status, out, _ = run_cli("status", "--json", root=crash_tree.root, state_dir=state_dir)
    assert "interrupted" in [c["state"] for c in json.loads(out)["changes"]]
    status, out, err = run_cli("rollback", root=crash_tree.root, state_dir=state_dir)
    assert status == 0, err
    assert crash_tree.snapshot() == original
    assert run_cli("status", root=crash_tree.root, state_dir=state_dir)[1].strip() == "nothing applied"


@pytest.mark.parametrize("point", ["restored:1", "restored:2"])
def test_sigkill_during_rollback_then_rollback_again_finishes_it(point, crash_tree, profile_file, state_dir):
    original = crash_tree.snapshot()
    assert run_cli("apply", profile_file(PROFILE), root=crash_tree.root, state_dir=state_dir)[0] == 0
    kill_at(point, "rollback", root=crash_tree.root, state_dir=state_dir)
    assert crash_tree.snapshot() != original
    assert run_cli("rollback", root=crash_tree.root, state_dir=state_dir)[0] == 0
    assert crash_tree.snapshot() == original


def test_a_new_apply_after_a_crash_first_undoes_the_crashed_one(crash_tree, profile_file, state_dir):
    original = crash_tree.snapshot()
    kill_at("written:2", "apply", profile_file(PROFILE), root=crash_tree.root, state_dir=state_dir)
    status, out, _ = run_cli("apply", profile_file("[rt_runtime]\nglobal_runtime_us = 900000\n", "other.toml"),
                             root=crash_tree.root, state_dir=state_dir)
    assert status == 0 and "rolled back previously applied profile p" in out
    assert crash_tree.get("/sys/fs/cgroup/cpu/ray/cpu.rt_runtime_us") == "100000"
    run_cli("rollback", root=crash_tree.root, state_dir=state_dir)
    assert crash_tree.snapshot() == original
