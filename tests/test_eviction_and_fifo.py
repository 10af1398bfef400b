"""[offline_eviction] and [sched_fifo] on temporary trees (cgroup v1 as on this machine, and v2)."""


from __future__ import annotations
import json
import os
import subprocess
import sys

import pytest

from helpers import MOUNTS_V2_ONLY, CgroupTreeHost
from tuned_rl.host.processes import PF_KTHREAD, parse_cgroup_file

CPU = "/sys/fs/cgroup/cpu"
CPUSET = "/sys/fs/cgroup/cpuset"
V1 = {"cpu": "/", "cpuset": "/"}


@pytest.fixture
def host_tree(cgroup_tree_host):
    tree = cgroup_tree_host
    tree.set(f"{CPU}/cgroup.procs", "")
    tree.set(f"{CPUSET}/cpuset.cpus", "0-1")
    tree.set(f"{CPUSET}/cpuset.mems", "0")
    tree.set("/proc/sys/kernel/osrelease", "6.1.0-28-amd64")
    tree.set("/etc/passwd", "root:x:0:0::/root:/bin/sh\nbatch:x:1001:1001::/home/batch:/bin/sh\n")
    tree.add_process(1, "systemd", ppid=0, cmdline="/sbin/init stress", cgroups=V1, start_time=1)
    tree.add_process(2, "kthreadd", ppid=0, flags=PF_KTHREAD, cgroups=V1, start_time=2)
    tree.add_process(100, "model", (101,), cmdline="python serve.py", cgroups=V1, start_time=5000)
    tree.set("/proc/100/task/101/stat", tree.get("/proc/100/task/101/stat").replace("(model)", "(actor)"))
    tree.add_process(200, "stress", (201,), cmdline="stress --cpu 1", uid=1001, cgroups=V1, start_time=6000)
    tree.add_process(300, "python3", cmdline="python3 train.py --epochs 9", uid=1001,
                     cgroups={"cpu": "/batch/job1", "cpuset": "/"}, start_time=7000)
    tree.add_process(400, "stress", cmdline="stress --io 1", uid=0, cgroups=V1, start_time=8000)
    return tree


def cgroup_of(tree, pid, key):
    return parse_cgroup_file(tree.get(f"/proc/{pid}/cgroup"))[key]


EVICT = """\
[target]
name = "^model$"

[offline_eviction]
policy = "SCHED_IDLE"
nice = 19
io_class = "idle"
cpus = "0"

[[offline_eviction.match]]
name = "^stress$"
user = "batch"

[[offline_eviction.match]]
cmdline = "train\\\\.py"

[[offline_eviction.match]]
name = "^(model|systemd|kthreadd)$"
"""


def test_matched_jobs_are_evicted_spared_ones_named_and_rollback_is_exact(host_tree, cli, profile_file):
    tree = host_tree
    original = tree.snapshot()
    profile = profile_file(EVICT)
    dry = json.loads(cli("apply", profile, "--dry-run", "--json")[1])
    [step] = dry["steps"]
    notes = "\n".join(step["notes"])
    assert "matched pid 200 (stress): name 'stress' matches '^stress$', runs as batch" in notes
    assert "matched pid 300 (python3): command line matches 'train\\\\.py'" in notes
    assert "pid 400" not in notes  # stress, but not run by batch
    assert "spared pid 100 (model)" in notes and "it is the [target]" in notes
    assert "spared pid 1 (systemd)" in notes and "PID 1" in notes
    assert "spared pid 2 (kthreadd)" in notes and "a kernel thread" in notes
    assert tree.snapshot() == original

    status, out, err = cli("apply", profile, "--json")
    assert status == 0, err
    assert tree.get(f"{CPU}/tuned-rl-offline/cpu.shares") == "2"
    assert tree.get(f"{CPUSET}/tuned-rl-offline/cpuset.cpus") == "0"
    for pid in (200, 300):
        assert cgroup_of(tree, pid, "cpu") == "/tuned-rl-offline" and cgroup_of(tree, pid, "cpuset") == "/tuned-rl-offline"
    for tid in (200, 201, 300):
        task = tree.host.task(tid)
        assert tree.host.get_sched(task) == "SCHED_IDLE:0" and tree.host.get_nice(task) == "19"
        assert tree.host.get_io_priority(task) == "idle:0"
    for pid in (1, 2, 100, 400):
        assert cgroup_of(tree, pid, "cpu") == "/"
    assert cli("rollback")[0] == 0
    assert tree.snapshot() == original  # /batch/job1 again, policies, nice, I/O class; cgroups removed



