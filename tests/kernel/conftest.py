"""Kernel tests change the real host as root and put every value back."""


from __future__ import annotations
import os
from pathlib import Path

import pytest

CPU = Path("/sys/fs/cgroup/cpu")
GLOBAL = Path("/proc/sys/kernel/sched_rt_runtime_us")


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/kernel/" in str(item.fspath):
            item.add_marker(pytest.mark.kernel)


def remove_cgroups_of_dead_runs() -> list[str]:
    """The ``tuned-rl-test-<pid>`` cgroups a killed test run left (its pid gone): their RT budget
    would leave the next run's no room (the children's budgets may not pass the parent's)."""
    removed = []
    for directory in CPU.glob("tuned-rl-test-*"):
        pid = directory.name.rpartition("-")[2]
        if not pid.isdigit() or Path(f"/proc/{pid}").exists() or (directory / "tasks").read_text().strip():
            continue
        (directory / "cpu.rt_runtime_us").write_text("0")
        directory.rmdir()
        removed.append(directory.name)
    return removed


@pytest.fixture
def rt_cgroup():
    """A real cpu cgroup with rt_runtime_us 500000 (the first article's setting), removed afterwards."""
    if os.geteuid() != 0 or not (CPU / "cpu.rt_runtime_us").exists():
        pytest.skip("needs root and cgroup v1 cpu.rt_runtime_us")
    remove_cgroups_of_dead_runs()
    global_before = GLOBAL.read_text()
    name = f"tuned-rl-test-{os.getpid()}"
    directory = CPU / name
    directory.mkdir()
    try:
        (directory / "cpu.rt_runtime_us").write_text("500000")
    except OSError:
        directory.rmdir()  # a budget refused (no room left under the parent's) leaves no cgroup behind
        raise
    yield name
    (directory / "cpu.rt_runtime_us").write_text("0")
    GLOBAL.write_text(global_before)
    directory.rmdir()
    assert GLOBAL.read_text() == global_before
