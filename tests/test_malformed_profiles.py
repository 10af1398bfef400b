"""A malformed profile exits 2, names the file and key, and leaves the host exactly as it was."""


from __future__ import annotations
import os

import pytest

MALFORMED = {
    "toml-syntax": ("[rt_runtime\nglobal_runtime_us = 1\n", "p.toml", "TOML syntax error"),
    "unknown-table": ("[swapiness]\nvalue = 1\n", "swapiness", "unknown table"),
    "unknown-key": ("[rt_runtime]\nglobal_runtme_us = 950000\n", "rt_runtime.global_runtme_us", "unknown key"),
    "wrong-type": ('[rt_runtime]\nglobal_runtime_us = "950000"\n', "rt_runtime.global_runtime_us", "integer"),
    "bool-is-not-int": ("[rt_runtime]\nglobal_runtime_us = true\n", "rt_runtime.global_runtime_us", "integer"),
    "out-of-range": ("[rt_runtime]\nglobal_runtime_us = -5\n", "rt_runtime.global_runtime_us", "minimum"),
    "runtime-over-period": ("[rt_runtime]\nglobal_runtime_us = 1200000\n", "rt_runtime.global_runtime_us",
                            "exceeds the period 1000000"),
    "unlimited-without-opt-in": ("[rt_runtime]\nglobal_runtime_us = -1\n", "rt_runtime.global_runtime_us",
                                 "allow_unlimited"),
    "cgroup-escapes": ('[rt_runtime]\ncgroup = "rl/../../.."\ncgroup_runtime_us = 1\n', "rt_runtime.cgroup", "'..'"),
    "cgroup-missing": ('[rt_runtime]\ncgroup = "nope"\ncgroup_runtime_us = 1\n', "rt_runtime.cgroup",
                       "does not exist"),
    "cgroup-without-runtime": ('[rt_runtime]\ncgroup = "rl"\n', "rt_runtime.cgroup_runtime_us", "go together"),
    "cgroup-over-global": ('[rt_runtime]\ncgroup = "rl"\ncgroup_runtime_us = 960000\n',
                           "rt_runtime.cgroup_runtime_us", "global RT budget"),
    "empty-table": ("[rt_runtime]\n", "rt_runtime", "set global_runtime_us"),
    "include-missing": ('[profile]\ninclude = ["base.toml"]\n', "profile.include", "not found"),
    "include-not-a-list": ('[profile]\ninclude = "base.toml"\n', "profile.include", "list"),
    "profile-unknown-key": ('[profile]\nnmae = "x"\n', "profile.nmae", "unknown key"),
    "cgroup-is-the-root": ('[rt_runtime]\ncgroup = "/"\ncgroup_runtime_us = 1\n', "rt_runtime.cgroup", "not the root"),
    "canary-cpus-offline": ('[target]\ncanary = true\ncanary_cpus = "7-99"\n', "target.canary_cpus",
                            "CPUs 7-99 of '7-99' are not online on this host (online: 0-1)"),
    # Refused before a set of four billion CPUs is built (that took minutes and gigabytes).
    "canary-cpus-four-billion": ('[target]\ncanary = true\ncanary_cpus = "0-4000000000"\n', "target.canary_cpus",
                                 "it names CPU 4000000000, and Linux has at most 8192"),
    "canary-cpus-not-a-list": ('[target]\ncanary = true\ncanary_cpus = "one"\n', "target.canary_cpus",
                               "not a CPU list"),
    "target-name-not-a-regex": ('[target]\nname = "ray::("\n', "target.name", "not a regular expression"),
    "canary-cgroup-outside-cgroupfs": ('[target]\ncanary = true\ncanary_cgroup = "/tmp"\n', "target.canary_cgroup",
                                       "not in a mounted cgroup hierarchy"),
    "sysctl-unknown": ('[sysctl]\n"vm.swapiness" = 10\n', "sysctl.vm.swapiness", "this kernel has no vm.swapiness"),
    "sysctl-wrong-type": ('[sysctl]\n"vm.swappiness" = 1.5\n', "sysctl.vm.swappiness",
                          "must be an integer or a string"),
    "sysctl-escapes": ('[sysctl]\n"vm/../../etc/passwd" = 1\n', "sysctl.vm/../../etc/passwd", "not a sysctl name"),
    "sysctl-read-only": ('[sysctl]\n"kernel.random.boot_id" = "x"\n', "sysctl.kernel.random.boot_id", "read-only"),
    "sysctl-a-group": ('[sysctl]\n"vm" = 1\n', "sysctl.vm", "a group of parameters"),
    "sysctl-two-lines": ('[sysctl]\n"vm.swappiness" = "1\\n2"\n', "sysctl.vm.swappiness", "one non-empty line"),
    "sysctl-empty": ("[sysctl]\n", "sysctl", "names no parameter"),
    "sysctl-empty-value": ('[sysctl]\n"vm.swappiness" = ""\n', "sysctl.vm.swappiness", "one non-empty line"),
    "verify-unknown-key": ("[verify]\nwindow = 3\n", "verify.window", "unknown key"),
    "verify-wrong-choice": ('[verify]\nprobe = "dtrace"\n', "verify.probe", "must be one of"),
    "verify-run-sign-p-above": ("[verify]\nrun_sign_p = 0.9\n", "verify.run_sign_p", "above the maximum 0.5"),
    "target-two-targets": ('[target]\ncanary = true\nname = "^ray::"\n', "target", "exactly one of"),
    "target-canary-key-without-canary": ('[target]\nname = "^ray::"\ncanary_cpus = "0"\n', "target.canary_cpus",
                                         "need canary = true"),
    "target-pid-missing": ("[target]\npid = 999999\n", "target.pid", "no process has pid 999999"),
    "sysctl-and-rt-runtime": ('[sysctl]\n"kernel.sched_rt_runtime_us" = 900000\n[rt_runtime]\nglobal_runtime_us = 900000\n',
                              "sysctl", "set it in one place"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_profile_is_rejected_and_changes_nothing(case, tree, cli, profile_file, state_dir):
    text, key, words = MALFORMED[case]
    tree.cgroup("rl", runtime=500000)
    os.chmod(tree.host.path("/proc/sys/kernel/random/boot_id"), 0o444)  # as the kernel has it
    path = profile_file(text)
    before = tree.snapshot()
    for args in ([], ["--dry-run"], ["--json"]):
        status, out, err = cli("apply", path, *args)
        assert status == 2, err
        notice, line = err.strip().splitlines()  # the test tree's notice, then one line naming file and key
        assert notice.startswith("tuned-rl: TUNED_RL_HOST_ROOT=") and "Traceback" not in err
        assert line.startswith(f"tuned-rl: {path}: ") and key in line and words in line, err
        assert line.endswith("(the profile was rejected; nothing was changed)")
        assert out == ""
    assert tree.snapshot() == before
    assert not state_dir.exists()


def test_include_cycle_is_rejected(tree, cli, profile_file):
    profile_file('[profile]\ninclude = ["b.toml"]\n[rt_runtime]\nglobal_runtime_us = 1\n', "a.toml")
    profile_file('[profile]\ninclude = ["a.toml"]\n', "b.toml")
    before = tree.snapshot()
    status, _, err = cli("apply", profile_file('[profile]\ninclude = ["a.toml"]\n'))
    assert status == 2 and "profile.include: include cycle" in err and "b.toml" in err
    assert tree.snapshot() == before


def test_error_in_an_included_file_names_that_file(tree, cli, profile_file):
    base = profile_file("[rt_runtime]\nglobal_runtime_us = 2000000\n", "base.toml")
    status, _, err = cli("apply", profile_file('[profile]\ninclude = ["base.toml"]\n'))
    assert status == 2 and f"{base}: rt_runtime.global_runtime_us" in err


def test_every_problem_is_reported_at_once(cli, profile_file):
    status, _, err = cli("apply", profile_file("[rt_runtime]\nglobal_runtime_us = -7\nfoo = 1\n[bar]\n"))
    assert status == 2
    assert "rt_runtime.foo" in err and "rt_runtime.global_runtime_us" in err and "[bar]" in err


def test_a_missing_profile_file_is_bad_input(cli, tmp_path):
    status, _, err = cli("apply", tmp_path / "nope.toml")
    assert status == 2 and "nope.toml" in err


def test_bad_arguments_exit_2(cli, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli("apply")
    assert exit_info.value.code == 2
