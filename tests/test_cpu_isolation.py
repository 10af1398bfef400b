"""[cpu_isolation] on temporary trees: cgroup v1 cpusets (this machine) and v2 isolated partitions."""


from __future__ import annotations
import json

import pytest

from helpers import MOUNTS_V2_ONLY, CgroupTreeHost, refuse_writes
from tuned_rl.host.processes import PF_KTHREAD, PF_NO_SETAFFINITY
from tuned_rl.measure.targets import Target, resolve_tids

CPUSET = "/sys/fs/cgroup/cpuset"
V2 = "/sys/fs/cgroup"
PROFILE = """\
[target]
name = "^model$"

[cpu_isolation]
latency_cpus = "1"
"""


@pytest.fixture
def cgroup_tree(cgroup_tree_host):
    """The tree as the kernel's cgroupfs would act, used by the cli."""
    tree = cgroup_tree_host
    tree.set("/proc/cmdline", "BOOT_IMAGE=/vmlinuz root=/dev/vda1")
    tree.set("/sys/devices/virtual/workqueue/cpumask", "3")
    return tree


def v1_host(tree):
    tree.set(f"{CPUSET}/cpuset.cpus", "0-1")
    tree.set(f"{CPUSET}/cpuset.mems", "0")
    tree.set(f"{CPUSET}/cgroup.procs", "")
    tree.set(f"{CPUSET}/tasks", "")
    v1 = {"cpu": "/", "cpuset": "/"}
    tree.add_process(100, "model", (101, 102), cgroups=v1, start_time=5000)  # the workload
    tree.set("/proc/100/task/101/stat", tree.get("/proc/100/task/101/stat").replace("(model)", "(actor-0)"))
    tree.set("/proc/100/task/102/stat", tree.get("/proc/100/task/102/stat").replace("(model)", "(io-0)"))
    tree.add_process(200, "hog", cgroups=v1, start_time=6000)
    tree.add_process(2, "kthreadd", ppid=0, flags=PF_KTHREAD, cgroups=v1, start_time=1)
    tree.add_process(15, "rcu_preempt", ppid=2, flags=PF_KTHREAD, cgroups=v1, start_time=3)
    tree.add_process(20, "ksoftirqd/1", ppid=2, flags=PF_KTHREAD | PF_NO_SETAFFINITY, affinity="1", cgroups=v1,
                     start_time=2)
    tree.set(f"{CPUSET}/docker/cpuset.cpus", "0-1")
    tree.set(f"{CPUSET}/docker/cpuset.mems", "0")
    tree.add_process(300, "containerd-shim", cgroups={"cpu": "/", "cpuset": "/docker"}, start_time=7000)


def cgroup_of(tree, pid, key="cpuset"):
    from tuned_rl.host.processes import parse_cgroup_file
    return parse_cgroup_file(tree.get(f"/proc/{pid}/cgroup"))[key]


def test_v1_the_workload_gets_the_latency_cpus_and_every_other_movable_task_the_rest(cgroup_tree, cli, profile_file):
    tree = cgroup_tree
    v1_host(tree)
    original = tree.snapshot()
    profile = profile_file(PROFILE)
    dry = json.loads(cli("apply", profile, "--dry-run", "--json")[1])
    [step] = dry["steps"]
    assert step["outcome"] == "planned" and step["phase"] == "placement"
    targets = [c["target"] for c in step["changes"]]
    assert targets[:2] == [f"{CPUSET}/tuned-rl-housekeeping", f"{CPUSET}/tuned-rl-workload"]
    assert f"pid 100 (model) process_cgroup in {CPUSET}" in targets
    assert f"pid 200 (hog) process_cgroup in {CPUSET}" in targets
    assert f"pid 15 (rcu_preempt) process_cgroup in {CPUSET}" in targets
    assert f"pid 2 (kthreadd) process_cgroup in {CPUSET}" not in targets  # the kernel refuses to move it
    assert any("kthreadd cannot leave the root cpuset" in n for n in step["notes"])
    assert not any("ksoftirqd" in t for t in targets)
    assert any("1 per-CPU kernel threads stay" in n for n in step["notes"])
    assert any("isolcpus=managed_irq,domain,1 nohz_full=1 rcu_nocbs=1" in n for n in step["notes"])
    assert tree.snapshot() == original  # the dry run wrote nothing

    status, out, err = cli("apply", profile, "--json")
    assert status == 0, err
    assert json.loads(out)["steps"][0]["outcome"] == "applied"
    assert tree.get(f"{CPUSET}/tuned-rl-workload/cpuset.cpus") == "1"
    assert tree.get(f"{CPUSET}/tuned-rl-housekeeping/cpuset.cpus") == "0"
    assert cgroup_of(tree, 100) == "/tuned-rl-workload" and cgroup_of(tree, 200) == "/tuned-rl-housekeeping"
    assert cgroup_of(tree, 15) == "/tuned-rl-housekeeping" and cgroup_of(tree, 20) == "/"
    assert tree.get(f"{CPUSET}/docker/cpuset.cpus") == "0" and cgroup_of(tree, 300) == "/docker"
    assert tree.get("/sys/devices/virtual/workqueue/cpumask") == "1"

    assert cli("rollback")[0] == 0
    assert tree.snapshot() == original


