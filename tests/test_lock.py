"""Two concurrent applies: the second fails at once, naming the first's pid; the journal stays valid."""


from __future__ import annotations
import json
import os
import signal
import time

from tuned_rl.core.journal import Journal

from helpers import kill_at, run_cli, spawn_cli, wait_until_stopped

PROFILE = '[rt_runtime]\nglobal_runtime_us = 960000\ncgroup = "rl"\ncgroup_runtime_us = 500000\n'


def test_a_second_apply_fails_at_once_naming_the_first(tree, profile_file, state_dir):
    tree.cgroup("rl", runtime=100000)
    original = tree.snapshot()
    path = profile_file(PROFILE)
    first = spawn_cli("apply", path, root=tree.root, state_dir=state_dir, env={"TUNED_RL_PAUSE_AT": "written:1"})
    wait_until_stopped(first)  # holds the lock, half-way through its first step
    started = time.monotonic()
    for command in (["apply", path], ["rollback"]):
        status, out, err = run_cli(*command, root=tree.root, state_dir=state_dir)
        assert status == 1 and f"pid {first.pid}" in err, err
    assert time.monotonic() - started < 10  # "at once": no waiting for the lock
    records = Journal(state_dir).records()
    assert [c.target for r in records for c in r.changes] == ["/proc/sys/kernel/sched_rt_runtime_us"]
    os.kill(first.pid, signal.SIGCONT)
    out, err = first.communicate(timeout=30)
    assert first.returncode == 0, err
    status = json.loads(run_cli("status", "--json", root=tree.root, state_dir=state_dir)[1])
    assert [c["state"] for c in status["changes"]] == ["holds", "holds"]
    assert run_cli("rollback", root=tree.root, state_dir=state_dir)[0] == 0
    assert tree.snapshot() == original


def test_a_dead_holders_lock_is_free_again(tree, profile_file, state_dir):
    kill_at("journaled:1", "apply", profile_file(PROFILE.replace('cgroup = "rl"\ncgroup_runtime_us = 500000\n', "")),
            root=tree.root, state_dir=state_dir)
    assert run_cli("rollback", root=tree.root, state_dir=state_dir)[0] == 0
