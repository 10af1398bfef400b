"""The hooks a tuned-rl plugin implements: every one is documented here."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:  # the hooks' types only: plugins and the core both import this module
    from tuned_rl.core.changes import Step
    from tuned_rl.core.kinds import Kind
    from tuned_rl.host import Host, ProcessInfo
    from tuned_rl.profiles.loader import Profile
    from tuned_rl.profiles.schema import Problem, Table

hookspec = pluggy.HookspecMarker("tuned_rl")


@hookspec
def tuned_rl_tables() -> list[Table]:
    """Declare the profile tables this plugin owns, with every key's type and range.

    The core rejects a profile holding a table no plugin owns, a key a table does
    not declare, and a value of the wrong type or out of range, before any plugin
    is asked to plan. A table name may be owned by one plugin only. Each table
    declares the ``phase`` its steps run in (see :mod:`tuned_rl.core.phases`):
    steps run in phase order whatever the order of tables in the profile.

    :return: the plugin's tables (usually one, named like the plugin's module).
    """


@hookspec
def tuned_rl_validate(profile: Profile, host: Host) -> list[Problem] | None:
    """Check what a key-by-key declaration cannot: relations between keys and
    facts of the host (a named cgroup exists, runtime <= period).

    Called only for a profile whose tables already passed their declarations, so
    values have the declared types. Must not change the host.

    :param profile: the whole merged profile; read your own table with ``profile.get(name)``.
    :param host: read-only use: where the values will be written.
    :return: problems, each with a dotted key (``"rt_runtime.cgroup"``); None or [] if none.
    """


@hookspec
def tuned_rl_plan(profile: Profile, host: Host) -> list[Step] | None:
    """Plan this plugin's steps: read the host, return the changes. No writes.

    The core journals each change's ``before`` durably, writes ``after``, reads it
    back, and undoes the step (changes in reverse order) if any write fails. A step
    with nothing to change is reported as "unchanged"; a step that cannot apply on
    this host sets ``skip_reason`` and is reported as "skipped".

    :param profile: the whole merged, validated profile.
    :param host: where to read current values.
    :return: steps in the order to apply them; None or [] if the profile has no table of yours.
    """


@hookspec
def tuned_rl_plan_process(profile: Profile, host: Host, process: ProcessInfo) -> list[Step] | None:
    """Plan this plugin's changes for one process that started (or changed its name or user)
    after the profile was applied: `tuned-rl watch` calls it for each such process, and for every
    process on each rescan of /proc. No writes.

    Return only what this process (and, if your rule says so, its descendants) needs now: a
    process already placed plans no pending change, so calling this twice changes nothing the
    second time. watch journals each step's ``before`` durably and writes its changes exactly as
    ``apply`` does, so ``rollback`` (and a ``kill -9`` of watch at any moment) restore the late
    processes too. watch names each step it writes by the step's ``verb``: "placed" (the default),
    or "evicted" (``Step(..., verb="evicted")``), its events' names (docs/watch.md).

    :param profile: the applied profile (merged, validated).
    :param host: where to read current values.
    :param process: the process's main thread as :class:`tuned_rl.host.ProcessInfo`.
    :return: steps with the changes for it; None or [] if your tables do not concern it.
    """


@hookspec
def tuned_rl_change_kinds() -> list[Kind]:
    """Add kinds of change beyond the built-in ones (:mod:`tuned_rl.core.kinds`).

    A kind is a small class that reads, writes, compares, shows and checks one kind
    of value; the core journals and undoes changes of every kind alike. Rollback of
    a journal holding a kind needs the plugin that adds it to be installed. A kind
    name may be registered by one class only.

    :return: instances of :class:`tuned_rl.core.kinds.Kind` subclasses; None or [] if none.
    """
