"""Schema types beyond Python's: CPU lists checked against the online CPUs, regular expressions,
cgroup paths, maps, and tables that are maps themselves."""


from __future__ import annotations
import pytest

from tuned_rl.profiles.schema import CgroupPath, CpuList, Key, Map, Regex, Table


@pytest.mark.parametrize("value, problem", [
    ("0", None), ("0-1", None), ("1,0", None),
    ("2", "CPUs 2 of '2' are not online on this host (online: 0-1)"),
    ("0-3", "CPUs 2-3 of '0-3' are not online"),
    ("", "not a CPU list"), ("1-0", "not a CPU list"), ("x", "not a CPU list"),
])
def test_a_cpu_list_must_name_online_cpus(tree, value, problem):
    problems = Key(CpuList(), "cpus").check("t.cpus", value, tree.host)
    assert (problems[0].message if problems else None) == problem or problem in problems[0].message


def test_a_cpu_list_without_a_host_is_checked_for_form_only():
    assert Key(CpuList(), "cpus").check("t.cpus", "0-99") == []
    assert "must be a CPU list" in Key(CpuList(), "cpus").check("t.cpus", 3)[0].message


@pytest.mark.parametrize("value, ok", [("rl", True), ("/ray/actors", True), ("ray/actors/", True), ("/", False),
                                       ("", False), ("rl/../..", False), ("./rl", False), ("a//b", False)])
def test_a_cgroup_path_stays_inside_its_hierarchy(value, ok):
    assert (Key(CgroupPath(), "cg").check("t.cg", value) == []) is ok


def test_a_regex_must_compile():
    assert Key(Regex(), "re").check("t.re", "^ray::") == []
    assert "not a regular expression" in Key(Regex(), "re").check("t.re", "(")[0].message


def test_a_map_checks_every_name_and_value(tree):
    pinning = Key(Map(Key(CpuList(), "CPUs"), names=Regex()), "thread name pattern -> CPUs")
    assert pinning.check("t.pin", {"^actor": "0", "^io": "1"}, tree.host) == []
    assert "name '(': '(' is not a regular expression" in pinning.check("t.pin", {"(": "0"}, tree.host)[0].message
    assert "'^io': CPUs 5 of '5' are not online" in pinning.check("t.pin", {"^io": "5"}, tree.host)[0].message
    assert "must be a table of names to a CPU list" in pinning.check("t.pin", "0", tree.host)[0].message


def test_a_table_that_is_a_map_checks_keys_it_does_not_declare():
    table = Table("sysctl", "map", {"declared": Key(bool, "b")}, phase="kernel", any_key=Key((int, str), "value"))
    assert table.check({"vm.swappiness": 10, "net.ipv4.tcp_rmem": "4096 1 2", "declared": True}) == []
    problems = table.check({"vm.swappiness": 1.5, "declared": 1})
    assert [(p.key, p.message) for p in problems] == [
        ("sysctl.vm.swappiness", "must be an integer or a string, not 1.5"),
        ("sysctl.declared", "must be true or false, not 1")]
