"""[sysctl]: one step per parameter, values compared as the kernel writes them, undone exactly."""


from __future__ import annotations
import json

from tuned_rl_plugins.sysctl import sysctl_path


def test_names_map_to_proc_sys_with_dots_or_slashes():
    assert sysctl_path("vm.swappiness") == "/proc/sys/vm/swappiness"
    assert sysctl_path("net/ipv4/conf/eth0.100/rp_filter") == "/proc/sys/net/ipv4/conf/eth0.100/rp_filter"


def test_each_parameter_is_its_own_step_and_rolls_back(tree, cli, profile_file):
    tree.set("/proc/sys/net/ipv4/tcp_rmem", "4096\t131072\t6291456")
    original = tree.snapshot()
    profile = profile_file('[sysctl]\n"vm.swappiness" = 10\n"net.ipv4.tcp_rmem" = "4096 262144 6291456"\n')
    dry = json.loads(cli("apply", profile, "--dry-run", "--json")[1])
    assert [(s["step"], s["phase"], s["outcome"]) for s in dry["steps"]] == [
        ("set vm.swappiness = 10", "kernel", "planned"), ("set net.ipv4.tcp_rmem = 4096 262144 6291456", "kernel",
                                                          "planned")]
    status, out, err = cli("apply", profile, "--json")
    assert status == 0, err
    assert [s["outcome"] for s in json.loads(out)["steps"]] == ["applied", "applied"]
    assert tree.get("/proc/sys/vm/swappiness") == "10"
    assert cli("rollback")[0] == 0 and tree.snapshot() == original


def test_a_value_the_kernel_holds_with_tabs_is_unchanged(tree, cli, profile_file):
    tree.set("/proc/sys/net/ipv4/tcp_rmem", "4096\t131072\t6291456")
    out = cli("apply", profile_file('[sysctl]\n"net.ipv4.tcp_rmem" = "4096 131072 6291456"\n'), "--json")[1]
    assert json.loads(out)["steps"][0]["outcome"] == "unchanged"
