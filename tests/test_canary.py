"""The canary: placed before it runs, reports its own waits, and goes away when told."""


from __future__ import annotations
import os

import pytest

from tuned_rl.measure.canary import Canary, CanarySpec
from tuned_rl.host import Host
from tuned_rl.measure.probes.schedstat import SchedstatProbe


def test_canary_wakes_at_its_rate_and_reports_schedstat_per_wake():
    import time
    with Canary(CanarySpec(period_us=2000, threads=2), Host(), report_schedstat=True) as canary:
        probe = SchedstatProbe(canary.process.stdout)
        probe.start(canary.tids())
        began = time.monotonic_ns()
        time.sleep(1.0)
        waits = probe.drain()
        assert len(canary.tids()) == 3  # the main thread waits; two threads wake
    tids, latencies = waits.tids, waits.latencies
    assert 2 * 300 < len(latencies) <= 2 * 520  # two threads at 500 Hz, for about a second
    assert len(set(tids.tolist())) == 2 and (latencies >= 0).all()
    assert (waits.starts >= began - 10_000_000).all() and (waits.starts <= time.monotonic_ns()).all()
    assert canary.process.returncode == 0


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_canary_is_placed_before_its_threads_start():
    with Canary(CanarySpec(cpus="1", threads=2), Host()) as canary:
        import time
        time.sleep(0.2)
        assert {frozenset(os.sched_getaffinity(t)) for t in canary.tids()} == {frozenset({1})}


def test_a_canary_that_cannot_be_placed_is_not_left_running():
    canary = Canary(CanarySpec(cgroup="/sys/fs/cgroup/cpu/no-such-cgroup"), Host())
    with pytest.raises(OSError):
        canary.start()
    assert canary.process.poll() is not None


def test_a_canary_writes_nothing_to_the_users_terminal(capfd):
    # Its stderr is the user's: `python -m` of a module its package had already imported printed
    # a RuntimeWarning from runpy on every `apply` and `measure` with a canary.
    with Canary(CanarySpec(threads=1), Host()):
        pass
    assert capfd.readouterr().err == ""
