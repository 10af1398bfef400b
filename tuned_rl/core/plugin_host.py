"""Loading plugins from the ``tuned_rl`` entry-point group and calling their hooks."""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Callable

import pluggy

from tuned_rl import hookspec
from tuned_rl.core.changes import Step
from tuned_rl.core.kinds import register_kind
from tuned_rl.core.phases import phase_rank
from tuned_rl.core.plugin_api import declared_api, table_warnings
from tuned_rl.host import Host, TaskGone
from tuned_rl.profiles.loader import PROFILE_TABLE, Profile
from tuned_rl.profiles.schema import Problem, Table
from tuned_rl.measure.targets import TARGET_TABLE, target_problems
from tuned_rl.measure.settings import VERIFY_TABLE

ENTRY_POINT_GROUP = "tuned_rl"
CORE_TABLES = {"verify": VERIFY_TABLE, "target": TARGET_TABLE}  # [profile] is checked first, on its own


@dataclass(frozen=True)
class LoadFailure:
    """A plugin that could not be used, and why."""

    name: str
    error: str


@dataclass(frozen=True)
class LoadWarning:
    """A plugin that loaded, and what it should change before the release that no longer loads it."""

    name: str
    warning: str


@dataclass
class PluginHost:
    """The loaded plugins, the tables they own, and the ones that failed to load."""

    manager: pluggy.PluginManager
    tables: dict[str, Table] = field(default_factory=dict)
    owners: dict[str, str] = field(default_factory=dict)  # table -> plugin name
    failures: list[LoadFailure] = field(default_factory=list)
    warnings: list[LoadWarning] = field(default_factory=list)
    apis: dict[str, str] = field(default_factory=dict)  # plugin name -> the plugin API it was written for

    def plugin_tables(self) -> dict[str, list[Table]]:
        """Plugin name -> the tables it owns, for ``tuned-rl plugins``."""
        listing: dict[str, list[Table]] = {name: [] for name, _ in self.manager.list_name_plugin()}
        for table, owner in self.owners.items():
            listing[owner].append(self.tables[table])
        return listing

    def phase_of(self, table: str) -> str | None:
        return self.tables[table].phase if table in self.tables else None

    def validate(self, profile: Profile, host: Host) -> list[str]:
        """Every problem of ``profile``, as "file: key: message"; [] if it is usable."""
        problems = PROFILE_TABLE.check(profile.tables.get("profile", {}), host)
        for name, values in profile.tables.items():
            if name == "profile":
                continue
            if name in CORE_TABLES:
                problems += CORE_TABLES[name].check(values, host)
            elif name in self.tables:
                problems += self.tables[name].check(values, host)
            else:
                problems.append(Problem(name, self._unknown_table(name)))
        if not problems and "target" in profile.tables:
            problems += target_problems(profile.tables["target"], host)
        if not problems:
            for found in self.manager.hook.tuned_rl_validate(profile=profile, host=host):
                problems += found or []
        return [profile.describe(p) for p in problems]

    def plan(self, profile: Profile, host: Host) -> list[Step]:
        """All plugins' steps in phase order; within a phase, as their tables appear in the profile."""
        steps = [s for found in self.manager.hook.tuned_rl_plan(profile=profile, host=host) for s in found or []]
        order = {name: index for index, name in enumerate(profile.tables)}
        return sorted(steps, key=lambda step: (phase_rank(self.phase_of(step.table)),
                                               order.get(step.table, len(order))))

    def plan_process(self, profile: Profile, host: Host, process,
                     failed: Callable[[str, Exception], None] | None = None) -> list[Step]:
        """Every plugin's steps for one process that started after the apply, in phase order.

        With ``failed``, a plugin whose hook raises (anything but TaskGone: the process exited,
        which is no plugin's fault) is reported as ``failed(plugin name, error)`` and its steps left
        out; the others' are planned. Without it, the error is raised."""
        arguments, steps = {"profile": profile, "host": host, "process": process}, []
        for implementation in reversed(self.manager.hook.tuned_rl_plan_process.get_hookimpls()):  # pluggy's order
            try:
                found = implementation.function(*(arguments[name] for name in implementation.argnames))
            except TaskGone:
                raise
            except Exception as err:  # noqa: BLE001 - a third-party plugin may raise anything
                if failed is None:
                    raise
                failed(implementation.plugin_name, err)
                continue
            steps += found or []
        return sorted(steps, key=lambda step: phase_rank(self.phase_of(step.table)))

    def _unknown_table(self, name: str) -> str:
        message = f"unknown table [{name}] (known: {', '.join(sorted(self.tables)) or 'none'})"
        failed = ", ".join(f.name for f in self.failures)
        return message + (f"; plugins that failed to load: {failed}" if failed else "")


