"""The plugin host: registration checks, table ownership, step order; every hook documented and tested."""

import inspect
from pathlib import Path

import pytest

from tuned_rl import Change, Key, Problem, Step, Table, hookimpl, hookspec
from tuned_rl.core.plugin_host import load_plugins
from tuned_rl.profiles.loader import load_profile


class Misspelled:
    @hookimpl
    def tuned_rl_plna(self, profile, host):
        return []


class Clashing:
    @hookimpl
    def tuned_rl_tables(self):
        return [Table("rt_runtime", "mine too")]


class Checker:
    """Owns [check]: tests tuned_rl_validate and tuned_rl_plan ordering."""

    @hookimpl
    def tuned_rl_tables(self):
        return [Table("check", "test", {"limit": Key(int, "a limit", required=True)})]

    @hookimpl
    def tuned_rl_validate(self, profile, host):
        table = profile.get("check")
        if table and table["limit"] > int(host.read("/proc/sys/vm/swappiness")):
            return [Problem("check.limit", "above swappiness")]

    @hookimpl
    def tuned_rl_plan(self, profile, host):
        if profile.get("check") is None:
            return []
        return [Step("check", "check step", [Change("file", "/proc/sys/vm/swappiness", "60", "1")])]


def test_a_misspelled_hook_fails_the_plugin_loudly_and_the_others_load():
    plugins = load_plugins(extra=[("typo", Misspelled())])
    assert [f.name for f in plugins.failures] == ["typo"]
    assert "tuned_rl_plna" in plugins.failures[0].error
    assert "rt_runtime" in plugins.tables and not plugins.manager.has_plugin("typo")


def test_a_table_owned_twice_is_refused_for_the_second_plugin():
    plugins = load_plugins(extra=[("clash", Clashing())])
    assert plugins.owners["rt_runtime"] == "rt_runtime"
    assert plugins.failures[0].name == "clash" and "already owned" in plugins.failures[0].error


def test_validate_hook_problems_name_the_file_and_key(tree, profile_file):
    plugins = load_plugins(extra=[("check", Checker())])
    path = profile_file("[check]\nlimit = 61\n")
    assert plugins.validate(load_profile(path), tree.host) == [f"{path}: check.limit: above swappiness"]
    assert plugins.validate(load_profile(profile_file("[check]\nlimit = 60\n")), tree.host) == []


def test_validate_hooks_only_see_tables_that_passed_their_declarations(tree, profile_file):
    plugins = load_plugins(extra=[("check", Checker())])
    problems = plugins.validate(load_profile(profile_file('[check]\nlimit = "x"\n')), tree.host)
    assert len(problems) == 1 and "must be an integer" in problems[0]


def test_steps_follow_the_order_of_tables_in_the_profile(tree, profile_file):
    plugins = load_plugins(extra=[("check", Checker())])
    for text, order in [("[check]\nlimit=1\n[rt_runtime]\nglobal_runtime_us=900000\n", ["check", "rt_runtime"]),
                        ("[rt_runtime]\nglobal_runtime_us=900000\n[check]\nlimit=1\n", ["rt_runtime", "check"])]:
        steps = plugins.plan(load_profile(profile_file(text)), tree.host)
        assert [s.table for s in steps] == order


def test_plugin_tables_lists_each_plugin_with_its_tables():
    assert load_plugins(extra=[("check", Checker())]).plugin_tables() == {
        "rt_runtime": ["rt_runtime"], "check": ["check"]}


HOOKS = [name for name, _ in inspect.getmembers(hookspec, inspect.isfunction) if name.startswith("tuned_rl_")]


@pytest.mark.parametrize("name", HOOKS)
def test_every_hook_is_documented(name):
    doc = inspect.getdoc(getattr(hookspec, name)) or ""
    assert ":return:" in doc and len(doc.splitlines()) >= 4
    for parameter in inspect.signature(getattr(hookspec, name)).parameters:
        assert f":param {parameter}:" in doc


@pytest.mark.parametrize("name", HOOKS)
def test_every_hook_has_a_test(name):
    tests = "".join(p.read_text() for p in Path(__file__).parent.glob("test_*.py") if p.name != Path(__file__).name)
    assert name in tests or name in Path(__file__).read_text().split("HOOKS = ")[0]
