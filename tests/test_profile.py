"""Loading profiles: includes, precedence, and where each key came from."""


from __future__ import annotations
import os

import pytest

from tuned_rl.profiles.loader import ProfileError, load_profile


def test_include_is_relative_to_the_including_file_and_its_keys_win(profile_file):
    profile_file('[rt_runtime]\nglobal_runtime_us = 900000\ncgroup = "rl"\n', "base/common.toml")
    path = profile_file('[profile]\ninclude = ["base/common.toml"]\n[rt_runtime]\nglobal_runtime_us = 950000\n')
    profile = load_profile(path)
    assert profile.get("rt_runtime") == {"global_runtime_us": 950000, "cgroup": "rl"}
    assert profile.where("rt_runtime.global_runtime_us") == path
    assert profile.where("rt_runtime.cgroup").name == "common.toml"


def test_name_defaults_to_the_file_stem_and_can_be_set(profile_file):
    assert load_profile(profile_file("", "gpu-node.toml")).name == "gpu-node"
    assert load_profile(profile_file('[profile]\nname = "llm"\n')).name == "llm"


def test_tables_keep_the_order_they_first_appear_in(profile_file):
    profile_file("[b]\nx = 1\n[a]\nx = 1\n", "base.toml")
    profile = load_profile(profile_file('[profile]\ninclude = ["base.toml"]\n[c]\nx = 1\n[a]\nx = 2\n'))
    assert list(profile.tables) == ["b", "a", "profile", "c"]  # an include comes first


def test_a_diamond_include_is_not_a_cycle(profile_file):
    profile_file("[t]\nx = 1\n", "shared.toml")
    profile_file('[profile]\ninclude = ["shared.toml"]\n', "left.toml")
    profile_file('[profile]\ninclude = ["shared.toml"]\n', "right.toml")
    profile = load_profile(profile_file('[profile]\ninclude = ["left.toml", "right.toml"]\n'))
    assert profile.get("t") == {"x": 1}


def test_a_cycle_names_every_file_in_it(profile_file):
    profile_file('[profile]\ninclude = ["b.toml"]\n', "a.toml")
    profile_file('[profile]\ninclude = ["a.toml"]\n', "b.toml")
    with pytest.raises(ProfileError) as err:
        load_profile(profile_file('[profile]\ninclude = ["a.toml"]\n'))
    assert "include cycle" in str(err.value) and "a.toml -> " in str(err.value)


@pytest.mark.parametrize("spoil, words", [
    (lambda p: os.chmod(p, 0o666), "is writable by group or others (mode 666)"),
    (lambda p: os.chmod(p, 0o620), "is writable by group or others (mode 620)"),
    pytest.param(lambda p: os.chown(p, 65534, 65534), "is owned by uid 65534",
                 marks=pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chown)")),
])
def test_an_included_profile_someone_else_could_write_is_refused(spoil, words, profile_file, tree, cli):
    base = profile_file("[rt_runtime]\nglobal_runtime_us = 900000\n", "base.toml")
    spoil(base)
    status, _, err = cli("apply", profile_file('[profile]\ninclude = ["base.toml"]\n'), "--dry-run")
    assert status == 2 and words in err and "included profile 'base.toml'" in err, err
