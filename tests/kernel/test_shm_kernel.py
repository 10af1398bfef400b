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


def test_a_bind_maps_every_resident_page_for_the_move_and_allocates_none_in_the_holes():
    """mbind(MPOL_MF_MOVE_ALL) moves only the pages present in the caller's own mapping, and a fresh
    mapping has none: no page of a segment moved. set_policy now maps each page mincore says is in
    memory first. On a sparse segment (1 MiB written of 64 MiB) the resident pages are exactly the
    written ones, the bind allocates nothing in the holes, and the data reads back. (Where pages go
    needs two nodes: on this host's one, the moves are to node 0, where they are.)"""
    import mmap
    from tuned_rl.host.shared_memory import _Mapping, resident_page_indexes, set_policy
    if os.geteuid() != 0:
        pytest.skip("needs root (mbind with MPOL_MF_MOVE_ALL)")
    path = f"/dev/shm/tuned-rl-test-sparse-{os.getpid()}"
    page = os.sysconf("SC_PAGE_SIZE")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, 64 << 20)
        with mmap.mmap(fd, 64 << 20) as writer:
            for index in range(0, 256):  # 1 MiB: the first 256 pages, every other one
                writer[index * 2 * page] = 0x5A
        written = [index * 2 for index in range(256)]
        mapping = _Mapping(path)
        try:
            assert resident_page_indexes(mapping) == written
        finally:
            mapping.close()
        blocks = os.fstat(fd).st_blocks
        set_policy(path, "bind:0", os.fstat(fd).st_ino)
        assert os.fstat(fd).st_blocks == blocks, "the bind allocated pages in the segment's holes"
        assert read_policy(path).policy == "bind:0"
        with mmap.mmap(fd, 64 << 20, prot=mmap.PROT_READ) as reader:
            assert all(reader[index * page] == 0x5A for index in written)
    finally:
        os.close(fd)
        os.unlink(path)


@pytest.mark.skipif(len([n for n in os.listdir("/sys/devices/system/node") if n.startswith("node")]) < 2,
                    reason="needs two NUMA nodes to show resident pages moving: this host has one")
def test_on_two_nodes_a_bind_moves_the_segments_resident_pages_to_the_node(workload):
    process, path = workload
    set_policy_path = path
    from tuned_rl.host.shared_memory import set_policy
    set_policy(set_policy_path, "bind:1", os.stat(path).st_ino)
    [line] = [line for line in open(f"/proc/{process.pid}/numa_maps") if f"file={path}" in line.split()]
    counts = {f.split("=")[0]: int(f.split("=")[1]) for f in line.split() if f.startswith("N")}
    assert set(counts) == {"N1"}, line
