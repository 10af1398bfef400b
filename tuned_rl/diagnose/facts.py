"""What diagnose reads of the host besides the probe: the machine (virtual or not, its topology),
steal time, interrupts raised between two readings, the target's threads and their RT budgets, where the target's memory
is. Everything through the host object, so a test reads a tree.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from tuned_rl.host import Host
from tuned_rl.host.cpus import parse_cpu_list
from tuned_rl.host.tasks import TaskGone
from tuned_rl.host.numa import page_shares, topology
from tuned_rl.measure.holder_lookup import cpu_cgroup

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass
class Machine:
    """Whether this is a virtual machine, by what evidence, and the topology it shows."""

    virtual: bool
    hypervisor: str = ""          # "KVM", "Xen", "Hyper-V", "VMware", ... ("" if unknown)
    product: str = ""             # "Firecracker", a DMI product name, ...
    evidence: list[str] = field(default_factory=list)
    cpus: int = 0
    nodes: int = 1
    sockets: int = 1
    cores_per_socket: int = 0
    threads_per_core: int = 1

    def to_dict(self) -> dict:
        return dict(vars(self))


def machine(host: Host) -> Machine:
    evidence = []
    cpuinfo = host.read("/proc/cpuinfo") if host.exists("/proc/cpuinfo") else ""
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), [])
    virtual = "hypervisor" in flags
    if virtual:
        evidence.append("the CPU flags include 'hypervisor' (/proc/cpuinfo)")
    hypervisor = product = ""
    if host.exists("/sys/hypervisor/type"):
        hypervisor = host.read("/sys/hypervisor/type").strip().capitalize()
        evidence.append(f"/sys/hypervisor/type says {hypervisor}")
        virtual = True
    clocks = host.read("/sys/devices/system/clocksource/clocksource0/available_clocksource").split() \
        if host.exists("/sys/devices/system/clocksource/clocksource0/available_clocksource") else []
    for clock, name in (("kvm-clock", "KVM"), ("hyperv_clocksource_tsc_page", "Hyper-V"), ("xen", "Xen")):
        if clock in clocks:
            hypervisor = hypervisor or name
            evidence.append(f"the {clock} clock source is offered (/sys/devices/system/clocksource)")
            virtual = True
    dmi = {key: host.read(f"/sys/class/dmi/id/{key}").strip() for key in ("sys_vendor", "product_name")
           if host.exists(f"/sys/class/dmi/id/{key}")}
    if dmi:
        product = " ".join(v for v in (dmi.get("sys_vendor"), dmi.get("product_name")) if v)
        evidence.append(f"DMI: {product}")
        for word, name in (("VMware", "VMware"), ("QEMU", "KVM"), ("Microsoft", "Hyper-V"), ("Xen", "Xen"),
                           ("Amazon EC2", "KVM"), ("Google", "KVM")):
            if word.lower() in product.lower():
                hypervisor, virtual = hypervisor or name, True
    platform_devices = [d.rsplit("/", 1)[-1] for d in host.subdirs("/sys/bus/platform/devices")] \
        if host.is_dir("/sys/bus/platform/devices") else []
    if any(d.startswith("AMZNC10C") for d in platform_devices) and not dmi:
        product = "Firecracker"
        evidence.append("no DMI tables, and Firecracker's VM generation ID device AMZNC10C "
                        "(/sys/bus/platform/devices)")
    cpus = sorted(host.online_cpus())
    packages, cores = set(), set()
    for cpu in cpus:
        base = f"/sys/devices/system/cpu/cpu{cpu}/topology"
        if host.exists(f"{base}/physical_package_id"):
            package = host.read(f"{base}/physical_package_id").strip()
            packages.add(package)
            cores.add((package, host.read(f"{base}/core_id").strip()))
    sockets = max(len(packages), 1)
    return Machine(virtual, hypervisor, product, evidence, len(cpus), len(topology(host).nodes), sockets,
                   max(len(cores) // sockets, 1), max(len(cpus) // max(len(cores), 1), 1))


def steal_ms(host: Host) -> dict[int, float]:
    """Per CPU, the steal time /proc/stat has counted since boot (ms)."""
    found = {}
    for line in host.read("/proc/stat").splitlines():
        fields = line.split()
        if fields and fields[0].startswith("cpu") and fields[0] != "cpu" and len(fields) > 8:
            found[int(fields[0][3:])] = int(fields[8]) * 1000 / CLOCK_TICKS
    return found


def interrupts_between(before: dict, after: dict, cpus: set[int]) -> list[dict]:
    """Interrupts each line raised on ``cpus`` between two readings, most first."""
    rows = []
    for label, (name, counts) in after.items():
        old = before.get(label, (name, [0] * len(counts)))[1]
        raised = {cpu: counts[cpu] - (old[cpu] if cpu < len(old) else 0) for cpu in cpus if cpu < len(counts)}
        total = sum(raised.values())
        if total > 0:
            rows.append({"irq": label, "name": (name.split()[-1] if label.isdigit() else name) if name else "",
                         "count": total,
                         "per_cpu": {str(c): n for c, n in sorted(raised.items())},
                         "movable": label.isdigit()})
    return sorted(rows, key=lambda r: -r["count"])


@dataclass
class TargetThread:
    tid: int
    pid: int
    comm: str
    policy: str
    priority: int
    cpu_cgroup: str       # in the v1 cpu hierarchy ("" without one)
    affinity: str


def target_threads(host: Host, tids: set[int]) -> list[TargetThread]:
    found = []
    for tid in sorted(tids):
        try:
            info = host.process(tid)
        except TaskGone:
            continue
        found.append(TargetThread(tid, info.tgid, info.comm, info.policy, info.priority, cpu_cgroup(info.cgroups),
                                  info.affinity))
    return found


@dataclass
class RtBudget:
    cgroup: str            # relative to the v1 cpu hierarchy, "/" for its root
    directory: str
    runtime_us: int
    period_us: int
    global_runtime_us: int
    global_period_us: int


def rt_budget(host: Host, cgroup: str) -> RtBudget | None:
    """The RT budget of a v1 cpu cgroup (None without a v1 cpu hierarchy or RT group scheduling)."""
    mount = host.cgroup_v1_mount("cpu")
    if mount is None:
        return None
    directory = mount.rstrip("/") + (cgroup if cgroup != "/" else "")
    if not host.exists(f"{directory}/cpu.rt_runtime_us"):
        return None
    return RtBudget(cgroup or "/", directory, int(host.read(f"{directory}/cpu.rt_runtime_us")),
                    int(host.read(f"{directory}/cpu.rt_period_us")),
                    int(host.read("/proc/sys/kernel/sched_rt_runtime_us")),
                    int(host.read("/proc/sys/kernel/sched_rt_period_us")))


def memory_placement(host: Host, pids: set[int]) -> dict[int, dict]:
    """Per target process: its resident pages per node and the nodes of the CPUs it may use."""
    nodes = topology(host)
    found = {}
    for pid in sorted(pids):
        try:
            pages = page_shares(host, pid)
            affinity = parse_cpu_list(host.process(pid).affinity)
        except (OSError, TaskGone):
            continue
        cpu_nodes = sorted(n for n, cpus in nodes.cpus.items() if cpus & affinity)
        found[pid] = {"pages": pages, "cpu_nodes": cpu_nodes}
    return found


def pcie_sharing(host: Host, gpu: str) -> dict:
    """The GPU's PCI path and each NVMe drive and network adapter under a bridge above it (JSON-ready)."""
    from tuned_rl.host.numa import gpu_address
    from tuned_rl.host.pci import sharing_with
    try:
        found, shared = sharing_with(host, gpu_address(host, gpu))
    except (LookupError, ValueError, OSError) as err:  # NumaError is a ValueError
        return {"gpu": gpu, "path": [], "shared": [], "unreadable": str(err)}
    return {"gpu": found.address, "path": list(found.path),
            "shared": [{"address": s.device.address, "kind": s.device.kind, "driver": s.device.driver,
                        "bridge": s.bridge, "switch": s.below_root_port, "path": list(s.device.path)}
                       for s in shared]}
