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


@pytest.fixture
def rt_cgroup():
    """A real cpu cgroup with rt_runtime_us 500000 (the first article's setting), removed afterwards."""
    if os.geteuid() != 0 or not (CPU / "cpu.rt_runtime_us").exists():
        pytest.skip("needs root and cgroup v1 cpu.rt_runtime_us")
    global_before = GLOBAL.read_text()
    name = f"tuned-rl-test-{os.getpid()}"
    directory = CPU / name
    directory.mkdir()
    (directory / "cpu.rt_runtime_us").write_text("500000")
    yield name
    (directory / "cpu.rt_runtime_us").write_text("0")
    GLOBAL.write_text(global_before)
    directory.rmdir()
    assert GLOBAL.read_text() == global_before
