"""PCIe sharing on a tree laid out as a real two-socket GPU server's PCI hierarchy.

The layout is the one `lspci -tv` shows in NVIDIA/nccl issue #1405 ("NCCL failure caused by NET/IB
completion error", https://github.com/NVIDIA/nccl/issues/1405): an Intel Ice Lake two-socket server
whose PCI segment 0000:97 has root port 97:02.0 leading to a PCIe switch (upstream port 98:00.0,
with a PMC-Sierra management function at 98:00.1, downstream ports 99:00.0-99:04.0) holding a
Mellanox ConnectX-6 Dx (9a:00.0-00.3: two ports and two virtual functions) and four NVIDIA A100
PCIe 80GB (9b:00.0-9e:00.0). That excerpt shows no drive, so two NVMe drives are added here, each
marked: one on a fifth downstream port of that switch (99:05.0 -> 9f:00.0), one on a root port of
the other segment the report lists (0000:30, whose devices its excerpt does not show: 30:02.0 -> 31:00.0).
"""

from __future__ import annotations
import json
import os
from pathlib import Path

from tuned_rl.diagnose.run import replay
from tuned_rl.host.pci import sharing_with

BRIDGE, NIC, GPU, NVME, OTHER = "0x060400", "0x020000", "0x030200", "0x010802", "0x058000"
LAYOUT = [  # (the path below /sys/devices, class, driver)
    ("pci0000:97/0000:97:02.0", BRIDGE, "pcieport"),
    ("pci0000:97/0000:97:02.0/0000:98:00.0", BRIDGE, "pcieport"),
    ("pci0000:97/0000:97:02.0/0000:98:00.1", OTHER, "switchtec"),
    *[(f"pci0000:97/0000:97:02.0/0000:98:00.0/0000:99:0{port}.0", BRIDGE, "pcieport") for port in range(6)],
    *[(f"pci0000:97/0000:97:02.0/0000:98:00.0/0000:99:00.0/0000:9a:00.{fn}", NIC, "mlx5_core") for fn in range(4)],
    *[(f"pci0000:97/0000:97:02.0/0000:98:00.0/0000:99:0{port}.0/0000:{bus}:00.0", GPU, "nvidia")
      for port, bus in ((1, "9b"), (2, "9c"), (3, "9d"), (4, "9e"))],
    ("pci0000:97/0000:97:02.0/0000:98:00.0/0000:99:05.0/0000:9f:00.0", NVME, "nvme"),  # added
    ("pci0000:30/0000:30:02.0", BRIDGE, "pcieport"),  # added
    ("pci0000:30/0000:30:02.0/0000:31:00.0", NVME, "nvme"),  # added
]


def build(tree) -> None:
    for path, class_code, driver in LAYOUT:
        directory = tree.root / "sys/devices" / path
        directory.mkdir(parents=True)
        (directory / "class").write_text(class_code + "\n")
        drivers = tree.root / "sys/bus/pci/drivers" / driver
        drivers.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(drivers, directory), directory / "driver")
        links = tree.root / "sys/bus/pci/devices"
        links.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(directory, links), links / Path(path).name)


def test_the_nic_and_the_drive_under_the_gpus_switch_are_found_and_the_drive_elsewhere_is_not(tree):
    build(tree)
    gpu, shared = sharing_with(tree.host, "0000:9b:00.0")
    assert gpu.kind == "GPU" and gpu.path == ("0000:97:02.0", "0000:98:00.0", "0000:99:01.0", "0000:9b:00.0")
    assert [(s.device.address, s.device.kind, s.device.driver, s.bridge, s.below_root_port) for s in shared] == [
        ("0000:9a:00.0", "Ethernet", "mlx5_core", "0000:98:00.0", True),  # its other functions: one entry
        ("0000:9f:00.0", "NVMe", "nvme", "0000:98:00.0", True)]            # not 31:00.0, under another root


def test_diagnose_gpu_makes_it_a_finding_with_the_paths_and_what_to_do(tree):
    from tuned_rl.diagnose.facts import pcie_sharing
    build(tree)
    tree.set("/proc/driver/nvidia/gpus/0000:9c:00.0/information", "Model: A100\nDevice Minor: 1\n")
    pcie = pcie_sharing(tree.host, "nvidia1")  # by the driver's name: 9c:00.0
    assert pcie["gpu"] == "0000:9c:00.0" and [s["address"] for s in pcie["shared"]] == ["0000:9a:00.0",
                                                                                           "0000:9f:00.0"]
    recording = json.loads((Path(__file__).parent / "data" / "diagnose_noisy.json").read_text())
    result = replay({**recording, "pcie": pcie}).to_dict()
    [finding] = [f for f in result["findings"] if f["cause"] == "pcie-sharing"]
    assert finding["summary"] == "the GPU 0000:9c:00.0 shares its PCIe uplink with Ethernet, NVMe (2 device(s))"
    assert finding["evidence"] == [
        "the GPU 0000:9c:00.0: 0000:97:02.0 -> 0000:98:00.0 -> 0000:99:02.0 -> 0000:9c:00.0 (root port first)",
        "Ethernet 0000:9a:00.0 (mlx5_core) shares PCIe switch port 0000:98:00.0: "
        "0000:97:02.0 -> 0000:98:00.0 -> 0000:99:00.0 -> 0000:9a:00.0",
        "NVMe 0000:9f:00.0 (nvme) shares PCIe switch port 0000:98:00.0: "
        "0000:97:02.0 -> 0000:98:00.0 -> 0000:99:05.0 -> 0000:9f:00.0"]
    assert finding["table"] is None and "move the NVMe and NIC traffic" in finding["advice"]
    assert "or accept the contention" in finding["advice"]
    assert result["pcie"] == pcie


def test_a_gpu_alone_under_its_root_port_is_no_finding(tree):
    build(tree)
    tree.host.path("/sys/devices/pci0000:30/0000:30:02.0/0000:31:00.0/class").write_text(GPU + "\n")
    gpu, shared = sharing_with(tree.host, "0000:31:00.0")
    assert gpu.kind == "GPU" and shared == []
    recording = json.loads((Path(__file__).parent / "data" / "diagnose_noisy.json").read_text())
    findings = replay({**recording, "pcie": {"gpu": gpu.address, "path": list(gpu.path), "shared": []}}).findings
    assert not [f for f in findings if f.cause == "pcie-sharing"]