def test_pins_give_each_matching_thread_its_own_cpu_and_come_back(cgroup_tree, cli, profile_file):
    tree = cgroup_tree
    tree.set("/sys/devices/system/cpu/online", "0-3")
    v1_host(tree)
    tree.set(f"{CPUSET}/cpuset.cpus", "0-3")
    original = tree.snapshot()
    profile = profile_file(PROFILE.replace('"1"', '"1-3"') + '\n[cpu_isolation.pin]\n"^actor" = "2-3"\n"^io" = "1"\n')
    status, out, err = cli("apply", profile, "--json")
    assert status == 0, err
    assert tree.host.process(101).affinity == "2" and tree.host.process(102).affinity == "1"
    assert tree.host.process(100).affinity == "0-1"  # no pattern matched the main thread: it keeps its own
    changes = [c["target"] for c in json.loads(out)["steps"][0]["changes"]]
    assert changes.index("pid 101 (actor-0) affinity") < changes.index(f"pid 100 (model) process_cgroup in {CPUSET}")
    assert cli("rollback")[0] == 0 and tree.snapshot() == original


def test_patterns_given_the_same_cpus_are_told_they_share_them(cgroup_tree, cli, profile_file):
    tree = cgroup_tree
    tree.set("/sys/devices/system/cpu/online", "0-3")
    v1_host(tree)
    tree.set(f"{CPUSET}/cpuset.cpus", "0-3")
    profile = profile_file(PROFILE.replace('"1"', '"1-3"') + '\n[cpu_isolation.pin]\n"^actor" = "1-3"\n"^io" = "1-3"\n')
    status, out, err = cli("apply", profile, "--dry-run", "--json")
    assert status == 0, err
    [step] = json.loads(out)["steps"]
    assert [(c["target"], c["after"]) for c in step["changes"] if c["target"].endswith(" affinity")] == [
        ("pid 101 (actor-0) affinity", "1"), ("pid 102 (io-0) affinity", "1")]  # each pattern deals from CPU 1
    assert "pin: CPU 1 is given threads of 2 patterns ('^actor', '^io'): they share it" in " ".join(step["notes"])
    separate = profile_file(PROFILE.replace('"1"', '"1-3"') + '\n[cpu_isolation.pin]\n"^actor" = "2-3"\n"^io" = "1"\n')
    [step] = json.loads(cli("apply", separate, "--dry-run", "--json")[1])["steps"]
    assert not [n for n in step["notes"] if n.startswith("pin: CPU")]


def test_a_task_that_exits_before_its_move_is_counted_not_an_error(cgroup_tree, cli, profile_file, monkeypatch):
    tree = cgroup_tree
    v1_host(tree)
    original_write = CgroupTreeHost.write

    def write(self, target, value):
        if target.endswith("/cgroup.procs") and value == "200":
            import shutil
            shutil.rmtree(self.path("/proc/200"))  # the hog exits just before its move
        return original_write(self, target, value)

    monkeypatch.setattr(CgroupTreeHost, "write", write)
    status, out, err = cli("apply", profile_file(PROFILE), "--json")
    assert status == 0, err
    step = json.loads(out)["steps"][0]
    assert step["outcome"] == "applied" and step["gone"] == 1
    assert cli("rollback")[0] == 0


