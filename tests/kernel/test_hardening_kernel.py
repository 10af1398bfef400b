"""Root runs on the live host: a hostile working directory, planted records, and kills that leave nothing behind."""


from __future__ import annotations
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import run_cli, spawn_cli

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")

TRACING = Path("/sys/kernel/tracing")
TUNED_RL = Path(sys.executable).parent / "tuned-rl"  # the console script, as a user runs it


def hostile_directory(tmp_path: Path) -> tuple[Path, Path]:
    """A directory holding a fake tuned_rl package whose every module writes a marker file."""
    marker = tmp_path / "hijacked"
    work = tmp_path / "work"
    code = f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\n"
    for module in ("tuned_rl/__init__.py", "tuned_rl/canary.py", "tuned_rl/measure/__init__.py",
                   "tuned_rl/measure/canary.py", "tuned_rl/measure/canary_main.py"):
        (work / module).parent.mkdir(parents=True, exist_ok=True)
        (work / module).write_text(code)
    return work, marker


def test_a_hostile_tuned_rl_in_the_working_directory_is_never_run(tmp_path):
    work, marker = hostile_directory(tmp_path)
    result = subprocess.run([str(TUNED_RL), "measure", "--target", "canary", "--seconds", "1", "--json"], cwd=work,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["n"] > 500  # the real canary ran and woke
    assert not marker.exists()
    # The hole this closes: the same start without -I, from that directory, runs the planted file.
    subprocess.run([sys.executable, "-m", "tuned_rl.measure.canary_main"], cwd=work, input="", text=True, timeout=30,
                   capture_output=True)
    assert marker.exists()


def instances() -> set[str]:
    return {p.name for p in (TRACING / "instances").iterdir() if p.name.startswith("tuned-rl-")}


def wait_for(condition, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.05)


@pytest.mark.skipif(not (TRACING / "instances").is_dir(), reason="needs tracefs")
@pytest.mark.parametrize("cleaner", [["rollback", "--json"], ["measure", "--target", "canary", "--seconds", "1",
                                                                "--probe", "bpf", "--json"]])
def test_after_a_kill_mid_measurement_the_next_run_removes_the_trace_instance(cleaner, profile_file, state_dir):
    swappiness = Path("/proc/sys/vm/swappiness").read_text().strip()
    profile = profile_file(f'[target]\ncanary = true\n[verify]\nprobe = "tracefs"\n'
                           f'[sysctl]\n"vm.swappiness" = {int(swappiness) + 1}\n')
    process = spawn_cli("apply", profile, "--json", root=None, state_dir=state_dir)
    name = f"tuned-rl-{process.pid}"
    try:
        wait_for(lambda: name in instances())
        time.sleep(0.5)  # recording
    finally:
        process.kill()
        process.wait()
        process.stdout.close()
        process.stderr.close()
    assert name in instances()  # left recording by the killed run
    status, out, err = run_cli(*cleaner, root=None, state_dir=state_dir)
    assert status == 0, err
    assert name not in instances()
    if cleaner[0] == "rollback":
        assert json.loads(out)["removed"] == [f"{TRACING}/instances/{name}"]
    else:
        assert any(name in note for note in json.loads(out)["notes"])
    assert Path("/proc/sys/vm/swappiness").read_text().strip() == swappiness


def canaries_of(parent: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if b"tuned_rl.measure.canary_main" in cmdline and str(parent).encode() in cmdline:
            found.append(int(entry.name))
    return found


def test_a_fifo_canary_with_work_to_do_dies_with_a_killed_apply(profile_file, state_dir):
    # On CPU 1 at SCHED_FIFO 50, always busy (5 ms of work every 1 ms): its main thread, which would
    # notice the agent's death by reading stdin, never runs; only the kernel can end it.
    swappiness = Path("/proc/sys/vm/swappiness").read_text().strip()
    profile = profile_file('[target]\ncanary = true\ncanary_cpus = "1"\ncanary_policy = "SCHED_FIFO"\n'
                           'canary_priority = 50\ncanary_work_us = 5000\n'
                           f'[sysctl]\n"vm.swappiness" = {int(swappiness) + 1}\n')
    process = spawn_cli("apply", profile, "--json", root=None, state_dir=state_dir)
    try:
        wait_for(lambda: canaries_of(process.pid))
        canary = canaries_of(process.pid)[0]
        time.sleep(1.0)
        assert os.sched_getscheduler(canary) == os.SCHED_FIFO
    finally:
        process.kill()
        process.wait()  # not communicate(): a surviving canary holds the inherited stderr open
        process.stdout.close()
        process.stderr.close()
    time.sleep(1.0)
    survivors = canaries_of(process.pid)
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    assert survivors == []
    assert Path("/proc/sys/vm/swappiness").read_text().strip() == swappiness  # killed before the step


def test_a_planted_record_naming_a_file_in_etc_is_refused_and_the_file_untouched(profile_file, state_dir):
    stand_in = Path(f"/etc/tuned-rl-test-shadow-{os.getpid()}")
    stand_in.write_text("root:$6$secret:::\n")
    try:
        journal = state_dir / "journal"
        journal.mkdir(parents=True)
        os.chmod(state_dir, 0o700)
        os.chmod(journal, 0o700)
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        header = {"format": 2, "seq": 1, "boot_id": boot, "plugin": "x", "step": "x", "step_index": 0, "host_root": "/"}
        change = {"kind": "config_file", "target": str(stand_in), "before": {"mode": 0o644, "text": "root::::\n"},
                  "after": {"mode": 0o644, "text": "root:$6$secret:::\n"}}
        (journal / "000001.jsonl").write_text(json.dumps(header) + "\n" + json.dumps({"change": change}) + "\n")
        status, out, _ = run_cli("rollback", "--json", root=None, state_dir=state_dir)
        report = json.loads(out)
        assert status == 1 and f"{stand_in} is outside the places tuned-rl writes" in report["refused"][0]["reason"]
        assert stand_in.read_text() == "root:$6$secret:::\n"
    finally:
        stand_in.unlink()
