"""watch's always-on measurement on the live kernel: an alarm names a SCHED_FIFO neighbour within 2 s
of its first spin and none comes while it is SCHED_IDLE; /metrics agrees with `tuned-rl measure`."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import pytest

from tuned_rl.host import Host

sys.path.insert(0, str(Path(__file__).parent.parent.parent / "bench" / "scenarios"))

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or Host().online_cpus() != {0, 1},
                                reason="needs root and 2 CPUs (the lab's host)")


def test_an_alarm_names_a_fifo_neighbour_within_2_s_and_none_comes_while_it_is_idle(tmp_path):
    import watch_alarm
    result = watch_alarm.run(tmp_path, "alarm", seconds=15)  # the bench: 30 s of SCHED_IDLE
    print(result.row())
    assert result.watch_exit == 0
    # The helper's start-up (a Python interpreter at SCHED_FIFO, 40-50 ms) is the first stall: an
    # alarm without holders, which attaches attribution; its spins from then on are named.
    assert result.first_named_after_s is not None and result.first_named_after_s <= 2.0, result.events
    # The first alarm that names the helper names it as a FIFO task that held the CPU for 10 ms or
    # more. (Asked of the first alarm with any holders, this failed once in a CI run here: another
    # process was that alarm's top holder, while the helper was named 1.01 s after its first spin.)
    named = next(e for e in result.events if e["event"] == "alarm"
                 and any(h.get("pid") == result.helper_pid for h in e["holders"]))
    helper = next(h for h in named["holders"] if h.get("pid") == result.helper_pid)
    assert helper["policy"].startswith("SCHED_FIFO") and helper["held_us"] >= 10_000, named
    assert named["cpu"] == 1 and named["wait_us"] >= 10_000
    assert result.figures["quiet_alarms"] == 0, [e for e in result.events if e["event"] == "alarm"]


def bucket_of(us: float) -> int:
    """The endpoint's bucket (four per doubling) that holds a figure."""
    return math.floor(math.log2(us * 1000) * 4 + 1e-9)


def test_the_metrics_histogram_agrees_with_measure_over_the_same_20_s(tmp_path):
    import watch_alarm
    result = watch_alarm.run(tmp_path, "metrics")
    print(result.row())
    figures = result.figures
    assert result.watch_exit == 0 and figures["scraped_waits"] > 10_000
    assert abs(figures["scraped_waits"] - figures["measure_waits"]) <= 0.1 * figures["measure_waits"]
    # The two scrapes bracket measure's window only to a scrape's 0.25 s: the p99 agrees within 8%,
    # the p999, resting on the slowest ~200 waits, moved x1.00-1.41 (median x1.09) in eight runs
    # here and x1.37 on a fresh CI machine, when the last scrape came after measure's exit. One CI
    # run read x2.0 (305.5 against 151.6 us: a thin tail, which a few long waits at measure's exit
    # move); the scrapes are now the pair whose window holds measure's count of waits (x1.06-1.22 in
    # four runs of a noisier hour, 1-2% apart in waits).
    # Another CI run read x1.50 (1,053.8 against 704.5 µs: 3 buckets), and a run here x1.46 (1,456.8
    # against 999.4 µs) with 280 scraped waits over measure's p999 where measure had 211: the scrapes'
    # window also holds a moment of measure's start-up or exit, whose long waits measure leaves out,
    # so the scraped p999 reads high (in every run that disagreed): one bucket more is allowed above.
    for name, buckets in (("p99", 1), ("p999", 2)):
        scraped, measured = figures[f"scraped_{name}_us"], figures[f"measure_{name}_us"]
        within = abs(scraped - measured) <= 0.10 * measured
        above = name == "p999" and 0 <= bucket_of(scraped) - bucket_of(measured) <= buckets + 1
        assert within or above or abs(bucket_of(scraped) - bucket_of(measured)) <= buckets, \
            (name, scraped, measured, figures)
