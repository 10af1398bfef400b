"""tuned-rl: tune a host for a latency-critical workload, one undoable step at a time.

Writing a plugin
================

A plugin is a module that owns one profile table. It declares the table's keys,
checks what declarations cannot, and plans changes; the core applies them,
journals every original value before the write, and undoes them on rollback.
Built-in plugins are loaded the same way as yours: through the ``tuned_rl``
entry-point group. In your distribution's ``pyproject.toml``::

    [project.entry-points.tuned_rl]
    swappiness = "my_package.swappiness"

and ``my_package/swappiness.py``, a complete plugin for a ``[swappiness]`` table::

    from tuned_rl import Change, Key, Problem, Step, Table, hookimpl

    TARGET = "/proc/sys/vm/swappiness"

    @hookimpl
    def tuned_rl_tables():
        return [Table("swappiness", "How eagerly the kernel swaps.",
                      {"value": Key(int, "vm.swappiness", required=True, minimum=0, maximum=200)})]

    @hookimpl
    def tuned_rl_validate(profile, host):
        if profile.get("swappiness") is not None and not host.exists(TARGET):
            return [Problem("swappiness.value", f"{TARGET} does not exist on this host")]

    @hookimpl
    def tuned_rl_plan(profile, host):
        table = profile.get("swappiness")
        if table is None:
            return []
        change = Change("file", TARGET, before=host.read(TARGET), after=str(table["value"]))
        return [Step("swappiness", "set vm.swappiness", [change])]

Every hook is documented in :mod:`tuned_rl.hookspec`. Read the host only through
the ``host`` argument (tests point it at a temporary tree), and never write in a
hook: a plan is pure, so ``tuned-rl apply --dry-run`` can show it safely.
"""

import pluggy

from tuned_rl.core.changes import Change, Step
from tuned_rl.host import Host, Task
from tuned_rl.profiles.loader import Profile
from tuned_rl.profiles.schema import Key, Problem, Table

__version__ = "0.1.0"

hookimpl = pluggy.HookimplMarker("tuned_rl")

__all__ = ["Change", "Host", "Key", "Problem", "Profile", "Step", "Table", "Task", "hookimpl"]
