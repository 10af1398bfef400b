"""`tuned-rl measure` and `doctor` input handling, and the [verify] table."""


from __future__ import annotations
import json

import pytest


@pytest.mark.parametrize("args", [["--target", "pod:1"], ["--target", "canary", "--seconds", "0"],
                                  ["--target", "canary", "--probe", "dtrace"],
                                  ["--target", "canary", "--canary-period-us", "-5"]])
def test_bad_measure_arguments_exit_2(cli, args):
    with pytest.raises(SystemExit) as exit_info:
        cli("measure", *args)
    assert exit_info.value.code == 2


@pytest.mark.parametrize("args, words", [
    (["--target", "pid:1", "--probe", "schedstat"], "--probe: schedstat measures a canary only"),
    (["--target", "pid:999999"], "--pid: no process has pid 999999 on this host"),
    (["--target", "cgroup:/sys/fs/cgroup/cpu/nope"], "cgroup directory /sys/fs/cgroup/cpu/nope does not exist"),
    (["--target", "canary", "--canary-cpus", "7-99"], "--canary-cpus: CPUs 7-99 of '7-99' are not online"),
    (["--target", "canary", "--canary-cgroup", "/tmp"], "--canary-cgroup: /tmp is not in a mounted cgroup"),
])
def test_a_target_this_host_does_not_have_is_an_argument_error(tree, cli, args, words):
    tree.add_process(1, "init")
    status, out, err = cli("measure", *args, "--seconds", "1")
    assert status == 2 and words in err and out == "", err


def test_verify_table_is_validated_like_a_plugin_table(cli, profile_file):
    path = profile_file('[verify]\nmetric = "p9999"\nwindows = 1\n[rt_runtime]\nglobal_runtime_us = 950000\n')
    status, _, err = cli("apply", path, "--dry-run")
    assert status == 2 and "verify.metric: must be one of" in err and "verify.windows: 1 is below" in err
    ok = profile_file('[verify]\nmetric = "p99"\ntolerance = 0.3\n[rt_runtime]\nglobal_runtime_us = 950000\n')
    assert cli("apply", ok, "--dry-run", "--json")[0] == 0


def test_doctor_json_lists_every_probe(cli):
    status, out, _ = cli("doctor", "--json")
    report = json.loads(out)
    assert [p["name"] for p in report["probes"]] == ["bpf", "tracefs", "schedstat"]
    for probe in report["probes"]:
        assert probe["can_run"] == (probe["problems"] == [])
        assert all(p["problem"] and p["fix"] for p in probe["problems"])
    assert status == (0 if report["auto"] else 1)
