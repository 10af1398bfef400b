"""Every profile in profiles/ loads and validates on a host like this one."""


from __future__ import annotations
from pathlib import Path

import pytest

from tuned_rl.core.plugin_host import load_plugins
from tuned_rl.profiles.loader import load_profile

PROFILES = sorted((Path(__file__).parent.parent / "profiles").glob("*.toml"))


def test_there_are_profiles():
    assert len(PROFILES) >= 2


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.name)
def test_shipped_profile_is_valid_and_plans(path, tree):
    tree.cgroup("rl", runtime=500000)
    for target, value in [("/proc/sys/vm/stat_interval", "1"), ("/proc/sys/kernel/timer_migration", "1"),
                          ("/proc/irq/default_smp_affinity", "3"), ("/proc/irq/24/smp_affinity_list", "0-1"),
                          ("/proc/cmdline", "root=/dev/vda1"), ("/sys/fs/cgroup/cpuset/cpuset.cpus", "0-1"),
                          ("/sys/fs/cgroup/cpuset/cpuset.mems", "0"), ("/sys/devices/system/node/online", "0"),
                          ("/sys/devices/system/node/node0/cpulist", "0-1"), ("/proc/cpuinfo", "flags\t: fpu")]:
        tree.set(target, value)
    plugins = load_plugins()
    profile = load_profile(path)
    assert plugins.validate(profile, tree.host) == []
    assert plugins.plan(profile, tree.host)


LIVE = [p for p in PROFILES if p.name != "rl-inference-cgroup.toml"]  # that one needs the cgroup "rl"


@pytest.mark.skipif(not Path("/sys/devices/system/cpu/cpu1").exists(), reason="the profiles use CPU 1")
@pytest.mark.parametrize("path", LIVE, ids=lambda p: p.name)
def test_shipped_profile_passes_a_dry_run_on_this_host(path, capsys, monkeypatch, tmp_path):
    from tuned_rl.cli import main
    monkeypatch.delenv("TUNED_RL_HOST_ROOT", raising=False)
    monkeypatch.setenv("TUNED_RL_STATE_DIR", str(tmp_path / "state"))
    status = main(["apply", str(path), "--dry-run"])
    assert status == 0, capsys.readouterr().err