def test_on_a_kernel_with_cpu_idle_the_v1_group_is_made_idle_not_given_shares(host_tree, cli, profile_file):
    """Linux 5.15+ has cpu.idle in v1 too: an idle group's tasks are preempted at once by a waking
    workload thread; cpu.shares 2 alone does not do that (and refuses writes once idle is set)."""
    tree = host_tree
    tree.set(f"{CPU}/cpu.idle", "0")
    original = tree.snapshot()
    status, out, err = cli("apply", profile_file(EVICT), "--json")
    assert status == 0, err
    assert tree.get(f"{CPU}/tuned-rl-offline/cpu.idle") == "1"
    assert tree.get(f"{CPU}/tuned-rl-offline/cpu.shares") == "1024"  # not written
    [step] = json.loads(out)["steps"]
    assert step["changes"][0]["after"] == "present, cpu.idle=1"
    assert cli("rollback")[0] == 0
    assert tree.snapshot() == original

def test_a_job_forked_inside_the_offline_cgroup_follows_its_parent_back(host_tree, cli, profile_file):
    tree = host_tree
    assert cli("apply", profile_file(EVICT))[0] == 0
    tree.add_process(310, "python3", ppid=300, cmdline="python3 worker.py", cgroups={"cpu": "/tuned-rl-offline",
                                                                                     "cpuset": "/tuned-rl-offline"},
                     start_time=9000)
    # What the offline cgroups hold once the evicted jobs have moved back: the job forked meanwhile.
    tree.set(f"{CPU}/tuned-rl-offline/tasks", "310")
    tree.set(f"{CPUSET}/tuned-rl-offline/tasks", "310")
    assert cli("rollback")[0] == 0
    assert cgroup_of(tree, 310, "cpu") == "/batch/job1" and cgroup_of(tree, 310, "cpuset") == "/"


def test_a_job_that_exited_before_its_move_is_counted_not_an_error(host_tree, cli, profile_file, monkeypatch):
    import shutil
    write = CgroupTreeHost.write

    def write_after_exit(self, target, value):
        if target.endswith("cgroup.procs") and value == "300":
            shutil.rmtree(self.path("/proc/300"), ignore_errors=True)
        return write(self, target, value)

    monkeypatch.setattr(CgroupTreeHost, "write", write_after_exit)
    status, out, err = cli("apply", profile_file(EVICT), "--json")
    assert status == 0, err
    assert json.loads(out)["steps"][0]["gone"] == 1
    status, out, _ = cli("rollback", "--json")
    assert status == 0


def test_a_reused_pid_is_never_touched(host_tree, cli, profile_file, monkeypatch):
    tree, write = host_tree, CgroupTreeHost.write

    def reuse_pid_200(self, target, value):
        if target.endswith("/cpu.shares"):  # after the plan, before the moves
            tree.add_process(200, "bash", cgroups=V1, start_time=99999)  # 200 exited; a new task got its pid
        return write(self, target, value)

    monkeypatch.setattr(CgroupTreeHost, "write", reuse_pid_200)
    status, out, err = cli("apply", profile_file(EVICT), "--json")
    assert status == 0, err
    assert cgroup_of(tree, 200, "cpu") == "/" and tree.host.get_nice(tree.host.task(200)) == "0"


def test_v2_one_cgroup_with_minimal_weight_idle_and_cpus(host_tree, cli, profile_file):
    tree = host_tree
    tree.set("/proc/self/mounts", MOUNTS_V2_ONLY)
    tree.set("/sys/fs/cgroup/cgroup.subtree_control", "cpuset cpu memory")
    tree.add_process(500, "stress", cmdline="stress", uid=1001, cgroups={"": "/user.slice/batch.scope"},
                     start_time=500)
    original = tree.snapshot()
    status, out, err = cli("apply", profile_file('[offline_eviction]\ncpus = "0"\n[[offline_eviction.match]]\n'
                                                  'cgroup = "/user.slice"\n'), "--json")
    assert status == 0, out
    assert [tree.get(f"/sys/fs/cgroup/tuned-rl-offline/{k}") for k in ("cpu.weight", "cpu.idle", "cpuset.cpus")] == \
        ["1", "1", "0"]
    assert cgroup_of(tree, 500, "") == "/tuned-rl-offline"
    assert cli("rollback")[0] == 0 and tree.snapshot() == original


