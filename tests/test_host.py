"""The host object: paths stay below its root, cgroup mounts, task identity, CPU lists."""


from __future__ import annotations
import os
import subprocess
import sys

import pytest

from tuned_rl.host import Host, Task, TaskGone, format_cpu_list, parse_cpu_list


def test_paths_resolve_below_the_root(tree):
    assert tree.host.path("/proc/sys/vm/swappiness") == tree.root / "proc/sys/vm/swappiness"
    assert tree.host.read("/proc/sys/vm/swappiness") == "60"


@pytest.mark.parametrize("target", ["proc/sys/vm/swappiness", "/sys/fs/cgroup/cpu/../../../etc/passwd"])
def test_paths_that_could_escape_the_root_are_refused(tree, target):
    with pytest.raises(ValueError):
        tree.host.path(target)


def test_write_replaces_the_value(tree):
    tree.host.write("/proc/sys/vm/swappiness", "10")
    assert tree.get("/proc/sys/vm/swappiness") == "10"


def test_cgroup_v1_mount_is_found_by_controller(tree):
    assert tree.host.cgroup_v1_mount("cpu") == "/sys/fs/cgroup/cpu"
    assert tree.host.cgroup_v1_mount("memory") is None


def test_a_task_is_its_pid_and_start_time():
    me = Host().task(os.getpid())
    assert me.pid == os.getpid() and me.start_time > 0
    Host().check_task(me)
    with pytest.raises(TaskGone):
        Host().check_task(Task(me.pid, me.start_time + 1))


def test_a_task_that_exited_is_gone():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    task = Host().task(child.pid)
    child.wait()
    with pytest.raises(TaskGone):
        Host().get_affinity(task)


def test_affinity_reads_and_writes_as_a_cpu_list():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        task = Host().task(child.pid)
        Host().set_affinity(task, "0")
        assert Host().get_affinity(task) == "0"
        assert os.sched_getaffinity(child.pid) == {0}
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("text, cpus", [("0", {0}), ("0-2,5", {0, 1, 2, 5}), ("3,1", {1, 3})])
def test_cpu_lists_round_trip(text, cpus):
    assert parse_cpu_list(text) == cpus
    assert parse_cpu_list(format_cpu_list(cpus)) == cpus


@pytest.mark.parametrize("text", ["", "a", "1-", "-1", "1,,2", "0-4000000000", "8192"])
def test_bad_cpu_lists_are_refused(text):
    with pytest.raises(ValueError):
        parse_cpu_list(text)


@pytest.mark.parametrize("mounts, whole_process, written", [
    ("cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n", False, "/sys/fs/cgroup/cpu/rl/tasks"),
    ("cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n", True, "/sys/fs/cgroup/cpu/rl/cgroup.procs"),
    ("cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n", False, "/sys/fs/cgroup/rl/cgroup.threads"),
    ("cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n", True, "/sys/fs/cgroup/rl/cgroup.procs"),
])
def test_cgroup_membership_is_written_where_each_version_takes_it(tree, mounts, whole_process, written):
    tree.set("/proc/self/mounts", mounts)
    tree.add_process(300, "job", cgroups={"cpu": "/", "": "/"})
    hierarchy = mounts.split()[1]
    for name in ("tasks", "cgroup.procs", "cgroup.threads"):
        tree.set(f"{hierarchy}/rl/{name}", "")
    tree.host.set_cgroup(tree.host.task(300), hierarchy, "/rl", whole_process=whole_process)
    assert tree.get(written) == "300"
    assert [n for n in ("tasks", "cgroup.procs", "cgroup.threads") if tree.get(f"{hierarchy}/rl/{n}")] == \
        [written.rsplit("/", 1)[1]]
    assert tree.host.get_cgroup(tree.host.task(300), hierarchy) == "/"


def test_the_hierarchy_of_a_cgroup_directory_is_the_deepest_mount_holding_it(tree):
    tree.set("/proc/self/mounts", "cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n"
                                  "cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,cpu,cpuacct 0 0\n")
    assert tree.host.cgroup_mount("/sys/fs/cgroup/cpu,cpuacct/rl").key == "cpu,cpuacct"
    assert tree.host.cgroup_mount("/sys/fs/cgroup/system.slice").version == 2
    with pytest.raises(LookupError):
        tree.host.cgroup_mount("/tmp/x")


@pytest.mark.parametrize("mask, cpus", [("3", {0, 1}), ("00000003", {0, 1}), ("1,00000000", {32}), ("0", set())])
def test_cpu_masks_round_trip(mask, cpus):
    from tuned_rl.host import format_cpu_mask, parse_cpu_mask
    assert parse_cpu_mask(mask) == cpus
    assert parse_cpu_mask(format_cpu_mask(cpus)) == cpus
