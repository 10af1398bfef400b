"""Migrations on this kernel: diagnose names the target's threads that move between CPUs, the profile it
writes pins them, apply keeps the step, and the threads stop moving."""


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
from tuned_rl.measure.probes.migrations import MigrationProbe

try:
    import tomllib
except ModuleNotFoundError:
    import tomli as tomllib

SCENARIOS = Path(__file__).parents[2] / "bench" / "scenarios"
# A CPU hog that wanders: its own affinity flips between CPU 0 and 1 every 20 ms, pushing the
# workload's threads from one CPU to the other as it comes. At nice -10 (9.3x a nice-0 thread's
# weight) it takes the CPU it lands on: a stream there waits behind it or is moved away. At nice 0
# the streams shared that CPU with it, and in 22 diagnoses of 3-5 s here the waits that followed a
# move were 6-37% of the worst waits, under the finding's 10% in 7; at nice -10, 9-30% in 3 s and
# 19-25% in 10 s (below).
WANDERING_HOG = """
import os, time
os.nice(-10)
switched, cpu = time.time(), 0
while True:
    if time.time() - switched > 0.02:
        cpu ^= 1
        try:
            os.sched_setaffinity(0, {cpu})
        except OSError:
            pass
        switched = time.time()
"""


def migrations_in(pid: int, seconds: float) -> dict[str, int]:
    """Each thread's migrations over ``seconds``, by name."""
    host, probe = Host(), MigrationProbe()
    probe.start(host.thread_ids(pid))
    try:
        time.sleep(seconds)
        return {host.process(m.tid).comm: m.migrations for m in probe.moves()}
    finally:
        probe.stop()


@pytest.fixture
def moving_workload():
    if os.geteuid() != 0 or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs root and two CPUs")
    workload = subprocess.Popen([sys.executable, str(SCENARIOS / "migrating_threads.py"), "--threads", "3"],
                                stdout=subprocess.PIPE, text=True)
    hog = subprocess.Popen([sys.executable, "-c", WANDERING_HOG])
    try:
        yield int(workload.stdout.readline())
    finally:
        for process in (hog, workload):
            process.kill()
            process.wait()


def test_diagnose_names_the_moving_threads_its_profile_pins_them_apply_keeps_it_and_they_stop_moving(
        moving_workload, tmp_path, state_dir):
    pid = moving_workload
    written = tmp_path / "diagnosed.toml"
    # 10 s of diagnose: the finding's share rests on the worst waits, ~15 a second here, 15-20% of
    # them after a move. In 3 s (~45 worst waits, 0-5 after a move per thread) it read 9-30%, under
    # the finding's 10% in 2 of 5 runs and in both of one CI run's two looks; in 10 s, 19-25% in 6
    # of 6. A second look still decides before the test calls it a failure.
    for attempt in range(2):
        written.unlink(missing_ok=True)
        code, out, err = run_cli("diagnose", "--target", f"pid:{pid}", "--seconds", "10", "--write-profile", written,
                                 "--json", root=None, state_dir=state_dir, timeout=120)
        assert code == 0, err
        result = json.loads(out)
        found = [f for f in result["findings"] if f["cause"] == "migrations"]
        if found:
            break
    assert found, ("no migrations finding", result["migrations"])
    [finding] = found
    named = {line.split(" (tid")[0] for line in finding["evidence"]}
    assert {"stream-0", "stream-1", "stream-2"} <= named, finding
    rows = {r["comm"]: r for r in result["migrations"]}
    before = {name: rows[name]["migrations"] for name in ("stream-0", "stream-1", "stream-2")}
    assert all(n >= 50 for n in before.values()), before  # at least 5 a second each
    pins = tomllib.loads(written.read_text())["cpu_isolation"]["pin"]
    assert {"^stream\\-0$", "^stream\\-1$", "^stream\\-2$"} <= set(pins), pins
    # Pinning threads that move between two CPUs changes little of the measured tail either way: a
    # near-harmless step, which the judge may leave inconclusive on a noisy host (at most 5% of the
    # time), never reverted. A revert fails at once; an inconclusive first apply is rolled back and
    # applied again, so the test fails on chance only after two inconclusive verdicts in a row.
    for attempt in range(2):
        try:
            code, out, err = run_cli("apply", written, "--json", root=None, state_dir=state_dir, timeout=600)
            assert code in (0, 1), err
            [step] = [s for s in json.loads(out)["steps"] if s["plugin"] == "cpu_isolation"]
            assert step["outcome"] in ("kept", "inconclusive"), step
            if step["outcome"] == "inconclusive" and attempt == 0:
                continue
            assert step["outcome"] == "kept", step
            after = migrations_in(pid, 2.0)
            assert all(after[name] <= 2 for name in before), (before, after)  # pinned: they no longer move
            break
        finally:
            code, _, err = run_cli("rollback", root=None, state_dir=state_dir, timeout=120)
            assert code == 0, err
    assert not Path("/sys/fs/cgroup/cpuset/tuned-rl-workload").exists()
