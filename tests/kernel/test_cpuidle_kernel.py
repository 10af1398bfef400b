"""[cpuidle] on this machine: with a cpuidle driver, each latency CPU's request is set and given back;
without one (this VM's current_driver reads "none"), the plan says so and nothing is written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from helpers import run_cli

DRIVER = Path("/sys/devices/system/cpu/cpuidle/current_driver")
REQUEST = Path("/sys/devices/system/cpu/cpu1/power/pm_qos_resume_latency_us")

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not REQUEST.exists() or len(os.sched_getaffinity(0)) < 2,
                                reason="needs root, two CPUs and CPU 1's PM QoS request file")


def test_the_plan_on_this_machine_says_what_it_changes_and_apply_then_rollback_leaves_the_request_as_it_was(
        tmp_path, state_dir):
    profile = tmp_path / "cpuidle.toml"
    profile.write_text('[cpuidle]\nlatency_cpus = "1"\n')
    before = REQUEST.read_text()
    driver = DRIVER.read_text().strip() if DRIVER.exists() else "none"
    status, out, err = run_cli("apply", profile, "--no-verify", "--json", root=None, state_dir=state_dir)
    assert status == 0, err
    step = json.loads(out)["steps"][0]
    if driver == "none":
        assert step["outcome"] == "skipped" and "no cpuidle driver" in step["reason"], step
        assert REQUEST.read_text() == before
    else:
        assert step["outcome"] == "applied" and REQUEST.read_text().strip() == "n/a", step
    assert run_cli("rollback", root=None, state_dir=state_dir)[0] == 0
    assert REQUEST.read_text() == before
