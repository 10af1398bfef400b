"""[offline_eviction] and [sched_fifo] on the live host, undone exactly."""


from __future__ import annotations
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from helpers import FORKER, forked_child, run_cli
from tuned_rl.host import Host

CPU = Path("/sys/fs/cgroup/cpu")
JOB = "tuned-rl-test-offline-job"
pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not (CPU / "cgroup.procs").exists(),
                                reason="needs root and a v1 cpu hierarchy")

# Offline jobs asleep: the test is about where they are, not what they cost.
SLEEPING_JOB = "import time; time.sleep(120)"


def cpu_cgroup(pid: int) -> str:
    return next(line.rsplit(":", 1)[1].strip() for line in open(f"/proc/{pid}/cgroup") if line.split(":")[1] == "cpu")


def state_of(host: Host, pid: int) -> dict:
    """Every value eviction changes, for each thread of ``pid``."""
    return {tid: (cpu_cgroup(pid), host.get_sched(host.task(tid)), host.get_nice(host.task(tid)),
                  host.get_io_priority(host.task(tid))) for tid in sorted(host.thread_ids(pid))}


def test_eviction_moves_matched_jobs_spares_the_target_and_rollback_restores_each_exactly(tmp_path):
    host = Host()
    (CPU / "tuned-rl-test-batch").mkdir()
    jobs = [subprocess.Popen([sys.executable, "-c", FORKER, str(tmp_path / "child"), JOB]),
            subprocess.Popen([sys.executable, "-c", SLEEPING_JOB, JOB]),
            subprocess.Popen([sys.executable, "-c", SLEEPING_JOB, JOB])]
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", JOB, "the-target"])
    try:
        time.sleep(0.3)
        (CPU / "tuned-rl-test-batch" / "cgroup.procs").write_text(str(jobs[1].pid))  # a job with a cgroup of its own
        os.setpriority(os.PRIO_PROCESS, jobs[1].pid, 5)
        host.set_io_priority(host.task(jobs[1].pid), "best-effort:3")
        before = {job.pid: state_of(host, job.pid) for job in jobs}
        before_target, before_init = state_of(host, target.pid), state_of(host, 1)
        profile = tmp_path / "evict.toml"
        profile.write_text(f'[target]\nname = "the-target"\n\n[offline_eviction]\npolicy = "SCHED_IDLE"\nnice = 19\n'
                           f'io_class = "idle"\n\n[[offline_eviction.match]]\ncmdline = "{JOB}"\n')
        state = tmp_path / "state"
        status, out, err = run_cli("apply", profile, "--no-verify", "--json", root=None, state_dir=state)
        try:
            assert status == 0, err
            step = json.loads(out)["steps"][0]
            assert step["outcome"] == "applied"
            assert any(n.startswith(f"spared pid {target.pid}") and "[target]" in n for n in step["notes"])
            for job in jobs:
                for tid, values in state_of(host, job.pid).items():
                    assert values == ("/tuned-rl-offline", "SCHED_IDLE:0", "19", "idle:0"), (tid, values)
            assert state_of(host, target.pid) == before_target and state_of(host, 1) == before_init
            child = forked_child(jobs[0], tmp_path / "child")  # an evicted job forks: its child is evicted too
            assert cpu_cgroup(child) == "/tuned-rl-offline"
            jobs[2].kill()  # exits before the rollback
            jobs[2].wait()
        finally:
            status, out, err = run_cli("rollback", "--json", root=None, state_dir=state)
        assert status == 0, err
        outcomes = {(c["target"], c["outcome"]) for c in json.loads(out)["changes"]}
        assert any(f"pid {jobs[2].pid} " in t and o == "gone" for t, o in outcomes)  # reported, not an error
        for job in jobs[:2]:
            assert state_of(host, job.pid) == before[job.pid]
        assert cpu_cgroup(child) == "/"  # back where its parent came from
        assert not (CPU / "tuned-rl-offline").exists()
    finally:
        for process in (*jobs, target):
            process.kill()
            process.wait()
        try:
            os.kill(int((tmp_path / "child").read_text()), signal.SIGKILL)
        except (OSError, ValueError):
            pass
        for tid in (CPU / "tuned-rl-test-batch" / "tasks").read_text().split():
            try:
                (CPU / "tasks").write_text(tid)
            except OSError:
                pass
        (CPU / "tuned-rl-test-batch").rmdir()


FIFO_WORKLOAD = textwrap.dedent("""\
    import os, threading, time
    def rr():
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(20))
        time.sleep(120)
    threading.Thread(target=rr).start()
    os.setpriority(os.PRIO_PROCESS, 0, 3)
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(30))
    time.sleep(120)
""")


def test_fifo_removal_makes_the_targets_rt_threads_sched_other_and_rollback_gives_back_policy_priority_nice(tmp_path):
    host = Host()
    workload = subprocess.Popen([sys.executable, "-c", FIFO_WORKLOAD, "tuned-rl-test-fifo"])
    try:
        time.sleep(0.5)
        threads = sorted(host.thread_ids(workload.pid))
        before = {t: (host.get_sched(host.task(t)), host.get_nice(host.task(t))) for t in threads}
        assert sorted(v[0] for v in before.values()) == ["SCHED_FIFO:30", "SCHED_RR:20"]
        profile = tmp_path / "fifo.toml"
        profile.write_text('[target]\nname = "tuned-rl-test-fifo"\n\n[sched_fifo]\n')
        state = tmp_path / "state"
        status, out, err = run_cli("apply", profile, "--no-verify", root=None, state_dir=state)
        try:
            assert status == 0, err
            for tid in threads:
                assert (host.get_sched(host.task(tid)), host.get_nice(host.task(tid))) == ("SCHED_OTHER:0", "-20")
        finally:
            status, _, err = run_cli("rollback", root=None, state_dir=state)
        assert status == 0, err
        assert {t: (host.get_sched(host.task(t)), host.get_nice(host.task(t))) for t in threads} == before
    finally:
        workload.kill()
        workload.wait()
