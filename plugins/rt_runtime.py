"""[rt_runtime]: the RT CPU budget, global and of one cgroup, that throttles SCHED_FIFO threads."""

from __future__ import annotations

from fractions import Fraction
from math import ceil
from pathlib import PurePosixPath

from tuned_rl import CgroupPath, Change, Key, Problem, Step, Table, hookimpl

GLOBAL_RUNTIME = "/proc/sys/kernel/sched_rt_runtime_us"
GLOBAL_PERIOD = "/proc/sys/kernel/sched_rt_period_us"
UNLIMITED = -1
MAX_US = 2**31 - 1

TUNED_RL_PLUGIN_API = "0.2"

TABLE = Table(
    "rt_runtime",
    "How much of each period SCHED_FIFO/RR threads may run before the kernel throttles them.",
    {
        "global_runtime_us": Key(int, "kernel.sched_rt_runtime_us: the whole host's RT budget per period.",
                                 minimum=UNLIMITED, maximum=MAX_US),
        "cgroup": Key(CgroupPath(), "A cgroup of the v1 cpu hierarchy (\"rl\" or \"/ray/actors\")."),
        "cgroup_runtime_us": Key(int, "That cgroup's cpu.rt_runtime_us; parents are raised first if needed.",
                                 minimum=UNLIMITED, maximum=MAX_US),
        "allow_unlimited": Key(bool, "Permit -1 (no throttling): a runaway RT thread then owns its CPU."),
    },
    phase="kernel",  # before tasks are placed: a FIFO task cannot join a cgroup without RT budget
)


@hookimpl
def tuned_rl_tables():
    return [TABLE]


@hookimpl
def tuned_rl_validate(profile, host):
    config = profile.get("rt_runtime")
    if config is None:
        return None
    problems = _check_keys(config)
    if not problems and "global_runtime_us" in config:
        problems += _check_period(host, "rt_runtime.global_runtime_us", config["global_runtime_us"], GLOBAL_PERIOD)
    if not problems and "cgroup" in config:
        problems += _check_cgroup(host, config)
    return problems


@hookimpl
def tuned_rl_plan(profile, host):
    config = profile.get("rt_runtime")
    if config is None:
        return None
    steps = []
    if "cgroup" in config:
        steps.append(_cgroup_step(host, config["cgroup"], config["cgroup_runtime_us"]))
    if "global_runtime_us" in config:
        before = host.read(GLOBAL_RUNTIME)
        after = str(config["global_runtime_us"])
        step = Step("rt_runtime", "set global RT budget",
                    _root_group_changes(host, int(after)) + [Change("file", GLOBAL_RUNTIME, before, after)])
        # Raise the host's budget before a cgroup's, lower it after: the kernel
        # refuses a parent budget below what its children hold.
        steps.insert(0 if _budget(after) >= _budget(before) else len(steps), step)
    return steps


def _root_group_changes(host, runtime: int) -> list[Change]:
    """With RT group scheduling the root cgroup holds its own budget (950000 at boot), and the
    kernel refuses a global budget below it: lower it first, in the same step."""
    mount = host.cgroup_v1_mount("cpu")
    root_file = f"{mount}/cpu.rt_runtime_us" if mount else None
    if runtime == UNLIMITED or root_file is None or not host.exists(root_file):
        return []
    current = int(host.read(root_file))
    if current != UNLIMITED and current <= runtime:
        return []
    return [Change("file", root_file, str(current), str(runtime))]


def _check_keys(config: dict) -> list[Problem]:
    problems = []
    if "global_runtime_us" not in config and "cgroup" not in config:
        problems.append(Problem("rt_runtime", "set global_runtime_us, or cgroup with cgroup_runtime_us"))
    if ("cgroup" in config) != ("cgroup_runtime_us" in config):
        missing = "cgroup_runtime_us" if "cgroup" in config else "cgroup"
        problems.append(Problem(f"rt_runtime.{missing}", "cgroup and cgroup_runtime_us go together"))
    for key in ("global_runtime_us", "cgroup_runtime_us"):
        if config.get(key) == UNLIMITED and not config.get("allow_unlimited", False):
            problems.append(Problem(f"rt_runtime.{key}", "-1 (unlimited) lets a runaway RT thread own a CPU; "
                                    "set allow_unlimited = true to mean it"))
    return problems


def _check_period(host, key: str, runtime: int, period_file: str) -> list[Problem]:
    period = int(host.read(period_file))
    if runtime > period:
        return [Problem(key, f"runtime {runtime} exceeds the period {period} ({period_file})")]
    return []