def test_a_kernel_thread_the_kernel_will_not_move_is_named_and_does_not_fail_the_step(cgroup_tree, cli,
                                                                                      profile_file, monkeypatch):
    import errno
    tree = cgroup_tree
    v1_host(tree)
    original = tree.snapshot()
    refuse_writes(monkeypatch, CgroupTreeHost, errno.EINVAL,
                  lambda target, value: target.endswith("/cgroup.procs") and value == "15")
    status, out, err = cli("apply", profile_file(PROFILE), "--json")
    assert status == 0, err
    step = json.loads(out)["steps"][0]
    assert any(n.startswith("left as it is: pid 15 (rcu_preempt)") and "keeps this kernel thread" in n
               for n in step["notes"])
    assert cgroup_of(tree, 15) == "/" and cgroup_of(tree, 200) == "/tuned-rl-housekeeping"
    assert cli("rollback")[0] == 0 and tree.snapshot() == original


def test_a_user_process_the_kernel_will_not_move_fails_the_step_and_it_is_undone(cgroup_tree, cli, profile_file,
                                                                                 monkeypatch):
    import errno
    tree = cgroup_tree
    v1_host(tree)
    original = tree.snapshot()
    refuse_writes(monkeypatch, CgroupTreeHost, errno.EINVAL,
                  lambda target, value: target.endswith("/cgroup.procs") and value == "200")
    status, out, _ = cli("apply", profile_file(PROFILE), "--json")
    step = json.loads(out)["steps"][0]
    assert status == 1 and step["outcome"] == "failed" and "pid 200 (hog)" in step["reason"]
    assert tree.snapshot() == original


def test_v2_an_isolated_partition_for_the_workload_and_overlapping_cgroups_narrowed(cgroup_tree, cli, profile_file):
    tree = cgroup_tree
    tree.set("/proc/self/mounts", MOUNTS_V2_ONLY)
    tree.set(f"{V2}/cgroup.controllers", "cpuset cpu io memory pids")
    tree.set(f"{V2}/cgroup.subtree_control", "cpuset cpu memory pids")
    tree.set(f"{V2}/cgroup.procs", "")
    for name, cpus in (("system.slice", ""), ("user.slice", "0-1"), ("user.slice/user-1000.slice", "1")):
        tree.set(f"{V2}/{name}/cpuset.cpus", cpus)
        tree.set(f"{V2}/{name}/cgroup.procs", "")
    tree.set(f"{V2}/batch.slice/cpuset.cpus", "0-1")
    tree.set(f"{V2}/batch.slice/low/cpuset.cpus", "0-1")
    tree.add_process(100, "model", cgroups={"": "/system.slice/model.service"})
    tree.add_process(200, "hog", cgroups={"": "/system.slice/hog.service"})
    original = tree.snapshot()
    status, out, err = cli("apply", profile_file(PROFILE), "--json")
    assert status == 0, err
    step = json.loads(out)["steps"][0]
    assert tree.get(f"{V2}/tuned-rl-workload/cpuset.cpus.partition") == "isolated"
    assert tree.get(f"{V2}/tuned-rl-workload/cpuset.cpus") == "1"
    assert cgroup_of(tree, 100, "") == "/tuned-rl-workload" and cgroup_of(tree, 200, "") == "/system.slice/hog.service"
    assert tree.get(f"{V2}/user.slice/cpuset.cpus") == "0" and tree.get(f"{V2}/system.slice/cpuset.cpus") == ""
    assert tree.get(f"{V2}/batch.slice/low/cpuset.cpus") == "0"
    # user-1000.slice holds only the latency CPU: left, and said
    assert tree.get(f"{V2}/user.slice/user-1000.slice/cpuset.cpus") == "1"
    assert any("user-1000.slice has only latency CPUs" in n for n in step["notes"])
    targets = [c["target"] for c in step["changes"]]
    assert targets.index(f"{V2}/batch.slice/low") < targets.index(f"{V2}/batch.slice") \
        < targets.index(f"{V2}/tuned-rl-workload")  # children narrowed before parents, all before the partition
    assert cli("rollback")[0] == 0 and tree.snapshot() == original