def test_nothing_matching_is_skipped_and_says_so(host_tree, cli, profile_file):
    out = cli("apply", profile_file('[offline_eviction]\n[[offline_eviction.match]]\nname = "^nothing$"\n'),
              "--json")[1]
    step = json.loads(out)["steps"][0]
    assert step["outcome"] == "skipped" and step["reason"] == "no running process matches"


@pytest.mark.parametrize("table, message", [
    ("cgroup = true", "required key is missing"),
    ("match = []", "names no matcher"),
    ('[[offline_eviction.match]]\ncolour = "red"', "unknown key 'colour'"),
    ('[[offline_eviction.match]]\nname = "("', "not a regular expression"),
    ('policy = "SCHED_FIFO"\n[[offline_eviction.match]]\nname = "x"', "must be one of"),
    ('cgroup = false\n[[offline_eviction.match]]\nname = "x"', "nothing to do"),
    ('nice = 40\n[[offline_eviction.match]]\nname = "x"', "above the maximum"),
])
def test_a_bad_eviction_table_exits_2(host_tree, cli, profile_file, table, message):
    status, _, err = cli("apply", profile_file(f"[offline_eviction]\n{table}\n"))
    assert status == 2 and message in err, err


FIFO = '[target]\nname = "^model$"\n\n[sched_fifo]\n'


def test_fifo_threads_of_the_target_become_sched_other_at_nice_minus_20_and_come_back(host_tree, cli, profile_file):
    tree = host_tree
    tree.add_process(600, "model", (601, 602), policy=1, rt_priority=50, nice=-5, cgroups=V1, start_time=600)
    tree.host.set_sched(tree.host.task(602), "SCHED_OTHER:0")  # one thread is not real-time
    tree.host.set_sched(tree.host.task(601), "SCHED_RR:10")
    original = tree.snapshot()
    status, out, err = cli("apply", profile_file(FIFO), "--json")
    assert status == 0, err
    [step] = json.loads(out)["steps"]
    assert step["phase"] == "policies"
    for tid in (600, 601):
        task = tree.host.task(tid)
        assert tree.host.get_sched(task) == "SCHED_OTHER:0" and tree.host.get_nice(task) == "-20"
    assert tree.host.get_nice(tree.host.task(602)) == "-5"  # untouched
    targets = [c["target"] for c in step["changes"]]
    assert targets.index("pid 600 (model) nice") < targets.index("pid 600 (model) sched")  # nice first
    assert cli("rollback")[0] == 0 and tree.snapshot() == original


def test_a_thread_started_by_a_thread_held_off_fifo_is_given_fifo_back_at_rollback(host_tree, cli, profile_file,
                                                                                    monkeypatch):
    # watch converts a late FIFO process at its exec, before it starts its worker thread: the
    # worker is born SCHED_OTHER at nice -20, no record names it, and rollback must not leave it so.
    import time
    from tuned_rl.core import undo
    from tuned_rl.host.host import Host
    tree = host_tree
    tree.add_process(600, "model", policy=1, rt_priority=20, cgroups=V1, start_time=600)
    tree.add_process(700, "model", (701,), policy=1, rt_priority=20, cgroups=V1, start_time=700)
    tree.host.set_sched(tree.host.task(701), "SCHED_RR:10")  # two threads, two originals
    assert cli("apply", profile_file(FIFO), "--no-verify")[0] == 0
    applied_at = time.time()
    monkeypatch.setattr(undo, "SETTLE_S", 0.0)
    monkeypatch.setattr(Host, "started_at", lambda self, task: applied_at + 5 if task.start_time >= 9000 else 0.0)
    tree.add_thread(600, 601, nice=-20, start_time=9100)  # started by the held main thread
    tree.add_thread(600, 602, start_time=9200)  # started by a thread of its own at SCHED_OTHER: its own
    tree.add_thread(600, 603, nice=-20, start_time=500 + 9)  # born before the apply: its own
    tree.add_thread(700, 702, nice=-20, start_time=9300)  # FIFO:20 or RR:10 before? not known: left
    status, out, _ = cli("rollback")
    assert status == 0 and "a thread started in pid 600 while tuned-rl held it at SCHED_OTHER:0" in out, out
    sched_and_nice = {tid: (tree.host.get_sched(tree.host.task(tid)), tree.host.get_nice(tree.host.task(tid)))
                      for tid in (600, 601, 602, 603, 700, 701, 702)}
    assert sched_and_nice == {600: ("SCHED_FIFO:20", "0"), 601: ("SCHED_FIFO:20", "0"), 602: ("SCHED_OTHER:0", "0"),
                              603: ("SCHED_OTHER:0", "-20"), 700: ("SCHED_FIFO:20", "0"), 701: ("SCHED_RR:10", "0"),
                              702: ("SCHED_OTHER:0", "-20")}, sched_and_nice


