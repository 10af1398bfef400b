"""The rt_runtime plugin's plan: parents raised first, global ordering, cgroup v2 skip."""


from __future__ import annotations
from tuned_rl.core.plugin_host import load_plugins
from tuned_rl.profiles.loader import load_profile

from helpers import CPU_MOUNT, MOUNTS_V2_ONLY


def plan(tree, profile_file, text):
    plugins = load_plugins()
    profile = load_profile(profile_file(text))
    assert plugins.validate(profile, tree.host) == []
    return [(s.title, s.skip_reason, [(c.target, c.before, c.after) for c in s.changes])
            for s in plugins.plan(profile, tree.host)]


def test_the_first_articles_fix_raises_a_cgroup_from_500000_to_950000(tree, profile_file):
    tree.cgroup("rl", runtime=500000)
    steps = plan(tree, profile_file, '[rt_runtime]\ncgroup = "rl"\ncgroup_runtime_us = 950000\n')
    assert steps == [("set RT budget of cgroup rl", None,
                      [(f"{CPU_MOUNT}/rl/cpu.rt_runtime_us", "500000", "950000")])]


def test_parents_are_raised_first_just_enough(tree, profile_file):
    tree.cgroup("ray", runtime=200000)
    tree.cgroup("ray/other", runtime=100000)
    tree.cgroup("ray/actors", runtime=100000)
    steps = plan(tree, profile_file, '[rt_runtime]\ncgroup = "ray/actors"\ncgroup_runtime_us = 400000\n')
    assert steps[0][2] == [(f"{CPU_MOUNT}/ray/cpu.rt_runtime_us", "200000", "500000"),
                           (f"{CPU_MOUNT}/ray/actors/cpu.rt_runtime_us", "100000", "400000")]


def test_a_parent_with_room_enough_is_left_alone(tree, profile_file):
    tree.cgroup("ray", runtime=900000)
    tree.cgroup("ray/actors", runtime=0)
    steps = plan(tree, profile_file, '[rt_runtime]\ncgroup = "ray/actors"\ncgroup_runtime_us = 400000\n')
    assert [c[0] for c in steps[0][2] if c[1] != c[2]] == [f"{CPU_MOUNT}/ray/actors/cpu.rt_runtime_us"]


def test_parent_need_accounts_for_different_periods(tree, profile_file):
    tree.cgroup("ray", runtime=0, period=1000000)
    tree.cgroup("ray/actors", runtime=0, period=500000)
    steps = plan(tree, profile_file, '[rt_runtime]\ncgroup = "ray/actors"\ncgroup_runtime_us = 250000\n')
    assert steps[0][2][0] == (f"{CPU_MOUNT}/ray/cpu.rt_runtime_us", "0", "500000")


def test_global_is_raised_before_and_lowered_after_the_cgroup(tree, profile_file):
    tree.cgroup("rl", runtime=100000)
    raise_both = plan(tree, profile_file, '[rt_runtime]\nglobal_runtime_us = 960000\ncgroup = "rl"\n'
                      'cgroup_runtime_us = 200000\n')
    assert [s[0] for s in raise_both] == ["set global RT budget", "set RT budget of cgroup rl"]
    lower_both = plan(tree, profile_file, '[rt_runtime]\nglobal_runtime_us = 900000\ncgroup = "rl"\n'
                      'cgroup_runtime_us = 50000\n')
    assert [s[0] for s in lower_both] == ["set RT budget of cgroup rl", "set global RT budget"]


def test_unlimited_with_opt_in_is_planned(tree, profile_file):
    steps = plan(tree, profile_file, "[rt_runtime]\nglobal_runtime_us = -1\nallow_unlimited = true\n")
    assert steps[0][2] == [("/proc/sys/kernel/sched_rt_runtime_us", "950000", "-1")]


def test_cgroup_step_is_skipped_on_cgroup_v2_only_hosts(tree, profile_file):
    tree.set("/proc/self/mounts", MOUNTS_V2_ONLY)
    steps = plan(tree, profile_file, '[rt_runtime]\ncgroup = "rl"\ncgroup_runtime_us = 950000\n')
    assert steps[0][1] == "cgroup v2 has no per-cgroup RT budget (cpu.rt_runtime_us)" and steps[0][2] == []


def test_cgroup_step_is_skipped_without_rt_group_scheduling(tree, profile_file):
    tree.host.path(f"{CPU_MOUNT}/rl").mkdir(parents=True)
    steps = plan(tree, profile_file, '[rt_runtime]\ncgroup = "rl"\ncgroup_runtime_us = 950000\n')
    assert "CONFIG_RT_GROUP_SCHED" in steps[0][1]


def test_lowering_below_what_sub_cgroups_hold_is_refused(tree, profile_file):
    tree.cgroup("ray", runtime=500000)
    tree.cgroup("ray/actors", runtime=400000)
    plugins = load_plugins()
    profile = load_profile(profile_file('[rt_runtime]\ncgroup = "ray"\ncgroup_runtime_us = 300000\n'))
    assert any("sub-cgroups" in p for p in plugins.validate(profile, tree.host))


def test_lowering_the_global_budget_lowers_the_root_cgroups_first(tree, profile_file):
    steps = plan(tree, profile_file, "[rt_runtime]\nglobal_runtime_us = 900000\n")
    assert steps[0][2] == [(f"{CPU_MOUNT}/cpu.rt_runtime_us", "950000", "900000"),
                           ("/proc/sys/kernel/sched_rt_runtime_us", "950000", "900000")]
    raised = plan(tree, profile_file, "[rt_runtime]\nglobal_runtime_us = 960000\n")
    assert [c[0] for c in raised[0][2]] == ["/proc/sys/kernel/sched_rt_runtime_us"]
