"""`tuned-rl diagnose` on the lab's two seed causes, then `apply` of the profile it wrote, as root.

bench/scenarios/diagnosis.py runs each case: the workload and its trouble started, diagnose with
--write-profile, apply of that profile (verified as always), rollback, and the host compared.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tuned_rl.host import Host
from tuned_rl.measure.probes import BpfProbe

sys.path.insert(0, str(Path(__file__).parent.parent.parent / "bench" / "scenarios"))
import diagnosis  # noqa: E402
from lab import OFFLINE_JOB  # noqa: E402

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or BpfProbe.obstacles(Host(), True) != []
                                or not Path("/sys/fs/cgroup/cpu/cpu.rt_runtime_us").exists(),
                                reason="needs root, a working BPF probe and the v1 cpu hierarchy")


def _says_virtual_machine(result) -> None:
    """This host is a KVM (Firecracker) guest: diagnose must say so, with the steal it measured."""
    vm = next(f for f in result.diagnosis["findings"] if f["cause"] == "virtual-machine")
    assert "KVM" in vm["evidence"][0], vm
    assert any(line.startswith("steal time during the") for line in vm["evidence"]), vm
    assert set(result.diagnosis["machine"]["steal_ms"]) == {str(c) for c in Host().online_cpus()}


def test_diagnose_names_the_offline_jobs_and_its_profile_is_kept_and_lowers_p999(tmp_path):
    result = diagnosis.run_noisy(tmp_path)
    print(result.row())
    holders = result.diagnosis["attribution"]["holders"]
    assert all(OFFLINE_JOB in h.get("cmdline", "") for h in holders[:3]), holders[:4]
    # Most of the worst 1% of waits is theirs: 0.88-0.93 in four runs here (2026-12-04), 0.65 in one
    # CI run whose top three holders were still the jobs (the rest: the host's kernel threads and
    # the test's own processes); 0.8 failed that run.
    assert result.jobs_share_of_tail(OFFLINE_JOB) >= 0.5
    assert result.findings[0] == "offline-jobs"
    step = result.placement_step("offline_eviction")
    assert step["outcome"] == "kept", step["reason"]
    assert step["after"]["p999_us"] < step["before"]["p999_us"]
    assert result.host_restored
    _says_virtual_machine(result)


def test_diagnose_finds_rt_throttling_and_its_profile_is_kept_with_p999_100x_lower(tmp_path):
    result = diagnosis.run_rt(tmp_path)
    print(result.row())
    throttling = next(f for f in result.diagnosis["findings"] if f["cause"] == "rt-throttling")
    assert throttling["table"] == "rt_runtime"
    assert throttling["settings"] == {"cgroup": f"/{diagnosis.RT_CGROUP}", "cgroup_runtime_us": 950000}
    assert any("cpu.rt_runtime_us 500000" in line for line in throttling["evidence"])
    step = result.placement_step("rt_runtime")
    assert step["outcome"] == "kept", step["reason"]
    assert step["after"]["p999_us"] * 100 <= step["before"]["p999_us"]
    assert result.host_restored
    _says_virtual_machine(result)


def test_diagnose_leaves_nothing_running_or_attached(tmp_path):
    """After a diagnose, no BPF program of ours and no canary remain."""
    import subprocess
    before = set(subprocess.run(["bpftool", "prog", "show"], capture_output=True, text=True).stdout.split("\n")) \
        if _has_bpftool() else None
    status = subprocess.run([sys.executable, "-m", "tuned_rl.cli", "diagnose", "--target", "canary", "--seconds", "1",
                             "--json"], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "TUNED_RL_STATE_DIR": str(tmp_path)})
    assert status.returncode == 0, status.stderr
    assert "tuned_rl.measure.canary" not in subprocess.run(["ps", "-eo", "args"], capture_output=True,
                                                           text=True).stdout
    if before is not None:
        after = set(subprocess.run(["bpftool", "prog", "show"], capture_output=True, text=True).stdout.split("\n"))
        assert not [line for line in after - before if "raw_tracepoint" in line]


def _has_bpftool() -> bool:
    import shutil
    return shutil.which("bpftool") is not None
