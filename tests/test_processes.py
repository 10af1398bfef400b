"""The host's process API: processes and threads read through the host root, on a tree and live."""


from __future__ import annotations
import os
import subprocess
import sys
import threading

import pytest

from tuned_rl.host import Host, TaskGone
from tuned_rl.host.processes import PF_KTHREAD, PF_NO_SETAFFINITY
from tuned_rl.measure.targets import Target, resolve_tids


@pytest.fixture
def busy_tree(tree):
    tree.set("/etc/passwd", "root:x:0:0::/root:/bin/sh\nray:x:1000:1000::/home/ray:/bin/sh\n")
    tree.add_process(1, "init", cmdline="/sbin/init splash")
    tree.add_process(2, "kthreadd", cmdline="", flags=PF_KTHREAD)
    tree.add_process(15, "migration/0", cmdline="", flags=PF_KTHREAD | PF_NO_SETAFFINITY, ppid=2, affinity="0",
                     policy=1, rt_priority=99)
    tree.add_process(400, "ray::Actor", threads=(401, 402), uid=1000, cmdline="ray::Actor.step --actor 3",
                     nice=-5, cgroups={"cpu,cpuacct": "/rl", "cpuset": "/", "": "/user.slice"}, start_time=7000)
    return tree


def test_processes_lists_each_process_once_with_what_plugins_need(busy_tree):
    processes = {p.pid: p for p in busy_tree.host.processes()}
    assert sorted(processes) == [1, 2, 15, 400]  # threads are not processes
    actor = processes[400]
    assert (actor.comm, actor.cmdline, actor.uid, actor.nice, actor.ppid) == ("ray::Actor", "ray::Actor.step --actor 3",
                                                                               1000, -5, 1)
    assert actor.cgroups == {"cpu,cpuacct": "/rl", "cpuset": "/", "": "/user.slice"}
    assert actor.task.start_time == 7000 and actor.is_thread_leader and not actor.kernel_thread
    assert busy_tree.host.user_name(actor.uid) == "ray"


def test_kernel_threads_and_those_bound_to_a_cpu_are_flagged(busy_tree):
    processes = {p.pid: p for p in busy_tree.host.processes()}
    assert processes[2].kernel_thread and not processes[2].fixed_affinity and processes[2].cmdline == ""
    migration = processes[15]
    assert migration.kernel_thread and migration.fixed_affinity
    assert (migration.sched, migration.affinity) == ("SCHED_FIFO:99", "0")


def test_threads_of_a_process_each_have_their_identity(busy_tree):
    threads = busy_tree.host.threads(400)
    assert [(t.pid, t.tgid, t.start_time) for t in threads] == [(400, 400, 7000), (401, 400, 7001), (402, 400, 7002)]
    assert busy_tree.host.thread_ids(400) == {400, 401, 402}
    assert busy_tree.host.thread_ids(99999) == set()


def test_a_process_that_is_gone_is_task_gone(busy_tree):
    with pytest.raises(TaskGone):
        busy_tree.host.process(99999)


def test_targets_by_name_use_the_process_api(busy_tree, monkeypatch):
    ray = ("root", "1000")  # the actor runs as uid 1000
    assert resolve_tids(busy_tree.host, Target("name", r"^ray::", ray)) == {400, 401, 402}
    assert resolve_tids(busy_tree.host, Target("name", r"--actor 3", ray)) == {400, 401, 402}  # the command line
    assert resolve_tids(busy_tree.host, Target("pid", "400")) == {400, 401, 402}


def test_live_processes_and_threads_of_this_test():
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    try:
        me = Host().process(os.getpid())
        assert me.comm == open("/proc/self/comm").read().strip() and me.tgid == os.getpid()
        assert me.affinity and me.policy == "SCHED_OTHER" and not me.kernel_thread
        threads = Host().threads(os.getpid())
        assert worker.native_id in {t.pid for t in threads} and all(t.tgid == os.getpid() for t in threads)
        assert os.getpid() in {p.pid for p in Host().processes()}
    finally:
        stop.set()
        worker.join()


def test_live_kernel_threads_are_flagged():
    kthreadd = Host().process(2)
    assert kthreadd.kernel_thread and kthreadd.cmdline == ""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert not Host().process(child.pid).kernel_thread
    finally:
        child.kill()
        child.wait()


def test_a_command_line_is_read_and_matched_on_its_first_4_kib_only(tree):
    from tuned_rl.host.tasks import CMDLINE_LIMIT
    tree.add_process(700, "python3", (701,), cmdline="python " * 500_000 + "serve")  # 3.5 MB
    comm, cmdline = tree.host.process_names(700)
    assert len(cmdline.encode()) <= CMDLINE_LIMIT and cmdline.startswith("python python")
    assert all(len(t.cmdline.encode()) <= CMDLINE_LIMIT for t in tree.host.threads(700))
    assert len(tree.host.process(700).cmdline.encode()) <= CMDLINE_LIMIT
    # "python.*serve" would scan megabytes from each of half a million starts; on 4 KiB it finds no "serve".
    assert resolve_tids(tree.host, Target("name", "python.*serve")) == set()
    assert resolve_tids(tree.host, Target("name", "^python python")) == {700, 701}
