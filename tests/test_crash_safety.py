"""SIGKILL at every point of a step, then `tuned-rl rollback` in a new process: every value is back."""


from __future__ import annotations
import json
import os

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


def test_a_short_write_of_a_record_is_an_error_not_a_record_missing_its_last_changes(tree, cli, profile_file,
                                                                                    state_dir, monkeypatch):
    # A nearly full file system: write() takes only part of a record. The apply must fail before the
    # step changes anything, not leave a journal whose record silently lacks the changes it cut off.
    real_write = os.write
    journal = str(state_dir / "journal")

    def short_write(fd, data):
        if os.readlink(f"/proc/self/fd/{fd}").startswith(journal) and len(data) > 40:
            return real_write(fd, bytes(data[:40])) and 0  # 40 bytes reach the disk, then no progress
        return real_write(fd, data)
    monkeypatch.setattr(os, "write", short_write)
    before = tree.get("/proc/sys/kernel/sched_rt_runtime_us")
    status, _, err = cli("apply", profile_file("[rt_runtime]\nglobal_runtime_us = 900000\n"), "--no-verify")
    assert status == 1 and ("No space left" in err or "no progress" in err), err
    assert tree.get("/proc/sys/kernel/sched_rt_runtime_us") == before
    monkeypatch.setattr(os, "write", real_write)
    assert not [p for p in (state_dir / "journal").iterdir() if p.name[:1].isdigit() or p.name.startswith(".")]


def test_replace_file_writes_whole_and_fsyncs_the_directory_after_the_rename(tree, monkeypatch):
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real_fsync(fd)
    monkeypatch.setattr(os, "fsync", fsync)
    tree.host.path("/etc/default").mkdir(parents=True)
    tree.host.replace_file("/etc/default/irqbalance", b"x" * 100_000, 0o644)
    assert tree.host.path("/etc/default/irqbalance").read_bytes() == b"x" * 100_000
    assert synced[-1] == str(tree.host.path("/etc/default"))  # the directory, after the file itself
    assert synced[-2].endswith(".irqbalance.tuned-rl-tmp")
