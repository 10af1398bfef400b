"""The boot-time unit: it passes systemd-analyze verify, and apply at boot sets the last boot's journal aside."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNIT = Path(__file__).parent.parent / "debian" / "tuned-rl.service"
RT = "/proc/sys/kernel/sched_rt_runtime_us"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_the_unit_passes_systemd_analyze_verify(tmp_path):
    tuned_rl = Path(sys.executable).parent / "tuned-rl"
    text = UNIT.read_text().replace("/usr/bin/tuned-rl", str(tuned_rl))
    (tmp_path / "tuned-rl.service").write_text(text)
    result = subprocess.run(["systemd-analyze", "verify", "--man=no", str(tmp_path / "tuned-rl.service")],
                            capture_output=True, text=True, env={**os.environ, "SYSTEMD_UNIT_PATH": f"{tmp_path}:"})
    assert result.returncode == 0, result.stderr
    assert "tuned-rl.service" not in result.stderr, result.stderr


@pytest.mark.parametrize("setting, rolls_back", [("no", False), ("yes", True), ("", False)])
def test_stopping_the_unit_rolls_back_only_when_asked(tmp_path, setting, rolls_back):
    text = UNIT.read_text()
    assert "Environment=TUNED_RL_PROFILE=/etc/tuned-rl/profile.toml TUNED_RL_ROLLBACK_ON_STOP=no" in text
    stop = next(line for line in text.splitlines() if line.startswith("ExecStop="))[len("ExecStop="):]
    fake = tmp_path / "tuned-rl"  # stands in for /usr/bin/tuned-rl: records how it was called
    fake.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path / 'called'}\n")
    fake.chmod(0o755)
    argv = ["/bin/sh", "-c", stop.split("'")[1].replace("/usr/bin/tuned-rl", str(fake))]
    subprocess.run(argv, env={"TUNED_RL_ROLLBACK_ON_STOP": setting, "PATH": "/usr/bin:/bin"}, check=True,
                   capture_output=True)
    called = tmp_path / "called"
    assert called.exists() == rolls_back
    if rolls_back:
        assert called.read_text().split() == ["rollback"]


def test_apply_at_boot_sets_the_last_boots_journal_aside_and_applies_afresh(tree, cli, profile_file, state_dir):
    profile = profile_file("[rt_runtime]\nglobal_runtime_us = 900000\n")
    assert cli("apply", profile)[0] == 0 and tree.get(RT) == "900000"
    tree.set("/proc/sys/kernel/random/boot_id", "99999999-new-boot")  # a reboot
    tree.set(RT, "950000")  # the reboot reset it
    tree.set("/sys/fs/cgroup/cpu/cpu.rt_runtime_us", "950000")
    assert json.loads(cli("status", "--json")[1])["stale"] is True
    status, out, err = cli("apply", profile, "--json")  # what the unit runs at boot
    assert status == 0, err
    report = json.loads(out)
    assert any("earlier boot" in note for note in report["notes"]), report["notes"]
    assert tree.get(RT) == "900000" and list((state_dir / "stale").iterdir())
    assert cli("rollback")[0] == 0 and tree.get(RT) == "950000"  # this boot's value, not the last boot's


def test_a_failed_watch_is_started_again_a_few_times_then_left_failed():
    unit = {}
    for line in UNIT.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith("#"):
            unit[key] = value
    assert unit["Restart"] == "on-failure" and unit["RestartSec"] == "10s"
    assert unit["StartLimitBurst"] == "3" and unit["StartLimitIntervalSec"] == "10min"
    assert unit["ExecStart"] == "/usr/bin/tuned-rl watch $TUNED_RL_WATCH_OPTIONS"  # exit 0 (stopped, or rolled back): not restarted


def test_the_units_watch_takes_its_options_from_the_settings_file_and_serves_nothing_by_default():
    from tuned_rl.cli import build_parser
    text = UNIT.read_text()
    assert "Environment=TUNED_RL_WATCH_OPTIONS=\n" in text  # no endpoint unless the settings name one
    start = next(line for line in text.splitlines() if line.startswith("ExecStart="))[len("ExecStart="):]
    assert start == "/usr/bin/tuned-rl watch $TUNED_RL_WATCH_OPTIONS"  # unbraced: systemd splits it into words
    options = "--metrics-address 127.0.0.1:9464 --alarm-ms 5"  # what the Ansible role writes
    args = build_parser().parse_args(start.split()[1:-1] + options.split())
    assert (args.metrics_address, args.alarm_ms) == ("127.0.0.1:9464", 5.0)
    assert build_parser().parse_args(["watch"]).metrics_address is None


def test_the_unit_gives_watch_room_for_descriptors():
    """The /metrics cap bounds what other users can make watch hold; the limit leaves the rest room."""
    limits = [line for line in UNIT.read_text().splitlines() if line.startswith("LimitNOFILE=")]
    assert limits and int(limits[0].split("=")[1]) >= 4096
    assert "TimeoutStopSec=30s" in UNIT.read_text().splitlines()  # a stopped verification ends within a second