def test_v2_without_the_cpuset_controller_the_step_is_skipped_with_the_fix(cgroup_tree, cli, profile_file):
    tree = cgroup_tree
    tree.set("/proc/self/mounts", MOUNTS_V2_ONLY)
    tree.set(f"{V2}/cgroup.controllers", "cpuset cpu io memory pids")
    tree.set(f"{V2}/cgroup.subtree_control", "cpu memory pids")
    tree.add_process(100, "model", cgroups={"": "/system.slice/model.service"})
    step = json.loads(cli("apply", profile_file(PROFILE), "--json")[1])["steps"][0]
    assert step["outcome"] == "skipped" and "cgroup.subtree_control" in step["reason"]


@pytest.mark.parametrize("table, message", [
    ('latency_cpus = "0-1"', "leaves no housekeeping CPU"),
    ('latency_cpus = "1"\nhousekeeping_cpus = "0-1"', "both latency and housekeeping"),
    ('latency_cpus = "7"', "not online"),
    ('latency_cpus = "x"', "not a CPU list"),
    ('latency_cpus = "1"\n[cpu_isolation.pin]\n"^actor" = "0"', "not latency CPUs"),
    ('latency_cpus = "1"\n[cpu_isolation.pin]\n"(" = "1"', "not a regular expression"),
])
def test_a_bad_split_exits_2_with_one_line(cgroup_tree, cli, profile_file, table, message):
    v1_host(cgroup_tree)
    status, out, err = cli("apply", profile_file(f'[target]\nname = "^model$"\n\n[cpu_isolation]\n{table}\n'))
    assert status == 2 and message in err, err


def test_a_canary_target_cannot_be_placed(cgroup_tree, cli, profile_file):
    status, _, err = cli("apply", profile_file('[target]\ncanary = true\n\n[cpu_isolation]\nlatency_cpus = "1"\n'))
    assert status == 2 and "needs a [target] naming the workload" in err


def test_the_isolation_tables_must_split_the_cpus_alike(cgroup_tree, cli, profile_file):
    status, _, err = cli("apply", profile_file(PROFILE + '\n[irq_isolation]\nlatency_cpus = "0"\n'))
    assert status == 2 and "split the CPUs differently" in err


def test_v2_a_delegated_subtree_nested_deeper_than_pythons_recursion_limit_is_narrowed(cgroup_tree, cli,
                                                                                      profile_file):
    # A user with a delegated subtree can nest cgroups as deep as they like: 1,200 levels here.
    tree = cgroup_tree
    tree.set("/proc/self/mounts", MOUNTS_V2_ONLY)
    tree.set(f"{V2}/cgroup.controllers", "cpuset cpu io memory pids")
    tree.set(f"{V2}/cgroup.subtree_control", "cpuset cpu memory pids")
    tree.set(f"{V2}/cgroup.procs", "")
    deepest = f"{V2}/user.slice" + "/d" * 1200
    directory = tree.root / V2.lstrip("/") / "user.slice"
    directory.mkdir(parents=True)
    for _ in range(1200):  # one level at a time: pathlib's own mkdir(parents=True) recurses
        directory = directory / "d"
        directory.mkdir()
    (directory / "cpuset.cpus").write_text("0-1\n")
    tree.add_process(100, "model", cgroups={"": "/system.slice/model.service"})
    try:
        status, out, err = cli("apply", profile_file(PROFILE), "--dry-run", "--json")
    finally:  # one level at a time again: shutil.rmtree recurses too
        (directory / "cpuset.cpus").unlink()
        for _ in range(1200):
            directory.rmdir()
            directory = directory.parent
    assert status == 0, err
    changes = {c["target"]: c for c in json.loads(out)["steps"][0]["changes"]}
    assert changes[deepest]["before"] == "present, cpuset.cpus=0-1"
    assert changes[deepest]["after"] == "present, cpuset.cpus=0"