def test_a_thread_started_between_the_nice_and_the_policy_write_is_given_both_originals_at_rollback(
        host_tree, cli, profile_file, monkeypatch):
    # The nice is written first, then the policy (and undone in reverse): a thread started between
    # the two copies SCHED_FIFO at nice -20. It is no value of its own, and rollback must not leave
    # it so; a mix that is no such copy (SCHED_OTHER at nice 0, nice -10) is left as it is.
    import time
    from tuned_rl.core import undo
    from tuned_rl.host.host import Host
    tree = host_tree
    tree.add_process(600, "model", policy=1, rt_priority=20, cgroups=V1, start_time=600)
    assert cli("apply", profile_file(FIFO), "--no-verify")[0] == 0
    applied_at = time.time()
    monkeypatch.setattr(undo, "SETTLE_S", 0.0)
    monkeypatch.setattr(Host, "started_at", lambda self, task: applied_at + 5 if task.start_time >= 9000 else 0.0)
    tree.add_thread(600, 601, policy=1, rt_priority=20, nice=-20, start_time=9100)  # between the two writes
    tree.add_thread(600, 602, start_time=9200)  # SCHED_OTHER at nice 0: its own
    tree.add_thread(600, 603, policy=1, rt_priority=20, nice=-10, start_time=9300)  # its own nice
    status, out, _ = cli("rollback")
    assert status == 0 and "a thread started in pid 600 while tuned-rl held it at -20: given the original" in out, out
    sched_and_nice = {tid: (tree.host.get_sched(tree.host.task(tid)), tree.host.get_nice(tree.host.task(tid)))
                      for tid in (600, 601, 602, 603)}
    assert sched_and_nice == {600: ("SCHED_FIFO:20", "0"), 601: ("SCHED_FIFO:20", "0"), 602: ("SCHED_OTHER:0", "0"),
                              603: ("SCHED_FIFO:20", "-10")}, sched_and_nice


def test_no_fifo_thread_means_skipped(host_tree, cli, profile_file):
    step = json.loads(cli("apply", profile_file(FIFO + "nice = -10\n"), "--json")[1])["steps"][0]
    assert step["outcome"] == "skipped" and "no SCHED_FIFO or SCHED_RR thread" in step["reason"]


def test_fifo_removal_needs_a_named_workload(host_tree, cli, profile_file):
    status, _, err = cli("apply", profile_file("[target]\ncanary = true\n\n[sched_fifo]\n"))
    assert status == 2 and "needs a [target] naming the workload" in err


def test_a_job_whose_command_line_says_tuned_rl_is_evicted_like_any_other(host_tree, cli, profile_file):
    # tuned-rl is known by its pids (itself, its parents, its children), never by text a job can copy.
    host_tree.add_process(900, "python3", uid=0, cmdline="python3 burn.py --pretend tuned-rl -m tuned_rl.x",
                          start_time=9000)
    profile = profile_file('[offline_eviction]\npolicy = "SCHED_IDLE"\ncgroup = false\n'
                           '[[offline_eviction.match]]\ncmdline = "burn\\\\.py"\n')
    [step] = json.loads(cli("apply", profile, "--dry-run", "--json")[1])["steps"]
    assert any(n.startswith("matched pid 900 (python3)") for n in step["notes"]), step["notes"]


def test_tuned_rl_its_parents_and_its_children_are_spared_by_pid():
    from tuned_rl.host import Host
    from tuned_rl import family
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        host = Host()
        ours = family(host, host.processes())
        assert {os.getpid(), os.getppid(), child.pid} <= ours and 1 not in ours
    finally:
        child.kill()
        child.wait()
