"""Each wait is counted in the window where it began, however late it is reported."""


from __future__ import annotations
import time

import numpy as np

from tuned_rl.measure.measurement import Recorder
from tuned_rl.measure.probes import Waits
from tuned_rl.measure.probes.granules import GRANULE_BUCKETS, GRANULE_NS, GRANULES, GranuleRing
from tuned_rl.measure.probes.bpf import FINE_BUCKET_MIDDLES


class QueuedProbe:
    """Hands over, at each drain, whatever waits the test queued since the last one."""

    name = "queued"
    follows_forks = True
    lost = 0

    def __init__(self, start_resolution_ns: int = 1):
        self.start_resolution_ns = start_resolution_ns
        self.queued: list[Waits] = []

    def drain(self) -> Waits:
        if not self.queued:
            return Waits.empty()
        waits = Waits(np.concatenate([w.latencies for w in self.queued]), np.concatenate([w.starts for w in self.queued]))
        self.queued = []
        return waits

    def watch(self, tids):
        pass

    def wait(self, start_ns: int, length_ns: int) -> None:
        self.queued.append(Waits(np.array([length_ns]), np.array([start_ns])))


def test_a_wait_that_began_before_a_change_and_ended_after_it_counts_where_it_began():
    probe = QueuedProbe()
    recorder = Recorder(probe, set)
    without = recorder.record(1, 0.05)
    settling = recorder.settle(0.02)
    began = without.spans[0].start_ns + 10_000_000
    probe.wait(began, 400_000_000)  # an RT throttling wait of 0.4 s, reported long after the change
    probe.wait(settling.start_ns + 1_000_000, 5_000)  # began while the change took hold
    with_step = recorder.record(1, 0.05)
    assert without.windows[0].tolist() == [400_000_000] and with_step.windows[0].tolist() == []
    assert without.spans[0].ended_after == 1
    assert settling.count == 1  # left out of both arms


def test_spans_follow_each_other_and_waits_from_before_or_between_them_are_unplaced():
    probe = QueuedProbe()
    probe.wait(time.monotonic_ns() - 1_000_000_000, 1000)  # from before the first window
    recorder = Recorder(probe, set)
    first = recorder.record(2, 0.03)
    spans = first.spans
    assert spans[0].end_ns == spans[1].start_ns and recorder.unplaced == 1
    time.sleep(0.05)  # nothing is measured: waits that begin now belong to no window
    probe.wait(time.monotonic_ns(), 1000)
    later = recorder.record(1, 0.03)
    assert later.spans[0].start_ns > spans[1].end_ns and recorder.unplaced == 2


def test_windows_of_a_probe_that_dates_waits_per_interval_begin_and_end_on_its_intervals():
    probe = QueuedProbe(start_resolution_ns=GRANULE_NS)
    recorder = Recorder(probe, set)
    measurement = recorder.record(2, 0.05)
    assert all(s.start_ns % GRANULE_NS == 0 and s.end_ns % GRANULE_NS == 0 for s in measurement.spans)
    assert measurement.spans[0].end_ns == measurement.spans[1].start_ns


def test_a_probe_that_cannot_date_its_waits_has_them_counted_where_they_are_drained():
    class Undated(QueuedProbe):
        def drain(self):
            return Waits(np.array([7, 8]), None)
    recorder = Recorder(Undated(), set)
    measurement = recorder.record(1, 0.02)
    assert measurement.spans[0].count > 0 and recorder.unplaced == 2  # the drain before the first window


def test_the_granule_ring_dates_each_slots_new_counts_to_the_latest_interval_of_its_number():
    slots = {s: np.zeros(GRANULE_BUCKETS, dtype=np.uint32) for s in range(GRANULES)}
    old = np.zeros(GRANULE_BUCKETS, dtype=np.uint32)
    reads = []

    def slot(number):
        reads.append(number)
        return slots[number].copy()
    ring = GranuleRing(lambda: np.array([slots[s].sum(dtype=np.uint32) for s in range(GRANULES)], dtype=np.uint32),
                       slot, lambda: old.copy(), FINE_BUCKET_MIDDLES)
    now = (10 * GRANULES + 7) * GRANULE_NS + 5
    slots[7][100] += 2  # two waits that began in the interval now is in
    slots[6][3] += 1  # one in the interval before
    waits = ring.take(now)
    assert sorted(waits.starts.tolist()) == [(10 * GRANULES + 6) * GRANULE_NS] + [(10 * GRANULES + 7) * GRANULE_NS] * 2
    assert sorted(waits.latencies.tolist()) == [FINE_BUCKET_MIDDLES[64 + 3]] + [FINE_BUCKET_MIDDLES[64 + 100]] * 2
    assert sorted(reads) == [6, 7]
    reads.clear()
    slots[8][0] += 1  # slot 8, read at the same moment, is the previous lap's 8th interval
    old[5] += 4  # four waits that began too long ago to say when
    waits = ring.take(now)
    assert sorted(reads) == [8]
    starts = waits.starts.tolist()
    assert starts.count((9 * GRANULES + 8) * GRANULE_NS) == 1 and starts.count(-1) == 4
    assert len(ring.take(now)) == 0  # nothing new


def test_the_granule_ring_reads_counts_that_wrapped_past_two_to_the_32nd():
    counts = np.zeros(GRANULE_BUCKETS, dtype=np.uint32)
    ring = GranuleRing(lambda: np.array([counts.sum(dtype=np.uint32)] + [0] * (GRANULES - 1), dtype=np.uint32),
                       lambda slot: counts.copy(), lambda: np.zeros(GRANULE_BUCKETS, dtype=np.uint32),
                       FINE_BUCKET_MIDDLES)
    counts[9] = np.uint32(2**32 - 2)
    ring._slots[0], ring._totals[0] = counts.copy(), np.uint32(2**32 - 2)  # as a long run leaves them
    counts[9:10] += np.uint32(5)  # wraps to 3: five more waits
    assert len(ring.take(GRANULES * GRANULE_NS)) == 5