def _check_cgroup(host, config: dict) -> list[Problem]:
    mount = host.cgroup_v1_mount("cpu")
    if mount is None:
        return []  # cgroup v2 only: the plan skips the step and says why
    directory = _cgroup_dir(mount, config["cgroup"])
    if not host.is_dir(directory):
        return [Problem("rt_runtime.cgroup", f"cgroup {config['cgroup']!r} does not exist ({directory})")]
    if not host.exists(f"{directory}/cpu.rt_runtime_us"):
        return []  # no RT group scheduling in this kernel: skipped at plan time
    runtime = config["cgroup_runtime_us"]
    problems = _check_period(host, "rt_runtime.cgroup_runtime_us", runtime, f"{directory}/cpu.rt_period_us")
    children = _children_need(host, directory, skip=None)
    if children > _ratio(host, directory, runtime):
        problems.append(Problem("rt_runtime.cgroup_runtime_us",
                                f"{runtime} is less than the sub-cgroups of {directory} hold"))
    global_runtime = config.get("global_runtime_us", int(host.read(GLOBAL_RUNTIME)))
    top = _ancestor_budgets(host, mount, config["cgroup"], runtime)[0]
    root_need = _children_need(host, mount, skip=top[0]) + _ratio(host, top[0], int(top[2]))
    if global_runtime != UNLIMITED and root_need > Fraction(global_runtime, int(host.read(GLOBAL_PERIOD))):
        problems.append(Problem("rt_runtime.cgroup_runtime_us",
                                f"{runtime} needs more than the global RT budget {global_runtime} leaves "
                                "for cgroups; raise global_runtime_us"))
    return problems


def _cgroup_step(host, cgroup: str, runtime: int) -> Step:
    title = f"set RT budget of cgroup {cgroup.strip('/')}"
    mount = host.cgroup_v1_mount("cpu")
    if mount is None:
        return Step("rt_runtime", title, skip_reason="cgroup v2 has no per-cgroup RT budget (cpu.rt_runtime_us)")
    directory = _cgroup_dir(mount, cgroup)
    if not host.exists(f"{directory}/cpu.rt_runtime_us"):
        return Step("rt_runtime", title, skip_reason="this kernel has no RT group scheduling (CONFIG_RT_GROUP_SCHED)")
    changes = [Change("file", f"{d}/cpu.rt_runtime_us", before, after)
               for d, before, after in _ancestor_budgets(host, mount, cgroup, runtime)]
    return Step("rt_runtime", title, changes)


def _ancestor_budgets(host, mount: str, cgroup: str, runtime: int) -> list[tuple[str, str, str]]:
    """(directory, before, after) from the topmost cgroup down to ``cgroup``.

    Each parent must hold at least the sum of its children's budgets (as shares of
    their periods), so a parent is raised just enough for the new budget below it.
    """
    parts = PurePosixPath(cgroup.strip("/")).parts
    directories = [f"{mount}/{'/'.join(parts[:i + 1])}" for i in range(len(parts))]
    budgets = [(directories[-1], runtime)]
    for parent, child in zip(reversed(directories[:-1]), reversed(directories[1:])):
        current = int(host.read(f"{parent}/cpu.rt_runtime_us"))
        child_runtime = budgets[0][1]
        if child_runtime == UNLIMITED or current == UNLIMITED:
            budgets.insert(0, (parent, UNLIMITED if child_runtime == UNLIMITED else current))
            continue
        need = _children_need(host, parent, skip=child) + _ratio(host, child, child_runtime)
        period = int(host.read(f"{parent}/cpu.rt_period_us"))
        budgets.insert(0, (parent, max(current, ceil(need * period))))
    return [(d, host.read(f"{d}/cpu.rt_runtime_us"), str(r)) for d, r in budgets]


def _children_need(host, directory: str, skip: str | None) -> Fraction:
    """The share of a period that the sub-cgroups of ``directory`` (but ``skip``) hold."""
    total = Fraction(0)
    for child in host.subdirs(directory):
        if child != skip and host.exists(f"{child}/cpu.rt_runtime_us"):
            total += _ratio(host, child, int(host.read(f"{child}/cpu.rt_runtime_us")))
    return total


def _ratio(host, directory: str, runtime: int) -> Fraction:
    if runtime == UNLIMITED:
        return Fraction(10**9)  # more than any finite budget
    return Fraction(runtime, int(host.read(f"{directory}/cpu.rt_period_us")))


def _budget(value) -> float:
    return float("inf") if int(value) == UNLIMITED else int(value)


def _cgroup_dir(mount: str, cgroup: str) -> str:
    return f"{mount}/{cgroup.strip('/')}"
