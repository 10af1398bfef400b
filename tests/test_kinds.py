"""Change kinds: a new one added from this module, and each built-in kind's read, write, compare and undo."""


from __future__ import annotations
import json
import os

import pytest

from tuned_rl import Change, Key, Kind, Step, Table, hookimpl
from tuned_rl.core.agent import Agent
from tuned_rl.core.journal import Journal
from tuned_rl.core.kinds import KINDS, kind_named
from tuned_rl.core.plugin_host import load_plugins
from tuned_rl.profiles.loader import load_profile

SETTINGS = "/sys/kernel/tuned-rl-test/settings.json"


class JsonKey(Kind):
    """A kind the core has never heard of: one key of a JSON settings file (absent key: None)."""

    name = "test_json_key"

    def read(self, host, change):
        path, _, key = change.target.partition("#")
        return json.loads(host.read(path)).get(key)

    def write(self, host, change, value):
        path, _, key = change.target.partition("#")
        data = json.loads(host.read(path))
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
        host.path(path).write_text(json.dumps(data, sort_keys=True))

    def valid_value(self, value):
        return value is None or isinstance(value, str)

    def paths(self, change):
        return [change.target.partition("#")[0]]


class JsonPlugin:
    """Owns [json_key]; its change kind comes with it."""

    @hookimpl
    def tuned_rl_change_kinds(self):
        return [JsonKey()]

    @hookimpl
    def tuned_rl_tables(self):
        return [Table("json_key", "test", {"mode": Key(str, "the value")}, phase="kernel")]

    @hookimpl
    def tuned_rl_plan(self, profile, host):
        table = profile.get("json_key")
        if table is None:
            return []
        current = json.loads(host.read(SETTINGS)).get("mode")
        return [Step("json_key", "set mode", [Change("test_json_key", f"{SETTINGS}#mode", current, table["mode"])])]


def test_a_kind_added_by_a_plugin_is_applied_journaled_and_rolled_back(tree, profile_file, state_dir):
    tree.set(SETTINGS, '{"other": "x"}')
    agent = Agent(load_plugins(extra=[("json", JsonPlugin())]), tree.host, Journal(state_dir))
    report, status = agent.apply(load_profile(profile_file('[json_key]\nmode = "fast"\n')))
    assert status == 0 and report.steps[0].outcome == "applied"
    assert json.loads(tree.get(SETTINGS)) == {"mode": "fast", "other": "x"}
    record = Journal(state_dir).records()[0]
    assert record.changes[0].kind == "test_json_key" and record.changes[0].before is None
    assert agent.status().changes[0].state == "holds"
    result, status = agent.rollback()
    assert status == 0 and result.changes[0].outcome == "restored"
    assert json.loads(tree.get(SETTINGS)) == {"other": "x"}


def test_a_kind_name_taken_by_another_class_fails_that_plugin_only():
    class Impostor(Kind):
        name = "file"

    class Plugin:
        @hookimpl
        def tuned_rl_change_kinds(self):
            return [Impostor()]

    plugins = load_plugins(extra=[("impostor", Plugin())])
    assert plugins.failures[0].name == "impostor" and "already registered" in plugins.failures[0].error
    assert type(kind_named("file")).__name__ == "FileValue" and "rt_runtime" in plugins.tables


def test_every_built_in_kind_is_registered():
    assert {"file", "cpulist", "cpumask", "config_file", "directory", "cgroup_dir", "sched", "affinity", "cgroup",
            "process_cgroup"} <= set(KINDS)


@pytest.mark.parametrize("kind, written, read_back", [
    ("file", "4096 131072 6291456", "4096\t131072\t6291456"),  # the kernel tab-separates tcp_rmem
    ("cpulist", "0,1", "0-1"),
    ("cpumask", "3", "00000003"),
    ("cpumask", "1,00000000", "00000001,00000000"),
])
def test_values_the_kernel_rewrites_still_read_back_as_written(kind, written, read_back):
    assert Change(kind, "/proc/x", read_back, written).pending is False
    assert kind_named(kind).same(read_back, written)


@pytest.mark.parametrize("kind, a, b", [("file", "1 2", "1 3"), ("cpulist", "0", "0-1"), ("cpumask", "1", "3")])
def test_different_values_are_different(kind, a, b):
    assert Change(kind, "/proc/x", a, b).pending


class Plan:
    """A throw-away plugin returning fixed steps for a [plan] table."""

    def __init__(self, *steps):
        self.steps = list(steps)

    @hookimpl
    def tuned_rl_tables(self):
        return [Table("plan", "test", {"on": Key(bool, "on")}, phase="cgroups")]

    @hookimpl
    def tuned_rl_plan(self, profile, host):
        return self.steps if profile.get("plan") is not None else []


def apply_and_roll_back(tree, profile_file, state_dir, *steps):
    agent = Agent(load_plugins(extra=[("plan", Plan(*steps))]), tree.host, Journal(state_dir))
    report, status = agent.apply(load_profile(profile_file("[plan]\non = true\n")))
    assert status == 0, report.steps[0].reason
    applied = tree.snapshot()
    result, status = agent.rollback()
    assert status == 0, result
    return applied, result


