"""[sysctl]: kernel parameters under /proc/sys, one verified step per key.

    [sysctl]
    "vm.swappiness" = 10
    "net.ipv4.tcp_rmem" = "4096 131072 6291456"
    "net/ipv4/conf/eth0.100/rp_filter" = 1     # slashes: the dots are part of a name

One step per key, not one for the table: each parameter is then measured and judged on
its own, so a harmful one is reverted alone and the report names it, where one step
for the table would revert every key for the fault of one. The price is verification
time per key; keep a profile's [sysctl] to the parameters that matter for latency.
"""

from __future__ import annotations

import re
import stat

from tuned_rl import Change, Key, Problem, Step, Table, hookimpl

NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-/:]*$")
RT_RUNTIME = "/proc/sys/kernel/sched_rt_runtime_us"

TUNED_RL_PLUGIN_API = "0.2"

TABLE = Table(
    "sysctl",
    'Kernel parameters under /proc/sys, one step each: "vm.swappiness" = 10.',
    phase="kernel",
    any_key=Key((int, str), 'A parameter\'s value: a number, or text such as "4096 131072 6291456".'),
)


@hookimpl
def tuned_rl_tables():
    return [TABLE]


@hookimpl
def tuned_rl_validate(profile, host):
    table = profile.get("sysctl")
    if table is None:
        return None
    if not table:
        return [Problem("sysctl", "names no parameter")]
    problems = []
    for name, value in table.items():
        problems += [Problem(f"sysctl.{name}", message) for message in _problems(host, name, value)]
    rt_runtime = profile.get("rt_runtime") or {}
    if "global_runtime_us" in rt_runtime and any(sysctl_path(n) == RT_RUNTIME for n in table if _valid_name(n)):
        problems.append(Problem("sysctl", "kernel.sched_rt_runtime_us is also set by [rt_runtime] "
                                          "global_runtime_us: set it in one place"))
    return problems


@hookimpl
def tuned_rl_plan(profile, host):
    table = profile.get("sysctl")
    if table is None:
        return None
    steps = []
    for name, value in table.items():
        path = sysctl_path(name)
        steps.append(Step("sysctl", f"set {name} = {value}", [Change("file", path, host.read(path), str(value))]))
    return steps


def sysctl_path(name: str) -> str:
    """"vm.swappiness" -> /proc/sys/vm/swappiness; with slashes, dots belong to the names."""
    parts = name.split("/") if "/" in name else name.split(".")
    return "/proc/sys/" + "/".join(parts)


def _valid_name(name: str) -> bool:
    parts = name.split("/") if "/" in name else name.split(".")
    return bool(NAME.match(name)) and all(p not in ("", ".", "..") for p in parts)


def _problems(host, name: str, value) -> list[str]:
    if not _valid_name(name):
        return [f"{name!r} is not a sysctl name such as \"vm.swappiness\""]
    if isinstance(value, str) and ("\n" in value or not value.strip()):
        return [f"{value!r}: a value is one non-empty line"]
    path = sysctl_path(name)
    if not host.exists(path):
        return [f"this kernel has no {name} ({path})"]
    if host.is_dir(path):
        return [f"{name} is a group of parameters ({path}), not one"]
    if not host.path(path).stat().st_mode & stat.S_IWUSR:
        return [f"{name} is read-only"]
    return []