def load_plugins(extra: tuple = ()) -> PluginHost:
    """Register every ``tuned_rl`` entry point (and ``extra`` (name, module) pairs).

    A plugin that fails to import, asks for a newer plugin API (tuned_rl.core.plugin_api),
    declares a table another plugin owns or a table with an unknown phase, or a change
    kind another plugin registered, is recorded in ``failures`` and left out; the others
    still load. An API 0.1 plugin's table without a phase loads, with a ``warnings`` entry.
    """
    manager = pluggy.PluginManager(ENTRY_POINT_GROUP)
    manager.add_hookspecs(hookspec)
    plugin_host = PluginHost(manager)
    for entry_point in _entry_points(ENTRY_POINT_GROUP):
        if manager.has_plugin(entry_point.name):
            continue  # the same distribution seen twice on sys.path
        try:
            plugin = entry_point.load()
        except Exception as err:  # any import error must not take the other plugins down
            plugin_host.failures.append(LoadFailure(entry_point.name, f"{type(err).__name__}: {err}"))
            continue
        _register(plugin_host, entry_point.name, plugin)
    for name, plugin in extra:
        _register(plugin_host, name, plugin)
    return plugin_host


def _register(plugin_host: PluginHost, name: str, plugin) -> None:
    manager = plugin_host.manager
    try:
        api = declared_api(plugin)
        manager.register(plugin, name=name)
        manager.check_pending()  # a misspelled hook name fails here, loudly
        tables = _own_results(manager, name, "tuned_rl_tables")
        kinds = _own_results(manager, name, "tuned_rl_change_kinds")
        warnings = table_warnings(tables, api)
    except Exception as err:
        if manager.is_registered(plugin):
            manager.unregister(plugin)
        plugin_host.failures.append(LoadFailure(name, f"{type(err).__name__}: {err}"))
        return
    clash = [t.name for t in tables if t.name in plugin_host.owners or t.name in ("profile", *CORE_TABLES)]
    if clash:
        manager.unregister(plugin)
        plugin_host.failures.append(LoadFailure(name, f"table [{clash[0]}] is already owned"))
        return
    try:
        for kind in kinds:
            register_kind(kind)
    except ValueError as err:
        manager.unregister(plugin)
        plugin_host.failures.append(LoadFailure(name, str(err)))
        return
    for table in tables:
        plugin_host.tables[table.name] = table
        plugin_host.owners[table.name] = name
    plugin_host.apis[name] = api
    plugin_host.warnings += [LoadWarning(name, warning) for warning in warnings]


def _own_results(manager: pluggy.PluginManager, name: str, hook: str) -> list:
    """What plugin ``name`` alone returns from a hook that takes no arguments."""
    caller = manager.subset_hook_caller(hook, remove_plugins=[p for n, p in manager.list_name_plugin() if n != name])
    return [item for found in caller() for item in found or []]


def _entry_points(group: str) -> list:
    """The installed entry points of ``group`` (Python 3.9's importlib.metadata has no ``group=``)."""
    found = entry_points()
    if hasattr(found, "select"):
        return list(found.select(group=group))
    return list(found.get(group, []))
