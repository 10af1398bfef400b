"""tuned-rl: tune a host for a latency-critical workload, one undoable step at a time.

Writing a plugin
================

A plugin is a module that owns one profile table. It declares the table's keys
and the phase its steps run in, checks what declarations cannot, and plans
changes; the core applies them, journals every original value before the
write, and undoes them on rollback.
Built-in plugins are loaded the same way as yours: through the ``tuned_rl``
entry-point group. In your distribution's ``pyproject.toml``::

    [project.entry-points.tuned_rl]
    swappiness = "my_package.swappiness"

and ``my_package/swappiness.py``, a complete plugin for a ``[swappiness]`` table::

    from tuned_rl import Change, Key, Problem, Step, Table, hookimpl

    TUNED_RL_PLUGIN_API = "0.2"  # the plugin API this module is written for
    TARGET = "/proc/sys/vm/swappiness"

    @hookimpl
    def tuned_rl_tables():
        return [Table("swappiness", "How eagerly the kernel swaps.",
                      {"value": Key(int, "vm.swappiness", required=True, minimum=0, maximum=200)},
                      phase="kernel")]

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

Every hook is documented in :mod:`tuned_rl.hookspec`. ``TUNED_RL_PLUGIN_API`` names the plugin
API the module is written for (:mod:`tuned_rl.core.plugin_api`): a plugin asking for a newer one than
the installed tuned-rl has is not loaded, and one that names none is taken for an API 0.1 plugin,
whose tables may lack a phase until tuned-rl 0.3 (they load with a warning). Read the host only through
the ``host`` argument (tests point it at a temporary tree; ``host.processes()``
and ``host.threads(pid)`` list tasks), and never write in a hook: a plan is pure,
so ``tuned-rl apply --dry-run`` can show it safely.

A change's kind says what it changes (:mod:`tuned_rl.core.kinds`): ``file``,
``cpulist`` and ``cpumask`` (a /proc or /sys value), ``config_file`` and
``directory`` (a file tuned-rl creates or replaces), ``cgroup_dir`` (a cgroup it
creates), ``service`` (a systemd unit started or stopped), and for a task
(``Change(..., task=info.task)``) ``sched``, ``nice``, ``io_priority``,
``affinity``, ``cgroup`` and ``process_cgroup``. The phases are listed in
:mod:`tuned_rl.core.phases`. A step over many tasks is fine: a task that exits
before it is changed is counted as gone, not an error. A kind whose ``write`` raises
``tuned_rl.Refused`` (the kernel never takes that value there, such as a
managed IRQ's affinity) has that change left out and named in the step's notes.

Adding it, step by step:

1. the module, as above: its tables (each with a phase), validation and plan, importing
   only ``tuned_rl`` (every name a plugin needs is exported here: the workload's processes,
   ``Refused``, cgroup helpers, and ``family``/``runs_tuned_rl``, the one rule for "is this
   process tuned-rl?");
2. its entry point in your ``pyproject.toml`` (above);
3. install the distribution, and install it again after any change to its entry points
   (``pip install -e .``): tuned-rl reads plugins from installed metadata, so an entry point
   only written in ``pyproject.toml`` is not loaded; ``tuned-rl plugins`` lists what is;
4. try the plan with ``tuned-rl apply --dry-run PROFILE``, and test it against a tree
   (``Host(tmp_path)`` reads and writes below ``tmp_path``).
"""

import pluggy

from tuned_rl.core.changes import Change, Step
from tuned_rl.core.kinds import CgroupDir, CpuListFile, Kind, Refused, cgroup_settings
from tuned_rl.core.plugin_api import PLUGIN_API_VERSION
from tuned_rl.host import (Host, ProcessInfo, Task, format_cpu_list, format_cpu_mask, parse_cpu_list, parse_cpu_mask,
                           printable)
from tuned_rl.host.numa import NumaError, node_of, page_shares, topology
from tuned_rl.host.processes import parse_cgroup_file
from tuned_rl.host.shared_memory import (SEGMENT_NAME, SHM_DIRECTORY, SegmentGone, mapped_segments, parse_policy,
                                         resident_pages)
from tuned_rl.measure.targets import (TargetError, is_target_process, named_workload_problem, target_from_table,
                                      target_processes, unit_cgroup, user_id, workload_for_step)
from tuned_rl.measure.tuned_rl_processes import family, in_family, runs_tuned_rl
from tuned_rl.profiles.loader import Profile
from tuned_rl.profiles.schema import CgroupPath, CpuList, Key, Map, Problem, Regex, Table, ValueType

__version__ = "0.2.0"

hookimpl = pluggy.HookimplMarker("tuned_rl")

__all__ = [
    # a plugin's tables, plan and hooks
    "PLUGIN_API_VERSION", "CgroupPath", "Change", "CpuList", "Key", "Kind", "Map", "Problem", "Profile", "Regex",
    "Step", "Table", "ValueType", "hookimpl",
    # kinds of change a plugin builds on
    "CgroupDir", "CpuListFile", "Refused", "cgroup_settings",
    # the host as plugins read it
    "Host", "ProcessInfo", "Task", "format_cpu_list", "format_cpu_mask", "parse_cgroup_file", "parse_cpu_list",
    "parse_cpu_mask", "printable",
    # NUMA nodes and shared-memory segments
    "NumaError", "SEGMENT_NAME", "SHM_DIRECTORY", "SegmentGone", "mapped_segments", "node_of", "page_shares",
    "parse_policy", "resident_pages", "topology",
    # the target: the workload and its processes, and tuned-rl's own
    "TargetError", "family", "in_family", "is_target_process", "named_workload_problem", "runs_tuned_rl",
    "target_from_table", "target_processes", "unit_cgroup", "user_id", "workload_for_step",
]
