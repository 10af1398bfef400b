"""NUMA: the host's nodes and their CPUs, a GPU's node, where a process's pages are, and the two
system calls that bind memory (set_mempolicy) and move it (migrate_pages), which the standard
library lacks.

Topology and page placement are read below the host's root (tests use a tree with two
nodes); the system calls act on the live kernel.
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass

from tuned_rl.host.cpus import parse_cpu_list
from tuned_rl.host.syscalls import syscall

MPOL_BIND = 2  # include/uapi/linux/mempolicy.h
PCI_ADDRESS = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
NVIDIA_NAME = re.compile(r"^nvidia(\d+)$")


class NumaError(ValueError):
    """A node or GPU that cannot be used, with why."""


@dataclass(frozen=True)
class Topology:
    """The online NUMA nodes and each one's CPUs."""

    cpus: dict[int, set[int]]  # node -> CPUs

    @property
    def nodes(self) -> list[int]:
        return sorted(self.cpus)

    def node_cpus(self, node: int) -> set[int]:
        if node not in self.cpus:
            raise NumaError(f"node {node} is not an online NUMA node of this host (nodes: "
                            f"{', '.join(map(str, self.nodes)) or 'none'})")
        if not self.cpus[node]:
            raise NumaError(f"node {node} has memory but no CPUs: bind to a node with CPUs")
        return self.cpus[node]


def topology(host) -> Topology:
    base = "/sys/devices/system/node"
    online = parse_cpu_list(host.read(f"{base}/online")) if host.exists(f"{base}/online") else {0}
    cpus = {}
    for node in sorted(online):
        path = f"{base}/node{node}/cpulist"
        text = host.read(path) if host.exists(path) else ""
        cpus[node] = parse_cpu_list(text) if text.strip() else set()
    return Topology(cpus)


def gpu_address(host, gpu: str) -> str:
    """The PCI address of a GPU named by PCI address ("0000:3b:00.0") or "nvidiaN" (NumaError if unknown)."""
    match = NVIDIA_NAME.match(gpu)
    return _nvidia_address(host, int(match.group(1))) if match else gpu


def gpu_node(host, gpu: str) -> int:
    """The NUMA node of a GPU named by PCI address ("0000:3b:00.0") or "nvidiaN"."""
    address = gpu_address(host, gpu)
    if not PCI_ADDRESS.match(address):
        raise NumaError(f"gpu {gpu!r}: name a PCI address such as \"0000:3b:00.0\" or an NVIDIA device such as "
                        "\"nvidia0\"")
    path = f"/sys/bus/pci/devices/{address.lower()}/numa_node"
    if not host.exists(path):
        raise NumaError(f"gpu {gpu!r}: no PCI device {address} on this host ({path})")
    node = int(host.read(path))
    if node < 0:
        raise NumaError(f"gpu {gpu!r}: the firmware does not say which NUMA node {address} is on ({path} reads -1); "
                        "name the node instead (node = N)")
    return node


def _nvidia_address(host, minor: int) -> str:
    base = "/proc/driver/nvidia/gpus"
    if not host.is_dir(base):
        raise NumaError(f"nvidia{minor}: the NVIDIA driver is not loaded ({base} is missing): name the PCI address")
    for directory in host.subdirs(base):
        info = f"{directory}/information"
        if not host.exists(info):
            continue
        fields = dict(line.split(":", 1) for line in host.read(info).splitlines() if ":" in line)
        if fields.get("Device Minor", "").strip() == str(minor):
            return directory.rsplit("/", 1)[1]
    raise NumaError(f"nvidia{minor}: no GPU with that device minor in {base}")


def node_of(host, table: dict) -> int:
    """The node a [numa] table names: ``node``, or the node of its ``gpu``."""
    return gpu_node(host, table["gpu"]) if "gpu" in table else int(table["node"])


def page_shares(host, pid: int) -> dict[int, int]:
    """Resident pages of a process per node, from /proc/PID/numa_maps ("N1=123" fields)."""
    pages: dict[int, int] = {}
    for line in host.read(f"/proc/{pid}/numa_maps").splitlines():
        for field in line.split()[2:]:
            if field.startswith("N") and "=" in field:
                node, count = field[1:].split("=", 1)
                if node.isdigit() and count.isdigit():
                    pages[int(node)] = pages.get(int(node), 0) + int(count)
    return pages


def node_mask(nodes, words: int | None = None) -> tuple[ctypes.Array, int]:
    """A nodemask for the system calls (``words`` longs, or as few as hold ``nodes``), and the
    maxnode to pass with it: the kernel reads maxnode - 1 bits (mm/mempolicy.c get_nodes)."""
    bits = 8 * ctypes.sizeof(ctypes.c_ulong)
    words = words or max(nodes) // bits + 1
    mask = (ctypes.c_ulong * words)()
    for node in nodes:
        mask[node // bits] |= 1 << (node % bits)
    return mask, words * bits + 1


def bind_memory(nodes) -> None:
    """set_mempolicy(MPOL_BIND, nodes) for the calling thread: later allocations come from ``nodes``."""
    mask, maxnode = node_mask(nodes)
    syscall("set_mempolicy", MPOL_BIND, mask, maxnode)


def migrate_pages(pid: int, old_nodes, new_nodes) -> int:
    """Move ``pid``'s pages from ``old_nodes`` to ``new_nodes``; returns how many could not be moved."""
    words = max(max(old_nodes), max(new_nodes)) // (8 * ctypes.sizeof(ctypes.c_ulong)) + 1
    old, maxnode = node_mask(old_nodes, words)
    new, _ = node_mask(new_nodes, words)
    return syscall("migrate_pages", pid, maxnode, old, new)
