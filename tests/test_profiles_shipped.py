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
    plugins = load_plugins()
    profile = load_profile(path)
    assert plugins.validate(profile, tree.host) == []
    assert plugins.plan(profile, tree.host)
