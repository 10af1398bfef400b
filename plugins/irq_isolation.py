"""[irq_isolation]: keep interrupts, and the network stack's queue work, off the latency CPUs.

    [irq_isolation]
    latency_cpus = "1"            # housekeeping_cpus: every other online CPU unless given
    network_queues = true         # RPS/XPS masks too (default)
    irqbalance = "ban"            # "ban" (default), "stop" or "ignore"

One step, in this order:

- irqbalance, if it is installed or running, would move the interrupts back. "ban" writes
  ``IRQBALANCE_BANNED_CPULIST`` into its settings (/etc/default/irqbalance on Debian,
  /etc/sysconfig/irqbalance on RHEL) and restarts it (it reads them only at start); setting
  the list replaces irqbalance's own ban of isolated and nohz_full CPUs, so those are listed
  too, and an ``IRQBALANCE_BANNED_CPUS`` mask (which would win) is commented out. "stop" stops
  the service. Undo puts the file back byte for byte and the service in its previous state.
- every IRQ whose ``smp_affinity_list`` reaches a latency CPU is pointed at the housekeeping
  CPUs it already had (all of them if it had none), and ``default_smp_affinity`` too. An IRQ
  the kernel will not move (a managed interrupt: EIO, or EPERM from Linux 6.12) is left as it
  is and named in the report; it does not fail the step.
- each network queue's ``rps_cpus`` and ``xps_cpus`` lose the latency CPUs (devices listed
  over netlink with pyroute2).
"""

from __future__ import annotations

import errno
import os
import re

from tuned_rl import (Change, CpuListFile, Key, Refused, Step, Table, format_cpu_list, format_cpu_mask, hookimpl,
                     parse_cpu_list, parse_cpu_mask)
from tuned_rl_plugins import cpu_split as split_cpus

DEFAULT_AFFINITY = "/proc/irq/default_smp_affinity"
IRQBALANCE_CONFIGS = {"debian": "/etc/default/irqbalance", "rhel": "/etc/sysconfig/irqbalance"}
IRQBALANCE_BINARIES = ("/usr/sbin/irqbalance", "/sbin/irqbalance", "/usr/bin/irqbalance")
IRQBALANCE_UNIT = "irqbalance.service"

TUNED_RL_PLUGIN_API = "0.2"

TABLE = Table(
    "irq_isolation",
    "Keep interrupts and network queue work off the latency CPUs.",
    {
        **split_cpus.shared_keys("irq_isolation"),
        "network_queues": Key(bool, "Also take the latency CPUs out of each network queue's rps_cpus and xps_cpus "
                                    "(default true)."),
        "irqbalance": Key(str, 'If irqbalance is installed: "ban" the latency CPUs in its settings and restart it '
                               '(default), "stop" it, or "ignore" it.', choices=("ban", "stop", "ignore")),
    },
    phase="interrupts",
)


class IrqAffinity(CpuListFile):
    """An IRQ's ``smp_affinity_list``: a managed IRQ refuses any write, which is not a failure."""

    name = "irq_affinity"

    def write(self, host, change, value):
        try:
            host.write(change.target, value)
        except OSError as err:
            if err.errno in (errno.EIO, errno.EPERM):
                raise Refused(f"the kernel will not move this interrupt ({os.strerror(err.errno)}: a managed "
                              "interrupt, placed by its driver)") from err
            raise


@hookimpl
def tuned_rl_tables():
    return [TABLE]


@hookimpl
def tuned_rl_change_kinds():
    return [IrqAffinity()]


@hookimpl
def tuned_rl_validate(profile, host):
    if profile.get("irq_isolation") is None:
        return None
    return split_cpus.problems(profile, "irq_isolation", host)


@hookimpl
def tuned_rl_plan(profile, host):
    table = profile.get("irq_isolation")
    if table is None:
        return None
    latency, housekeeping = split_cpus.split(table, host)
    step = Step("irq_isolation", f"keep interrupts off CPUs {format_cpu_list(latency)}")
    if table.get("irqbalance", "ban") != "ignore":
        _plan_irqbalance(host, step, table.get("irqbalance", "ban"), latency)
    step.changes += irq_changes(host, latency, housekeeping)
    if table.get("network_queues", True):
        step.changes += queue_changes(host, latency, step.notes)
    return [step]


def irq_changes(host, latency: set[int], housekeeping: set[int]) -> list[Change]:
    """Every IRQ (and the default for new ones) that reaches a latency CPU, pointed at housekeeping CPUs."""
    changes = []
    if host.exists(DEFAULT_AFFINITY):
        current = parse_cpu_mask(host.read(DEFAULT_AFFINITY))
        if current & latency:
            after = (current & housekeeping) or housekeeping
            changes.append(Change("cpumask", DEFAULT_AFFINITY, host.read(DEFAULT_AFFINITY), format_cpu_mask(after)))
    for irq in sorted((int(d.rsplit("/", 1)[1]) for d in host.subdirs("/proc/irq") if d.rsplit("/", 1)[1].isdigit())):
        path = f"/proc/irq/{irq}/smp_affinity_list"
        if not host.exists(path):
            continue
        current = host.read(path)
        cpus = parse_cpu_list(current)
        if cpus & latency:
            changes.append(Change("irq_affinity", path, current, format_cpu_list((cpus & housekeeping) or housekeeping)))
    return changes