def test_a_created_file_and_directory_are_removed_on_rollback(tree, profile_file, state_dir):
    tree.set("/etc/systemd/system/keep", "")
    original = tree.snapshot()
    drop_in = "/etc/systemd/system/llm.service.d"
    content = {"mode": 0o644, "text": "[Service]\nNUMAPolicy=bind\nNUMAMask=1\n"}
    applied, result = apply_and_roll_back(tree, profile_file, state_dir, Step("plan", "drop-in", [
        Change("directory", drop_in, None, "present"),
        Change("config_file", f"{drop_in}/50-tuned-rl.conf", None, content, follow_up="systemd-daemon-reload"),
    ]))
    assert applied["etc/systemd/system/llm.service.d/50-tuned-rl.conf"] == content["text"].strip()
    assert [r.outcome for r in result.changes] == ["restored", "restored"]
    assert tree.snapshot() == {**original, "run/tuned-rl-actions.log": "systemctl daemon-reload\nsystemctl daemon-reload"}
    assert not tree.host.exists(drop_in)


def test_a_replaced_file_comes_back_byte_for_byte_with_its_mode(tree, profile_file, state_dir):
    path = tree.host.path("/etc/default/irqbalance")
    path.parent.mkdir(parents=True)
    original = b"# irqbalance\nIRQBALANCE_BANNED_CPULIST=3\n\xff\xfe not utf-8\n"
    path.write_bytes(original)
    os.chmod(path, 0o640)
    new = {"mode": 0o644, "text": "IRQBALANCE_BANNED_CPULIST=1\n"}
    apply_and_roll_back(tree, profile_file, state_dir, Step("plan", "ban", [
        Change("config_file", "/etc/default/irqbalance", "whatever the plan read", new)]))
    assert path.read_bytes() == original and path.stat().st_mode & 0o7777 == 0o640


def test_a_cgroup_created_with_its_settings_is_removed_on_rollback(tree, profile_file, state_dir):
    directory = "/sys/fs/cgroup/cpu/tuned-rl-offline"
    original = tree.snapshot()

    class TreeCgroups(type(tree.host)):
        """The tree's mkdir makes what the kernel would: a cgroup's files."""

        def make_dir(self, target):
            super().make_dir(target)
            for name in ("tasks", "cgroup.procs", "cpu.shares"):
                self.path(f"{target}/{name}").write_text("1024\n" if name == "cpu.shares" else "")

        def remove_dir(self, target):
            for child in self.path(target).iterdir():
                child.unlink()
            super().remove_dir(target)

    host = TreeCgroups(tree.root)
    agent = Agent(load_plugins(extra=[("plan", Plan(Step("plan", "offline", [
        Change("cgroup_dir", directory, None, {"cpu.shares": "2"})])))]), host, Journal(state_dir))
    report, status = agent.apply(load_profile(profile_file("[plan]\non = true\n")))
    assert status == 0 and tree.get(f"{directory}/cpu.shares") == "2"
    assert report.steps[0].changes[0].after == "present, cpu.shares=2"
    assert agent.rollback()[1] == 0
    assert tree.snapshot() == original


def test_a_record_naming_an_unknown_kind_or_a_bad_value_is_refused_with_its_path(tree, state_dir):
    journal_dir = state_dir / "journal"
    journal_dir.mkdir(parents=True)
    header = {"format": 2, "seq": 1, "boot_id": "b", "plugin": "p", "step": "s", "step_index": 0,
              "host_root": str(tree.root)}
    for change, why in [({"kind": "no_such_kind", "target": "/x", "before": "1", "after": "2"}, "unknown change kind"),
                        ({"kind": "affinity", "target": "", "before": "0-1", "after": "x",
                          "task": {"pid": 5, "start_time": 1, "comm": "c"}}, "not a affinity value"),
                        ({"kind": "file", "target": "relative/path", "before": "1", "after": "2"}, "absolute path")]:
        path = journal_dir / "000001.jsonl"
        path.write_text(json.dumps(header) + "\n" + json.dumps({"change": change}) + "\n")
        scan = Journal(state_dir).scan()
        assert scan.records == [] and [u.path for u in scan.unreadable] == [path]
        assert str(path) in scan.unreadable[0].reason and why in scan.unreadable[0].reason


def test_a_state_line_torn_by_a_crash_is_ignored(tree, cli, profile_file, state_dir):
    cli("apply", profile_file("[rt_runtime]\nglobal_runtime_us = 900000\n"))
    [path] = (state_dir / "journal").glob("*.jsonl")
    path.write_text(path.read_text().replace('{"state": "done"}\n', '{"sta'))
    [record] = Journal(state_dir).records()
    assert record.state == "journaled" and len(record.changes) == 2
    assert cli("rollback")[0] == 0 and tree.get("/proc/sys/kernel/sched_rt_runtime_us") == "950000"


def test_a_format_1_record_of_tuned_rl_0_1_still_rolls_back(tree, cli, state_dir):
    tree.set("/proc/sys/vm/swappiness", "10")
    journal_dir = state_dir / "journal"
    journal_dir.mkdir(parents=True)
    boot = tree.get("/proc/sys/kernel/random/boot_id")
    (journal_dir / "applied.json").write_text(json.dumps({"profile": "old", "path": "/p", "boot_id": boot,
                                                          "started": 0.0}))
    (journal_dir / "000001.json").write_text(json.dumps({
        "seq": 1, "boot_id": boot, "plugin": "swappiness", "step": "set", "step_index": 0, "state": "done",
        "change": {"kind": "file", "target": "/proc/sys/vm/swappiness", "before": "60", "after": "10", "task": None}}))
    status, out, _ = cli("rollback")
    assert status == 0 and "restored" in out and tree.get("/proc/sys/vm/swappiness") == "60"
    assert Journal(state_dir).is_empty()
