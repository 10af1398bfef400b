"""The CPU split that [irq_isolation] and [cpu_isolation] share: latency CPUs for the workload,
housekeeping CPUs for everything else. Not a plugin: a helper both import.

A table shares the split by declaring its keys with ``shared_keys(name)``: the tables checked
against each other are those that did, never a list kept by hand."""

from __future__ import annotations

from tuned_rl import CpuList, Key, Problem, format_cpu_list, parse_cpu_list

SHARING: set[str] = set()  # the tables whose declarations took the split's keys (shared_keys)

KEYS = {
    "latency_cpus": Key(CpuList(), 'CPUs kept for the workload, e.g. "1" or "2-7".', required=True),
    "housekeeping_cpus": Key(CpuList(), "CPUs for everything else (default: every other online CPU)."),
}


def shared_keys(table: str) -> dict:
    """The split's keys, for table ``table`` to declare: it is then held to the same split as every
    other table that declared them."""
    SHARING.add(table)
    return dict(KEYS)


def split(table: dict, host) -> tuple[set[int], set[int]]:
    """(latency CPUs, housekeeping CPUs) of a table that passed ``problems``."""
    latency = parse_cpu_list(table["latency_cpus"])
    if "housekeeping_cpus" in table:
        return latency, parse_cpu_list(table["housekeeping_cpus"])
    return latency, host.online_cpus() - latency


def problems(profile, name: str, host) -> list[Problem]:
    """What is wrong with the split of table ``name``: an overlap, no housekeeping CPU left, or a
    different split from the other isolation table of the same profile."""
    table = profile.get(name)
    latency, housekeeping = split(table, host)
    found = []
    if latency & housekeeping:
        found.append(Problem(f"{name}.housekeeping_cpus", f"CPUs {format_cpu_list(latency & housekeeping)} are both "
                                                          "latency and housekeeping CPUs: a CPU is one or the other"))
    if not housekeeping:
        found.append(Problem(f"{name}.latency_cpus", f"{table['latency_cpus']!r} leaves no housekeeping CPU: the "
                                                     "rest of the host (and the kernel's own work) needs at least one"))
    for other in sorted(SHARING):
        config = profile.get(other)
        if other != name and config is not None and other < name and split(config, host) != (latency, housekeeping):
            found.append(Problem(f"{name}.latency_cpus", f"[{name}] and [{other}] split the CPUs differently: "
                                                         "give both the same latency_cpus and housekeeping_cpus"))
    return found
