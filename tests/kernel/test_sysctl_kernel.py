"""[sysctl] on the live kernel: tcp_rmem (which the kernel tab-separates) and the RT budget round-trip."""


from __future__ import annotations
import json
import os
from pathlib import Path

import pytest

from helpers import run_cli

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")

TCP_RMEM = Path("/proc/sys/net/ipv4/tcp_rmem")
RT_RUNTIME = Path("/proc/sys/kernel/sched_rt_runtime_us")


def test_tcp_rmem_and_the_rt_budget_are_applied_read_back_and_rolled_back(profile_file, state_dir):
    original = {p: p.read_text() for p in (TCP_RMEM, RT_RUNTIME)}
    low, middle, high = original[TCP_RMEM].split()
    assert "\t" in original[TCP_RMEM]  # what the kernel prints; the profile uses spaces
    runtime = int(original[RT_RUNTIME])
    profile = profile_file(f'[sysctl]\n"net.ipv4.tcp_rmem" = "{low} {int(middle) * 2} {high}"\n'
                           f'"kernel.sched_rt_runtime_us" = {runtime + 10000}\n')
    try:
        status, out, err = run_cli("apply", profile, "--no-verify", "--json", root=None, state_dir=state_dir)
        assert status == 0, err
        assert [s["outcome"] for s in json.loads(out)["steps"]] == ["applied", "applied"]
        assert TCP_RMEM.read_text().split() == [low, str(int(middle) * 2), high]
        assert int(RT_RUNTIME.read_text()) == runtime + 10000
        status = json.loads(run_cli("status", "--json", root=None, state_dir=state_dir)[1])
        assert [c["state"] for c in status["changes"]] == ["holds", "holds"]
        status, out, err = run_cli("rollback", "--json", root=None, state_dir=state_dir)
        assert status == 0 and [c["outcome"] for c in json.loads(out)["changes"]] == ["restored", "restored"]
        assert {p: p.read_text() for p in original} == original
    finally:
        for path, value in original.items():
            path.write_text(value)