def queue_changes(host, latency: set[int], notes: list[str]) -> list[Change]:
    """Each network queue's RPS (receive) and XPS (transmit) mask without the latency CPUs."""
    changes, unreadable = [], []
    for device in host.network_devices():
        base = f"/sys/class/net/{device}/queues"
        if not host.is_dir(base):
            continue
        for queue in host.subdirs(base):
            name = "rps_cpus" if queue.rsplit("/", 1)[1].startswith("rx-") else "xps_cpus"
            path = f"{queue}/{name}"
            if not host.exists(path):
                continue
            try:
                current = host.read(path)
            except OSError:  # xps_cpus of a single-queue device reads ENOENT (or EINVAL)
                unreadable.append(f"{device}/{path.rsplit('/', 2)[1]}")
                continue
            cpus = parse_cpu_mask(current)
            if cpus & latency:
                changes.append(Change("cpumask", path, current, format_cpu_mask(cpus - latency)))
    if unreadable:
        notes.append(f"no XPS map to change (a single-queue device has none): {', '.join(unreadable)}")
    return changes


def _plan_irqbalance(host, step: Step, mode: str, latency: set[int]) -> None:
    config = irqbalance_config_path(host)
    running = irqbalance_running(host)
    installed = running or host.exists(config) or any(host.exists(b) for b in IRQBALANCE_BINARIES)
    if not installed:
        return
    systemd = host.has_systemd()
    if mode == "stop":
        if systemd and host.service_active(IRQBALANCE_UNIT):
            step.changes.append(Change("service", IRQBALANCE_UNIT, "active", "inactive"))
        elif running:
            step.notes.append("irqbalance runs outside systemd: stop it yourself, or it moves interrupts back")
        return
    if not host.is_dir(config.rsplit("/", 1)[0]):
        step.notes.append(f"irqbalance is installed but {config.rsplit('/', 1)[0]} does not exist: ban CPUs "
                          f"{format_cpu_list(latency)} in its settings yourself")
        return
    banned = latency | _kernel_isolated(host)
    before = None
    if host.exists(config):
        try:
            before = {"mode": host.file_mode(config), "text": host.read_bytes(config).decode("utf-8")}
        except UnicodeDecodeError:
            step.notes.append(f"{config} is not UTF-8 text: set IRQBALANCE_BANNED_CPULIST there yourself")
            return
    text = before["text"] if before else ""
    after = {"mode": before["mode"] if before else 0o644, "text": banned_config(text, banned)}
    if after["text"] == text:
        return
    step.changes.append(Change("config_file", config, before, after,
                               follow_up="irqbalance-try-restart" if systemd else None))
    if not systemd and running:
        step.notes.append(f"irqbalance runs outside systemd: restart it yourself to read {config}")


def irqbalance_running(host) -> bool:
    """An irqbalance daemon runs: a root process whose executable is irqbalance's. Not any process
    called irqbalance: a user's process can take that name, and root would then write /etc for it."""
    for process in host.processes():
        if process.comm != "irqbalance" or process.kernel_thread or any(process.uids):
            continue
        if host.process_exe(process.pid) in IRQBALANCE_BINARIES:
            return True
    return False


def irqbalance_config_path(host) -> str:
    """The settings file the distribution's irqbalance unit reads."""
    for path in IRQBALANCE_CONFIGS.values():
        if host.exists(path):
            return path
    if host.exists("/etc/redhat-release") or host.exists("/etc/sysconfig"):
        return IRQBALANCE_CONFIGS["rhel"]
    return IRQBALANCE_CONFIGS["debian"]


BANNED_CPULIST = re.compile(r"^\s*(export\s+)?IRQBALANCE_BANNED_CPULIST=")
BANNED_MASK = re.compile(r"^\s*(export\s+)?IRQBALANCE_BANNED_CPUS=(.*)$")


def banned_config(text: str, banned: set[int]) -> str:
    """``text`` (an irqbalance settings file) banning exactly ``banned``.

    An existing ``IRQBALANCE_BANNED_CPULIST=`` line is replaced in place, else one is
    appended; an ``IRQBALANCE_BANNED_CPUS=`` mask, which irqbalance prefers to the list
    when it is not empty, is commented out. Every other line is kept as it is.
    """
    wanted = f"IRQBALANCE_BANNED_CPULIST={format_cpu_list(banned)}"
    lines, replaced = [], False
    for line in text.splitlines():
        if BANNED_CPULIST.match(line):
            if not replaced:
                lines.append(wanted)
            replaced = True
        elif (mask := BANNED_MASK.match(line)) and mask.group(2).strip().strip("\"'"):
            lines.append(f"# {line}  # tuned-rl: the mask would override IRQBALANCE_BANNED_CPULIST")
        else:
            lines.append(line)
    if not replaced:
        lines += ["# tuned-rl: keep interrupts off the latency CPUs (undone by `tuned-rl rollback`)", wanted]
    return "\n".join(lines) + "\n"


def _kernel_isolated(host) -> set[int]:
    """CPUs irqbalance bans on its own (isolcpus and nohz_full): listing our own replaces that ban."""
    cpus: set[int] = set()
    for path in ("/sys/devices/system/cpu/isolated", "/sys/devices/system/cpu/nohz_full"):
        if host.exists(path):
            text = host.read(path).strip()
            if text and text != "(null)":
                cpus |= parse_cpu_list(text)
    return cpus

