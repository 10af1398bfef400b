"""bench/gpu_node_check.sh on this GPU-less VM: it says why it skips and exits 0; given a GPU it lists, it runs each check."""


from __future__ import annotations
import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "bench" / "gpu_node_check.sh"


def run(env=None):
    return subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


@pytest.mark.skipif(os.path.isdir("/proc/driver/nvidia/gpus"), reason="this host has an NVIDIA GPU")
def test_without_a_gpu_it_says_so_and_exits_0():
    result = run({"PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("gpu check") and "no GPU on this host" in result.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="the checks need root")
def test_a_gpu_nvidia_smi_lists_is_checked_one_line_each(tmp_path):
    # A stand-in nvidia-smi lists a PCI device this VM has (its firmware gives no NUMA node) as the GPU.
    address = sorted(os.listdir("/sys/bus/pci/devices"))[0] if os.path.isdir("/sys/bus/pci/devices") else None
    if address is None:
        pytest.skip("no PCI device to stand in for a GPU")
    fake = tmp_path / "nvidia-smi"
    fake.write_text(f'#!/bin/sh\n[ "$1" = "--query-gpu=pci.bus_id" ] && echo "0000{address.upper()}"\n'
                    '[ "$1" = dmon ] && sleep 20\nexit 0\n')
    fake.chmod(0o755)
    result = run({"PATH": f"{tmp_path}:{os.environ['PATH']}"})
    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["doctor", "diagnose", "exec", "dry", "ioctl"], result.stdout
    assert lines[0].startswith("doctor") and "probe auto = " in lines[0]
    node = Path(f"/sys/bus/pci/devices/{address}/numa_node").read_text().strip()
    if node == "-1":
        assert "skipped: the firmware gives it no NUMA node" in lines[1]
    # Without the nvidia module, the ioctl timer says nvidia_ioctl is absent, and the run fails.
    assert "nvidia_ioctl is not a function of this kernel" in lines[4] and result.returncode == 1
