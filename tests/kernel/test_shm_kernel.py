"""[numa] shm on this host's node 0: a workload's shared-memory segment bound, shown, and its policy put back."""


from __future__ import annotations
import json
import os
import subprocess
import sys

import pytest

from tuned_rl.host import Host
from tuned_rl.host.shared_memory import read_policy

from helpers import run_cli

# The workload: makes the segment, maps it shared, touches every page, and waits.
WORKLOAD = """
import mmap, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
os.ftruncate(fd, 8 << 20)
segment = mmap.mmap(fd, 8 << 20)
segment[:] = b"x" * (8 << 20)
print("ready", flush=True)
time.sleep(120)
"""


def mapping_policy(pid: int, path: str) -> str:
    """The policy the workload's own mapping of the segment shows in its numa_maps."""
    [line] = [line for line in open(f"/proc/{pid}/numa_maps") if f"file={path}" in line.split()]
    return line.split()[1]


@pytest.fixture
def workload():
    if os.geteuid() != 0:
        pytest.skip("needs root (mbind with MPOL_MF_MOVE_ALL)")
    path = f"/dev/shm/tuned-rl-test-{os.getpid()}"
    process = subprocess.Popen([sys.executable, "-c", WORKLOAD, path], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "ready"
        yield process, path
    finally:
        process.kill()
        process.wait()
        os.unlink(path)


@pytest.mark.parametrize("previous", ["default", "interleave:0"])
def test_the_segment_reads_bind_0_in_the_workloads_numa_maps_and_its_previous_policy_after_rollback(
        workload, previous, profile_file, state_dir):
    process, path = workload
    if previous != "default":
        Host().set_segment_policy(path, previous, read_policy(path).inode)
    assert mapping_policy(process.pid, path) == previous
    profile = profile_file(f'[target]\npid = {process.pid}\n\n[numa]\nnode = 0\nrunning = false\n'
                           f'shm = ["/dev/shm/tuned-rl-test-*"]\n')
    code, out, err = run_cli("apply", profile, "--no-verify", "--json", root=None, state_dir=state_dir)
    assert code == 0, err
    [step] = json.loads(out)["steps"]
    [change] = [c for c in step["changes"] if c["target"] == path]
    assert change["before"] == f"{previous} (100% of 2048 pages on node 0)"
    assert change["after"] == "bind:0 (100% of 2048 pages on node 0)"
    assert mapping_policy(process.pid, path) == "bind:0"
    out = run_cli("status", "--json", root=None, state_dir=state_dir)[1]
    [row] = [c for c in json.loads(out)["changes"] if c["target"] == path]
    assert row["state"] == "holds" and row["current"].startswith("bind:0")
    code, _, err = run_cli("rollback", root=None, state_dir=state_dir)
    assert code == 0, err
    assert mapping_policy(process.pid, path) == previous and read_policy(path).policy == previous
