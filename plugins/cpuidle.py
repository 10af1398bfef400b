"""[cpuidle]: keep the latency CPUs out of deep idle states.

    [cpuidle]
    latency_cpus = "1"            # the CPUs a wake-up must find awake at once
    max_exit_latency_us = 0       # the slowest exit from idle allowed on them; 0: none but at once

A CPU in a deep C-state takes tens to hundreds of microseconds to run a woken thread (the
state's exit latency, listed in /sys/devices/system/cpu/cpuN/cpuidle/stateM/latency). Each CPU has
one PM QoS resume-latency request that user space sets through
/sys/devices/system/cpu/cpuN/power/pm_qos_resume_latency_us: the cpuidle governor then never picks
a state whose exit latency is beyond it (Documentation/admin-guide/pm/cpuidle.rst, "Power
Management Quality of Service for CPUs"). Reading it gives the number of microseconds, "0" for no
constraint, or "n/a" for a latency of 0 (the file's store takes "n/a" for that, as "0" means no
constraint: drivers/base/power/sysfs.c). One step writes it for every latency CPU, journaled and
undone like any file, and verified by the judge.

Not /dev/cpu_dma_latency: its request holds only while a process keeps the device open, so it
cannot be a journaled write that survives tuned-rl's exit; and it is every CPU's, where the
housekeeping CPUs may sleep deep. Where the machine has no cpuidle driver
(/sys/devices/system/cpu/cpuidle/current_driver reads "none", as on many VMs: the CPUs idle in the
default halt loop), there is no state to keep them out of, and the plan says so and changes nothing.
"""

from __future__ import annotations

from tuned_rl import Change, CpuList, Key, Problem, Step, Table, format_cpu_list, hookimpl, parse_cpu_list

TUNED_RL_PLUGIN_API = "0.2"
DRIVER = "/sys/devices/system/cpu/cpuidle/current_driver"
REQUEST = "/sys/devices/system/cpu/cpu{cpu}/power/pm_qos_resume_latency_us"
STATES = "/sys/devices/system/cpu/cpu{cpu}/cpuidle"

TABLE = Table(
    "cpuidle",
    "Keep the latency CPUs out of deep idle states (per-CPU PM QoS resume latency).",
    {"latency_cpus": Key(CpuList(), 'The CPUs kept out of deep idle states, e.g. "1" or "2-7".', required=True),
     "max_exit_latency_us": Key(int, "The slowest exit from idle allowed on them, in microseconds (0: only "
                                     "states left at once; the default).", minimum=0, maximum=100_000)},
    phase="kernel",
)


@hookimpl
def tuned_rl_tables():
    return [TABLE]


@hookimpl
def tuned_rl_validate(profile, host):
    table = profile.get("cpuidle")
    if table is None:
        return None
    cpus = parse_cpu_list(table["latency_cpus"])
    offline = cpus - host.online_cpus()
    if offline:
        return [Problem("cpuidle.latency_cpus", f"CPUs {format_cpu_list(offline)} are not online")]
    if no_driver_reason(host) is None:
        missing = [cpu for cpu in sorted(cpus) if not host.exists(REQUEST.format(cpu=cpu))]
        if missing:
            return [Problem("cpuidle.latency_cpus", f"this kernel has no {REQUEST.format(cpu=missing[0])} "
                                                    "(CONFIG_PM): the per-CPU request cannot be set")]
    return []


@hookimpl
def tuned_rl_plan(profile, host):
    table = profile.get("cpuidle")
    if table is None:
        return None
    cpus = sorted(parse_cpu_list(table["latency_cpus"]))
    limit = table.get("max_exit_latency_us", 0)
    wanted = request_text(limit)
    title = f"keep CPUs {format_cpu_list(set(cpus))} out of idle states slower than {limit} µs to leave"
    why_not = no_driver_reason(host)
    if why_not is not None:
        return [Step("cpuidle", title, skip_reason=why_not)]
    changes = [Change("file", REQUEST.format(cpu=cpu), host.read(REQUEST.format(cpu=cpu)), wanted) for cpu in cpus]
    return [Step("cpuidle", title, changes)]


def request_text(limit_us: int) -> str:
    """What the request file takes for an exit latency of at most ``limit_us``: "n/a" for 0 (its "0" means
    no constraint at all)."""
    return "n/a" if limit_us == 0 else str(limit_us)


def no_driver_reason(host) -> str | None:
    """Why there is nothing to keep the CPUs out of, or None where a cpuidle driver has states."""
    try:
        driver = host.read(DRIVER)
    except OSError:
        driver = "none"
    if driver in ("", "none"):
        return (f"this machine has no cpuidle driver ({DRIVER}: none; a VM's CPUs idle in the default halt "
                "loop): there is no deep idle state to keep the CPUs out of, nothing is changed")
    return None
