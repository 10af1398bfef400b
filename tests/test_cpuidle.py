"""[cpuidle]: each latency CPU's PM QoS resume-latency request set in one step and undone, or, on a
machine without a cpuidle driver, a plan that says there is nothing to keep the CPUs out of."""

from __future__ import annotations

import json

from tuned_rl_plugins.cpu_split import SHARING
from tuned_rl_plugins.cpuidle import DRIVER, REQUEST, request_text

PROFILE = '[cpuidle]\nlatency_cpus = "1"\n'


def with_driver(tree, driver="intel_idle"):
    tree.set(DRIVER, driver)
    for cpu in (0, 1):
        tree.set(REQUEST.format(cpu=cpu), "0")  # "0": no constraint, the kernel's default


def test_the_latency_cpus_get_a_zero_exit_latency_request_and_rollback_gives_back_no_constraint(tree, cli,
                                                                                              profile_file):
    with_driver(tree)
    original = tree.snapshot()
    profile = profile_file(PROFILE)
    dry = json.loads(cli("apply", profile, "--dry-run", "--json")[1])
    step = dry["steps"][0]
    assert (step["plugin"], step["phase"], step["outcome"]) == ("cpuidle", "kernel", "planned")
    assert [(c["target"], c["before"], c["after"]) for c in step["changes"]] == [
        (REQUEST.format(cpu=1), "0", "n/a")]  # CPU 0, housekeeping, may still sleep deep
    status, out, err = cli("apply", profile, "--no-verify", "--json")
    assert status == 0, err
    assert json.loads(out)["steps"][0]["outcome"] == "applied"
    assert tree.get(REQUEST.format(cpu=1)) == "n/a" and tree.get(REQUEST.format(cpu=0)) == "0"
    assert cli("rollback")[0] == 0 and tree.snapshot() == original


def test_a_limit_in_microseconds_is_written_as_a_number_and_an_offline_cpu_is_refused(tree, cli, profile_file):
    with_driver(tree)
    assert request_text(0) == "n/a" and request_text(20) == "20"
    assert cli("apply", profile_file(PROFILE + "max_exit_latency_us = 20\n"), "--no-verify")[0] == 0
    assert tree.get(REQUEST.format(cpu=1)) == "20"
    status, _, err = cli("apply", profile_file('[cpuidle]\nlatency_cpus = "5"\n', "bad.toml"), "--dry-run")
    assert status == 2 and "cpuidle.latency_cpus" in err and "not online" in err


def test_without_a_cpuidle_driver_the_plan_says_so_and_nothing_is_written(tree, cli, profile_file):
    with_driver(tree, "none")  # this VM: /sys/devices/system/cpu/cpuidle/current_driver reads "none"
    original = tree.snapshot()
    out = cli("apply", profile_file(PROFILE), "--no-verify", "--json")[1]
    step = json.loads(out)["steps"][0]
    assert step["outcome"] == "skipped" and "no cpuidle driver" in step["reason"], step
    assert tree.snapshot() == original


def test_the_tables_held_to_one_cpu_split_are_those_that_declared_its_keys():
    import tuned_rl_plugins.cpu_isolation  # noqa: F401 - declaring their tables registers them
    import tuned_rl_plugins.irq_isolation  # noqa: F401 - as above
    assert {"cpu_isolation", "irq_isolation"} <= SHARING and "cpuidle" not in SHARING  # [cpuidle] names its CPUs alone
