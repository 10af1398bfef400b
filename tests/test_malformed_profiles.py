"""A malformed profile exits 2, names the file and key, and leaves the host exactly as it was."""

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
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_profile_is_rejected_and_changes_nothing(case, tree, cli, profile_file, state_dir):
    text, key, words = MALFORMED[case]
    tree.cgroup("rl", runtime=500000)
    path = profile_file(text)
    before = tree.snapshot()
    for args in ([], ["--dry-run"], ["--json"]):
        status, out, err = cli("apply", path, *args)
        assert status == 2, err
        assert f"{path}: " in err and key in err and words in err, err
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
