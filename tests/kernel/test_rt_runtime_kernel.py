"""The rt_runtime plugin against the live kernel: dry run, apply, status, rollback, SIGKILL."""


from __future__ import annotations
import json
import shutil
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from helpers import kill_at, run_cli

GLOBAL = "/proc/sys/kernel/sched_rt_runtime_us"


def read(path: str) -> str:
    with open(path) as handle:
        return handle.read().strip()


@pytest.fixture
def raise_budget(rt_cgroup, profile_file):
    """The first article's fix: the cgroup's budget 500000 -> 950000, and the global budget by 10000."""
    target = f"/sys/fs/cgroup/cpu/{rt_cgroup}/cpu.rt_runtime_us"
    global_after = int(read(GLOBAL)) + 10000
    path = profile_file(f'[rt_runtime]\nglobal_runtime_us = {global_after}\ncgroup = "{rt_cgroup}"\n'
                        f"cgroup_runtime_us = 900000\n")
    return path, target, {GLOBAL: read(GLOBAL), target: read(target)}


def test_dry_run_lists_the_real_values_and_changes_nothing(raise_budget, state_dir):
    path, target, original = raise_budget
    status, out, err = run_cli("apply", path, "--dry-run", "--json", root=None, state_dir=state_dir)
    assert status == 0, err
    changes = {c["target"]: c for s in json.loads(out)["steps"] for c in s["changes"]}
    assert changes[target]["before"] == "500000" and changes[target]["after"] == "900000"
    assert changes[GLOBAL]["before"] == original[GLOBAL]
    assert {p: read(p) for p in original} == original
    assert not state_dir.exists()


def test_apply_then_rollback_returns_every_file(raise_budget, state_dir):
    path, target, original = raise_budget
    assert run_cli("status", root=None, state_dir=state_dir)[1].strip() == "nothing applied"
    status, out, err = run_cli("apply", path, "--json", root=None, state_dir=state_dir)
    assert status == 0, err
    assert [s["outcome"] for s in json.loads(out)["steps"]] == ["applied", "applied"]
    assert read(target) == "900000" and int(read(GLOBAL)) == int(original[GLOBAL]) + 10000
    states = json.loads(run_cli("status", "--json", root=None, state_dir=state_dir)[1])["changes"]
    assert [(c["target"], c["current"], c["state"]) for c in states] == [
        (GLOBAL, read(GLOBAL), "holds"), (target, "900000", "holds")]
    assert run_cli("rollback", root=None, state_dir=state_dir)[0] == 0
    assert {p: read(p) for p in original} == original
    assert run_cli("status", root=None, state_dir=state_dir)[1].strip() == "nothing applied"


@pytest.mark.parametrize("point", ["journaled:2", "written:1", "written:2"])
def test_sigkill_mid_step_then_rollback_restores_the_kernel(point, raise_budget, state_dir):
    path, target, original = raise_budget
    kill_at(point, "apply", path, root=None, state_dir=state_dir)
    status, _, err = run_cli("rollback", root=None, state_dir=state_dir)
    assert status == 0, err
    assert {p: read(p) for p in original} == original


def test_lowering_the_global_budget_works_and_rolls_back(rt_cgroup, profile_file, state_dir):
    root = "/sys/fs/cgroup/cpu/cpu.rt_runtime_us"
    original = {GLOBAL: read(GLOBAL), root: read(root)}
    status, out, err = run_cli("apply", profile_file("[rt_runtime]\nglobal_runtime_us = 900000\n"), "--json",
                               root=None, state_dir=state_dir)
    assert status == 0, out + err
    assert read(GLOBAL) == "900000" and read(root) == "900000"
    assert run_cli("rollback", root=None, state_dir=state_dir)[0] == 0
    assert {p: read(p) for p in original} == original


def test_a_value_the_kernel_refuses_fails_and_is_reverted(rt_cgroup, profile_file, state_dir):
    # The cgroup holds 500000, so the kernel refuses a global budget below it.
    original = read(GLOBAL)
    path = profile_file("[rt_runtime]\nglobal_runtime_us = 400000\n")
    status, out, err = run_cli("apply", path, "--json", root=None, state_dir=state_dir)
    step = json.loads(out)["steps"][0]
    assert status == 1 and step["outcome"] == "failed" and "Invalid argument" in step["reason"]
    assert read(GLOBAL) == original
    assert run_cli("status", root=None, state_dir=state_dir)[1].strip() == "nothing applied"


def as_nobody():
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)


@pytest.mark.parametrize("dry_run", [True, False])
def test_without_root_dry_run_works_and_apply_changes_nothing(dry_run, raise_budget, tmp_path):
    path, target, original = raise_budget
    public = Path(tempfile.mkdtemp(prefix="tuned-rl-nobody-"))  # pytest's tmp_path is private to root
    public.chmod(0o755)
    path = public / "p.toml"
    path.write_text(raise_budget[0].read_text())
    path.chmod(0o644)
    state_dir = public / "state"
    args = ["apply", str(path), "--json"] + (["--dry-run"] if dry_run else [])
    env = {k: v for k, v in os.environ.items() if k != "TUNED_RL_HOST_ROOT"}
    result = subprocess.run([sys.executable, "-m", "tuned_rl.cli", "--state-dir", str(state_dir), *args],
                            capture_output=True, text=True, preexec_fn=as_nobody, env=env, timeout=60)
    if dry_run:
        assert result.returncode == 0, result.stderr
        assert {c["target"] for s in json.loads(result.stdout)["steps"] for c in s["changes"]} == set(original)
        assert not state_dir.exists()
    else:
        assert result.returncode == 1 and "apply needs root" in result.stderr and "nothing was changed" in result.stderr
    assert {p: read(p) for p in original} == original
    shutil.rmtree(public)