def test_another_users_process_named_like_the_workload_is_not_placed_pinned_or_measured(cgroup_tree, cli,
                                                                                       profile_file):
    tree = cgroup_tree
    tree.set("/sys/devices/system/cpu/online", "0-3")
    v1_host(tree)
    tree.set(f"{CPUSET}/cpuset.cpus", "0-3")
    tree.set("/etc/passwd", "root:x:0:0::/root:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n")
    tree.add_process(500, "model", (501,), uid=65534, cgroups={"cpu": "/", "cpuset": "/"}, start_time=8000)
    tree.set("/proc/500/task/501/stat", tree.get("/proc/500/task/501/stat").replace("(model)", "(actor-9)"))
    profile = profile_file(PROFILE.replace('"1"', '"1-3"') + '\n[cpu_isolation.pin]\n"^actor" = "2-3"\n')
    dry = json.loads(cli("apply", profile, "--dry-run", "--json")[1])
    assert ("not the target: pid 500 (model) matches [target] name '^model$' but runs as nobody, not one of "
            "[target] users (root)") in dry["notes"]
    status, out, err = cli("apply", profile, "--json")
    assert status == 0, err
    assert cgroup_of(tree, 100) == "/tuned-rl-workload" and tree.host.process(101).affinity == "2"
    assert cgroup_of(tree, 500) == "/tuned-rl-housekeeping"  # moved off the latency CPUs like any other task
    assert tree.host.process(501).affinity == "0-1"  # not pinned
    assert resolve_tids(tree.host, Target("name", "^model$")) == {100, 101, 102}
    assert resolve_tids(tree.host, Target("name", "^model$", ("root", "nobody"))) == {100, 101, 102, 500, 501}
    assert cli("rollback")[0] == 0


def test_a_process_that_is_root_in_one_user_id_only_is_not_roots(cgroup_tree):
    tree = cgroup_tree
    tree.add_process(600, "model")
    tree.set("/proc/600/status", tree.get("/proc/600/status").replace("Uid:\t0\t0\t0\t0", "Uid:\t1000\t0\t0\t0"))
    assert resolve_tids(tree.host, Target("name", "^model$")) == set()  # a setuid-root program a user started
    assert resolve_tids(tree.host, Target("name", "^model$", ("root", "1000"))) == {600}


@pytest.mark.parametrize("table, message", [
    ('[target]\npid = 1\nusers = ["root"]\n', "users goes with a name target"),
    ('[target]\nname = "x"\nusers = ["no-such-account"]\n', "no account 'no-such-account' on this host"),
    ('[target]\nname = "x"\nusers = []\n', "names no user"),
])
def test_target_users_that_cannot_work_exit_2(cgroup_tree, cli, profile_file, table, message):
    status, _, err = cli("apply", profile_file(table + '\n[sysctl]\n"vm.swappiness" = 10\n'), "--dry-run")
    assert status == 2 and message in err, err


def test_v1_a_thread_placed_apart_from_its_process_goes_back_apart(cgroup_tree, cli, profile_file):
    # The runtime put the workload's I/O thread 102 in its own cpuset; the whole process moves into
    # the workload's cpuset, and rollback must put 102 back in /io, not beside the main thread.
    tree = cgroup_tree
    v1_host(tree)
    tree.set(f"{CPUSET}/io/cpuset.cpus", "0-1")
    tree.set(f"{CPUSET}/io/cpuset.mems", "0")
    tree.set(f"{CPUSET}/io/tasks", "")
    tree.set("/proc/100/task/102/cgroup", "1:cpu:/\n2:cpuset:/io\n")
    original = tree.snapshot()
    status, out, err = cli("apply", profile_file(PROFILE), "--json")
    assert status == 0, err
    [move] = [c for c in json.loads(out)["steps"][0]["changes"] if c["target"] == f"pid 100 (model) process_cgroup in {CPUSET}"]
    assert move["before"] == "/ (thread 102 in /io)" and move["after"] == "/tuned-rl-workload"
    assert cgroup_of(tree, 100) == "/tuned-rl-workload"
    assert cli("rollback")[0] == 0
    from tuned_rl.host.processes import parse_cgroup_file
    assert parse_cgroup_file(tree.get("/proc/100/task/102/cgroup"))["cpuset"] == "/io"
    assert tree.snapshot() == original
