"""PCIe: the bridges above a device, and the NVMe drives and network adapters that share them with a GPU.

sysfs shows the PCI hierarchy as directories: /sys/bus/pci/devices/ADDR links to
/sys/devices/pci0000:97/0000:97:02.0/0000:98:00.0/0000:99:01.0/0000:9b:00.0, each component
below the host bridge (pci0000:97) a PCI function, every one but the last a bridge: a root
port of the CPU, then a PCIe switch's upstream and downstream ports. Two devices whose paths
share a bridge share that bridge's upstream link: a GPU's DMA and an NVMe drive's, or a NIC's
(tensor-parallel traffic, checkpoints, NCCL), contend for it. The class code says what a device
is (include/linux/pci_ids.h: 0x0108 NVM Express, 0x02 network, 0x03 display, 0x0604 PCI bridge).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

ADDRESS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
DEVICES = "/sys/bus/pci/devices"
KINDS = {"0108": "NVMe", "0200": "Ethernet", "0207": "InfiniBand", "0280": "network", "0300": "GPU", "0302": "GPU"}
SHARING_KINDS = ("NVMe", "Ethernet", "InfiniBand", "network")


@dataclass(frozen=True)
class PciDevice:
    address: str
    kind: str          # from the class code: NVMe, Ethernet, InfiniBand, network, GPU, bridge, other
    class_code: str    # "0x010802"
    driver: str        # the bound driver's name, or ""
    path: tuple[str, ...]  # the PCI functions from the root port down to this one

    @property
    def bridges(self) -> tuple[str, ...]:
        return self.path[:-1]


@dataclass(frozen=True)
class Sharing:
    """A device that shares a bridge above the GPU, and the lowest bridge they share."""

    device: PciDevice
    bridge: str
    below_root_port: bool  # the shared bridge is a switch's port (not only the CPU's root port)


def device(host, address: str) -> PciDevice:
    """One PCI function, read below the host's root; LookupError if there is no such device."""
    address = address.lower()
    link = f"{DEVICES}/{address}"
    if not ADDRESS.match(address) or not host.path(link).exists():
        raise LookupError(f"no PCI device {address} on this host ({link})")
    real = os.path.realpath(host.path(link))
    path = tuple(part for part in real.split(os.sep) if ADDRESS.match(part))
    class_code = host.read(f"{link}/class").lower()
    driver = host.path(f"{link}/driver")
    code = class_code[2:6]
    kind = KINDS.get(code) or ("bridge" if code == "0604" else "network" if code.startswith("02") else "other")
    return PciDevice(address, kind, class_code, os.path.basename(os.path.realpath(driver)) if driver.exists() else "",
                     path)


def devices(host) -> list[PciDevice]:
    base = host.path(DEVICES)
    if not base.is_dir():
        return []
    return [device(host, name) for name in sorted(os.listdir(base)) if ADDRESS.match(name)]


def sharing_with(host, gpu_address: str) -> tuple[PciDevice, list[Sharing]]:
    """The GPU, and each NVMe drive and network adapter below a bridge above it (one entry per
    device: a multi-function adapter's or its virtual functions' other functions are not repeated)."""
    gpu = device(host, gpu_address)
    found, seen = [], set()
    for other in devices(host):
        slot = other.address.rsplit(".", 1)[0]
        if other.kind not in SHARING_KINDS or slot in seen:
            continue
        common = 0
        while common < min(len(gpu.bridges), len(other.bridges)) and gpu.bridges[common] == other.bridges[common]:
            common += 1
        if common:
            seen.add(slot)
            found.append(Sharing(other, gpu.bridges[common - 1], common > 1))
    return gpu, found
