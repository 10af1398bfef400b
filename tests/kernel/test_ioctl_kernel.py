"""The ioctl timer on this kernel: `tuned-rl measure --ioctl tty_ioctl` against a pty workload's own clock."""


from __future__ import annotations
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import run_cli
from tuned_rl.host import Host
from tuned_rl.measure.probes.ioctl import IoctlTimer

WORKLOAD = Path(__file__).parents[2] / "bench" / "scenarios" / "pty_workload.py"
CALLS = 60


def start_workload(tmp_path, calls: int, start_file: bool):
    ready, start = tmp_path / "ready", tmp_path / "start"
    process = subprocess.Popen([sys.executable, str(WORKLOAD), "--calls", str(calls), "--reader-delay-ms", "1",
                                "--ready-file", str(ready), *(["--start-file", str(start)] if start_file else [])],
                               stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 10
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return process, int(ready.read_text().split()[0]), start


@pytest.fixture
def workloads(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root (BPF)")
    started = []
    yield lambda calls, start_file: started.append(start_workload(tmp_path, calls, start_file)) or started[-1]
    for process, _, _ in started:
        process.kill()
        process.wait()


def test_the_timer_counts_each_of_the_workloads_ioctls_and_agrees_with_its_own_clock_within_15_percent(workloads):
    process, pid, start = workloads(CALLS, True)
    timer = IoctlTimer(Host(), "tty_ioctl")
    timer.start(Host().thread_ids(pid))
    try:
        start.touch()  # the workload's first call comes after the timer is in the kernel
        own = json.loads(process.communicate(timeout=30)[0])
        timed = timer.times().to_dict()
    finally:
        timer.stop()
    assert timed["calls"] == own["ioctls"] == CALLS and timed["lost"] == 0
    assert abs(timed["mean_us"] - own["mean_us"]) <= 0.15 * own["mean_us"], (timed, own)
    assert own["mean_us"] > 500  # each call waited behind the writer: milliseconds, not a call's microseconds


def test_measure_ioctl_prints_the_timed_calls_beside_the_latency(workloads, state_dir):
    process, pid, _ = workloads(100000, False)
    code, out, err = run_cli("measure", "--target", f"pid:{pid}", "--seconds", "3", "--ioctl", "tty_ioctl", "--json",
                             root=None, state_dir=state_dir)
    process.terminate()
    own = json.loads(process.communicate(timeout=30)[0])
    assert code == 0, err
    result = json.loads(out)
    timed = result["ioctl"]
    assert result["n"] > 0 and timed["function"] == "tty_ioctl" and timed["how"] in ("kprobe", "syscall")
    assert timed["calls"] > 100 and abs(timed["mean_us"] - own["mean_us"]) <= 0.15 * own["mean_us"], (timed, own)
    assert any(note.startswith("ioctl timer: tty_ioctl") for note in result["notes"])
    table = run_cli("measure", "--target", f"pid:{os.getpid()}", "--seconds", "1", "--ioctl", "no_such_function",
                    root=None, state_dir=state_dir)
    assert table[0] == 1 and "no_such_function is not a function of this kernel" in table[2]
