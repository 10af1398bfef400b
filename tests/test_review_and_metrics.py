"""`apply --dry-run --format diff` for a change review, and `--metrics-file` for Prometheus."""


from __future__ import annotations

import os

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tuned_rl.core import metrics
from tuned_rl.core.report import ChangeReport, Report, StepReport

@pytest.fixture(autouse=True)
def printk(tree):
    tree.set("/proc/sys/kernel/printk", "7\t4\t1\t7")


PROFILE = '[rt_runtime]\nglobal_runtime_us = 900000\n\n[sysctl]\n"vm.swappiness" = 60\n"kernel.printk" = "4 4 1 7"\n'


def test_the_diff_lists_live_values_against_the_plan(tree, cli, profile_file):
    status, out, err = cli("apply", profile_file(PROFILE), "--dry-run", "--format", "diff")
    assert status == 0, err
    lines = out.splitlines()
    assert lines[:2] == ["--- live values of this host", "+++ profile p"]
    hunk = lines.index("@@ kernel: rt_runtime: set global RT budget (planned) @@")
    assert lines[hunk + 1:hunk + 5] == ["-/sys/fs/cgroup/cpu/cpu.rt_runtime_us = 950000",
                                        "+/sys/fs/cgroup/cpu/cpu.rt_runtime_us = 900000",
                                        "-/proc/sys/kernel/sched_rt_runtime_us = 950000",
                                        "+/proc/sys/kernel/sched_rt_runtime_us = 900000"]
    assert "-/proc/sys/kernel/printk = 7\t4\t1\t7" in lines and "+/proc/sys/kernel/printk = 4 4 1 7" in lines
    assert not any("swappiness" in line for line in lines)  # unchanged: no hunk
    assert tree.get("/proc/sys/kernel/sched_rt_runtime_us") == "950000"


def test_diff_without_dry_run_is_refused(tree, cli, profile_file):
    status, _, err = cli("apply", profile_file(PROFILE), "--format", "diff")
    assert status == 2 and "--dry-run" in err


def test_the_metrics_file_parses_and_holds_each_steps_outcome_and_latency(tree, cli, profile_file, tmp_path):
    (tmp_path / "textfile").mkdir()
    path = tmp_path / "textfile" / "tuned_rl.prom"
    status, _, err = cli("apply", profile_file(PROFILE), "--metrics-file", path)
    assert status == 0, err
    families = {f.name: f for f in text_string_to_metric_families(path.read_text())}
    outcomes = {(s.labels["step"], s.labels["outcome"]) for s in families["tuned_rl_step_outcome"].samples
                if s.value == 1}
    assert ("set global RT budget", "applied") in outcomes and ("set vm.swappiness = 60", "unchanged") in outcomes
    assert families["tuned_rl_apply_exit_status"].samples[0].value == 0
    assert families["tuned_rl_apply_duration_seconds"].samples[0].value >= 0
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    assert [p.name for p in path.parent.iterdir()] == ["tuned_rl.prom"]  # no temporary file left


def test_latency_figures_and_awkward_labels_survive_the_text_format():
    step = StepReport("sysctl", 'set "x" = a\\b\nc', [ChangeReport("/proc/sys/x", "1", "2")], "reverted",
                      before={"p50_us": 10.0, "p99_us": 40.0, "p999_us": 400.0},
                      after={"p50_us": 11.0, "p99_us": 80.0, "p999_us": 4000.0})
    text = metrics.render(Report("p", False, [step]), 100.0, 112.5, 0)
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    p999 = {s.labels["arm"]: s.value for s in samples
            if s.name == "tuned_rl_step_latency_seconds" and s.labels["quantile"] == "0.999"}
    assert p999 == {"before": pytest.approx(0.0004), "after": pytest.approx(0.004)}
    assert {s.labels["step"] for s in samples if "step" in s.labels} == {'set "x" = a\\b\nc'}


def test_a_metrics_file_in_a_missing_directory_exits_2(tree, cli, profile_file, tmp_path):
    status, _, err = cli("apply", profile_file(PROFILE), "--metrics-file", tmp_path / "nope" / "m.prom")
    assert status == 2 and "does not exist" in err


def test_the_metrics_file_gets_its_mode_through_its_descriptor_not_its_name(tmp_path, monkeypatch):
    # chmod by name after the write would act on whatever the name points to by then.
    from tuned_rl.core import metrics

    def no_chmod_by_name(*args, **kwargs):
        raise AssertionError("chmod by name")
    monkeypatch.setattr(os, "chmod", no_chmod_by_name)
    monkeypatch.setattr(os, "umask", lambda mask: 0o077)
    path = tmp_path / "tuned_rl.prom"
    metrics.write(path, "x 1\n")
    assert path.read_text() == "x 1\n" and path.stat().st_mode & 0o777 == 0o644
