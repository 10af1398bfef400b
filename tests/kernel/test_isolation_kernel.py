"""[cpu_isolation] and [irq_isolation] on this 2-CPU host: latency CPU 1, housekeeping CPU 0, then rollback."""


from __future__ import annotations
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import FORKER, forked_child, kill_at, run_cli
from tuned_rl.host import Host, parse_cpu_list

sys.path.insert(0, str(Path(__file__).parent.parent.parent / "bench" / "scenarios"))
from lab import placement, placement_differences  # noqa: E402

CPUSET = Path("/sys/fs/cgroup/cpuset")
MARKER = "tuned-rl-isolation-test-workload"
pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not (CPUSET / "cpuset.cpus").exists()
                                or Host().online_cpus() != {0, 1}, reason="needs root, a v1 cpuset and 2 CPUs")

PROFILE = f"""\
[target]
name = "{MARKER}"

[cpu_isolation]
latency_cpus = "1"

[irq_isolation]
latency_cpus = "1"
"""

def status_field(pid: int, name: str, tid: int | None = None) -> str:
    path = f"/proc/{pid}/task/{tid}/status" if tid else f"/proc/{pid}/status"
    return next(line.split(":", 1)[1].strip() for line in open(path) if line.startswith(name + ":"))


def cpuset_of(pid: int) -> str:
    return next(line.rsplit(":", 1)[1].strip() for line in open(f"/proc/{pid}/cgroup") if line.split(":")[1] == "cpuset")


def on_cpu_1(workload: set[int], existed: dict) -> list[str]:
    """Movable tasks outside the workload, there before the apply, that may still run on CPU 1.

    Not counted: kthreadd, which the kernel keeps in the root cpuset, and tasks started during
    the apply (a parent not yet moved may fork between the plan and its move)."""
    host, found = Host(), []
    for process in host.processes():
        if process.tgid in workload or (process.kernel_thread and process.comm == "kthreadd"):
            continue
        for thread in host.threads(process.pid):
            if f"task {thread.pid} {thread.start_time}" not in existed:
                continue
            if not thread.fixed_affinity and 1 in parse_cpu_list(thread.affinity):
                found.append(f"{thread.pid} ({thread.comm}) {thread.affinity}")
    return found


def test_cpu_1_is_left_to_the_workload_children_stay_off_it_and_rollback_puts_everything_back(tmp_path):
    workload = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", MARKER])
    forker = subprocess.Popen([sys.executable, "-c", FORKER, str(tmp_path / "child")])
    profile = tmp_path / "isolation.toml"
    profile.write_text(PROFILE)
    state = tmp_path / "state"
    try:
        time.sleep(0.5)
        before = placement()
        status, out, err = run_cli("apply", profile, "--no-verify", "--json", root=None, state_dir=state)
        try:
            assert status == 0, err
            steps = {s["plugin"]: s for s in json.loads(out)["steps"]}
            assert steps["cpu_isolation"]["outcome"] == "applied" and steps["irq_isolation"]["outcome"] == "applied"
            refused = {n.split(":")[1].strip() for n in steps["irq_isolation"].get("notes", [])
                       if n.startswith("left as it is")}
            for irq in Path("/proc/irq").glob("*/smp_affinity_list"):
                if str(irq) not in refused:
                    assert parse_cpu_list(irq.read_text()) <= {0}, irq
            assert on_cpu_1({workload.pid}, before) == []
            assert status_field(workload.pid, "Cpus_allowed_list") == "1"
            assert cpuset_of(workload.pid) == "/tuned-rl-workload"
            child = forked_child(forker, tmp_path / "child")  # a moved process forks after the apply
            assert status_field(child, "Cpus_allowed_list") == "0" and cpuset_of(child) == "/tuned-rl-housekeeping"
        finally:
            rollback = run_cli("rollback", "--json", root=None, state_dir=state)
        assert rollback[0] == 0, rollback[2]
        assert placement_differences(before, placement()) == []
        assert cpuset_of(child) == "/"  # it followed its parent back
    finally:
        for process in (workload, forker):
            process.kill()
            process.wait()


@pytest.mark.parametrize("point", ["written:3", "written:25", "journaled:2"])
def test_a_kill_during_isolation_leaves_a_host_that_rollback_puts_back_exactly(tmp_path, point):
    # written:3: the cpusets exist, few tasks moved; written:25: half the tasks moved;
    # journaled:2: every task moved, the interrupts step journaled but not written.
    workload = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", MARKER])
    profile = tmp_path / "isolation.toml"
    profile.write_text(PROFILE)
    try:
        time.sleep(0.5)
        before = placement()
        kill_at(point, "apply", profile, "--no-verify", root=None, state_dir=tmp_path / "state")
        status, _, err = run_cli("rollback", root=None, state_dir=tmp_path / "state")
        assert status == 0, err
        assert placement_differences(before, placement()) == []
        assert not list(CPUSET.glob("tuned-rl-*"))
    finally:
        workload.kill()
        workload.wait()


def as_nobody():
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)


def test_another_users_process_named_like_the_workload_is_not_placed_pinned_or_measured(tmp_path):
    # As a user would meet it: uid 65534 starts a process whose command line holds the workload's name.
    workload = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", MARKER])
    lookalike = subprocess.Popen(["/usr/bin/python3", "-c", "import time; time.sleep(120)", MARKER],
                                 preexec_fn=as_nobody, cwd="/")
    profile = tmp_path / "isolation.toml"
    profile.write_text(f'[target]\nname = "{MARKER}"\n\n[cpu_isolation]\nlatency_cpus = "1"\n\n'
                       '[cpu_isolation.pin]\n"^python" = "1"\n')
    state = tmp_path / "state"
    note = f"not the target: pid {lookalike.pid} (python3) matches [target] name '{MARKER}' but runs as nobody"
    try:
        time.sleep(0.5)
        before = placement()
        status, out, err = run_cli("apply", profile, "--no-verify", "--json", root=None, state_dir=state)
        try:
            assert status == 0, err
            report = json.loads(out)
            assert any(n.startswith(note) for n in report["notes"]), report["notes"]
            moved = {c["target"].split()[1] for s in report["steps"] for c in s["changes"]
                     if c["after"] == "/tuned-rl-workload" or c["target"].endswith("affinity")}
            assert moved == {str(workload.pid)}
            assert cpuset_of(workload.pid) == "/tuned-rl-workload" and status_field(workload.pid, "Cpus_allowed_list") == "1"
            assert cpuset_of(lookalike.pid) == "/tuned-rl-housekeeping"  # off the latency CPU, like any other task
            assert status_field(lookalike.pid, "Cpus_allowed_list") == "0"
            status, out, err = run_cli("measure", "--target", f"name:{MARKER}", "--seconds", "1", "--json",
                                       root=None, state_dir=state)
            assert status == 0, err
            assert any(n.startswith(note) for n in json.loads(out)["notes"])
            from tuned_rl.measure.targets import Target, resolve_tids
            assert resolve_tids(Host(), Target("name", MARKER)) == Host().thread_ids(workload.pid)
        finally:
            rollback = run_cli("rollback", "--json", root=None, state_dir=state)
        assert rollback[0] == 0, rollback[2]
        assert placement_differences(before, placement()) == []
    finally:
        for process in (workload, lookalike):
            process.kill()
            process.wait()
