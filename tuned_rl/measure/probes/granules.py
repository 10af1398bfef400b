"""User space's side of the BPF probe's ring of histograms by wait start: which waits began when."""

from __future__ import annotations

from typing import Callable

import numpy as np

from tuned_rl.measure.probes.base import Waits

# As the kernel program (bpf.HISTOGRAM) has them.
GRANULE_SHIFT = 25  # each slot counts the waits that began in one interval of 2^25 ns (33.6 ms)
GRANULES = 512  # slots in the ring: 17 s
GRANULE_BUCKETS = 512  # per slot, the fine buckets from GRANULE_FIRST_BUCKET on (16 ns to 69 s)
GRANULE_FIRST_BUCKET = 64
GRANULE_NS = 1 << GRANULE_SHIFT


class GranuleRing:
    """Takes the waits counted since the last take, each placed at the start of its interval.

    ``read_totals()`` gives the per-slot totals, ``read_slot(slot)`` one slot's counts per bucket,
    ``read_too_old()`` the counts of waits that began too long before they were counted (all
    uint32 arrays, only ever growing, wrapping at 2^32). ``middles`` gives the wait each fine
    bucket stands for. A slot whose total changed is read again, and what it gained belongs to
    the most recent interval of its number: the kernel diverts waits old enough to be mistaken.
    """

    def __init__(self, read_totals: Callable[[], np.ndarray], read_slot: Callable[[int], np.ndarray],
                 read_too_old: Callable[[], np.ndarray], middles: np.ndarray):
        self._read_totals, self._read_slot, self._read_too_old = read_totals, read_slot, read_too_old
        self._middles = middles[GRANULE_FIRST_BUCKET:GRANULE_FIRST_BUCKET + GRANULE_BUCKETS]
        self._totals = np.zeros(GRANULES, dtype=np.uint32)
        self._slots: dict[int, np.ndarray] = {}
        self._too_old = np.zeros(GRANULE_BUCKETS, dtype=np.uint32)

    def take(self, now_ns: int) -> Waits:
        """The waits counted since the last take; ``now_ns`` is CLOCK_MONOTONIC now."""
        totals = self._read_totals()
        changed = np.nonzero(totals != self._totals)[0]
        self._totals = totals
        current = now_ns >> GRANULE_SHIFT
        latencies, starts = [], []
        for slot in changed.tolist():
            counts = self._read_slot(slot)
            gained = (counts - self._slots.get(slot, np.zeros_like(counts))).astype(np.int64)  # modulo 2^32
            self._slots[slot] = counts
            granule = current - (current - slot) % GRANULES
            latencies.append(np.repeat(self._middles, gained))
            starts.append(np.full(int(gained.sum()), granule << GRANULE_SHIFT, dtype=np.int64))
        old = self._read_too_old()
        gained = (old - self._too_old).astype(np.int64)
        self._too_old = old
        if gained.any():
            latencies.append(np.repeat(self._middles, gained))
            starts.append(np.full(int(gained.sum()), -1, dtype=np.int64))  # began too long ago to say when
        if not latencies:
            return Waits.empty()
        return Waits(np.concatenate(latencies), np.concatenate(starts))
