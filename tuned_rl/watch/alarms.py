"""What watch makes of its always-on measurement, pure: which long waits become alarms (each matched
with what held its CPU, rate-limited), the target's p999 over a sliding window, and when that
window has regressed past what the profile's steps were verified at.

No probe and no clock here: the telemetry loop (tuned_rl.watch.telemetry) feeds in what the probes
read and when, so that recorded windows replay exactly in the tests.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from tuned_rl.measure.probes.attribution import AttributedWait
from tuned_rl.measure.probes.continuous import LongWait
from tuned_rl.measure.stats import quantile_ns

MATCH_SLACK_NS = 2_000_000  # two probes' readings of one wait's end differ by microseconds; this is ample
MIN_WINDOW_WAITS = 1000  # a p999 of fewer waits rests on no wait at all


def same_wait(wait: LongWait, attributed: AttributedWait) -> bool:
    """Whether the attributing probe's record is the continuous probe's wait (same thread, same end)."""
    slack = max(MATCH_SLACK_NS, wait.wait_ns // 10)
    return attributed.tid == wait.tid and abs(attributed.end_ns - wait.end_ns) <= slack


class AlarmMatcher:
    """Pairs each long wait with its attributed twin when the attributing probe was running for all of it.

    A wait the attributing probe can have seen (it was attached before the wait began) waits up to
    ``match_s`` for its twin; any other is ready at once, without holders.
    """

    def __init__(self, match_s: float = 0.5):
        self.match_s = match_s
        self._waiting: list[tuple[float, LongWait]] = []
        self._attributed: deque[tuple[float, AttributedWait]] = deque()

    def add(self, now: float, waits: list[LongWait], attributed: list[AttributedWait],
            attached_since_ns: int | None) -> list[tuple[LongWait, AttributedWait | None]]:
        """Take what the probes handed over at ``now`` (seconds); returns the waits ready to be alarms."""
        self._attributed.extend((now, a) for a in attributed)
        while self._attributed and self._attributed[0][0] < now - 2 * self.match_s - 1:
            self._attributed.popleft()
        ready = []
        for wait in waits:
            if attached_since_ns is not None and attached_since_ns <= wait.start_ns:
                self._waiting.append((now, wait))
            else:
                ready.append((wait, None))
        still = []
        for since, wait in self._waiting:
            twin = next((a for _, a in self._attributed if same_wait(wait, a)), None)
            if twin is not None:
                ready.append((wait, twin))
                self._attributed = deque((t, a) for t, a in self._attributed if a is not twin)
            elif now - since >= self.match_s:
                ready.append((wait, None))
            else:
                still.append((since, wait))
        self._waiting = still
        return ready


def stalls(ready: list[tuple[LongWait, AttributedWait | None]]) -> list[list[tuple[LongWait, AttributedWait | None]]]:
    """Long waits grouped into stalls: waits on one CPU whose spans overlap are one stall (a holder
    that keeps a CPU for 15 ms stalls every target thread queued there), each group longest first."""
    groups: list[list[tuple[LongWait, AttributedWait | None]]] = []
    ends: list[int] = []
    for pair in sorted(ready, key=lambda p: (p[0].cpu, p[0].start_ns)):
        wait = pair[0]
        if groups and groups[-1][0][0].cpu == wait.cpu and wait.start_ns <= ends[-1]:
            groups[-1].append(pair)
            ends[-1] = max(ends[-1], wait.end_ns)
        else:
            groups.append([pair])
            ends.append(wait.end_ns)
    return [sorted(g, key=lambda p: (p[1] is None, -p[0].wait_ns)) for g in groups]


GATES_BEFORE_PRUNING = 256


class AlarmGate:
    """At most ``burst`` alarms at once, then one per ``interval_s``; the rest are counted as suppressed."""

    def __init__(self, burst: int = 3, interval_s: float = 10.0):
        self.burst, self.interval_s = burst, interval_s
        self._tokens = float(burst)
        self._last: float | None = None
        self.suppressed = 0           # since the last alarm let through
        self.suppressed_total = 0
        self.passed_total = 0

    def allow(self, now: float) -> bool:
        if self._last is not None:
            self._tokens = min(self.burst, self._tokens + (now - self._last) / self.interval_s)
        self._last = now
        if self._tokens >= 1:
            self._tokens -= 1
            self.passed_total += 1
            return True
        self.suppressed += 1
        self.suppressed_total += 1
        return False

    def take_suppressed(self) -> int:
        """Suppressed since the last alarm let through (reported in the next one), and reset."""
        taken, self.suppressed = self.suppressed, 0
        return taken

    def at_rest(self, now: float) -> bool:
        """Refilled and owing no suppressed count: a new gate would do exactly what this one does."""
        refilled = self._last is None or self._tokens + (now - self._last) / self.interval_s >= self.burst
        return refilled and not self.suppressed


class HolderGates:
    """Alarms rate-limited per holder (the pid, IRQ or softirq that held the CPU longest; "unknown"
    when attribution did not see the wait): a stall behind a holder not seen before is always said,
    even while another holder's stalls are being held back (a workload's own start-up must not hide
    the neighbour that follows it). All holders together: at most ``total_burst`` at once, then one
    per ``total_interval_s``."""

    def __init__(self, burst: int = 3, interval_s: float = 10.0, total_burst: int = 10, total_interval_s: float = 1.0):
        self.burst, self.interval_s = burst, interval_s
        self.gates: dict[str, AlarmGate] = {}
        self.total = AlarmGate(total_burst, total_interval_s)
        self.suppressed_total = 0
        self.passed_total = 0

    def allow(self, now: float, holder: str) -> bool:
        if len(self.gates) >= GATES_BEFORE_PRUNING:  # one per pid that ever held a CPU: forgotten once at rest
            self.gates = {name: gate for name, gate in self.gates.items() if not gate.at_rest(now)}
        gate = self.gates.setdefault(holder, AlarmGate(self.burst, self.interval_s))
        if not gate.allow(now):  # (the holder's gate counts it as suppressed)
            self.suppressed_total += 1
            return False
        if not self.total.allow(now):
            gate.suppressed += 1  # counted on the holder: its next alarm reports it
            self.suppressed_total += 1
            return False
        self.passed_total += 1
        return True

    def take_suppressed(self, holder: str) -> int:
        """This holder's alarms suppressed since its last one (reported in the next), and reset."""
        return self.gates[holder].take_suppressed() if holder in self.gates else 0


@dataclass(frozen=True)
class WindowFigures:
    seconds: float
    waits: int
    p99_us: float
    p999_us: float


class TailWindow:
    """The kernel's cumulative histogram read over time; figures for the last ``window_s`` seconds."""

    def __init__(self, window_s: float, middles: np.ndarray):
        self.window_s, self.middles = window_s, middles
        self._readings: deque[tuple[float, np.ndarray]] = deque()

    def add(self, now: float, counts: np.ndarray) -> None:
        self._readings.append((now, counts.astype(np.int64)))
        while len(self._readings) > 2 and self._readings[1][0] <= now - self.window_s:
            self._readings.popleft()

    def figures(self) -> WindowFigures | None:
        """The waits between the oldest reading kept (at most ``window_s`` ago) and the newest."""
        if len(self._readings) < 2:
            return None
        (begun, first), (ended, last) = self._readings[0], self._readings[-1]
        counts = last - first
        return WindowFigures(ended - begun, int(counts.sum()), quantile_ns(counts, self.middles, 0.99) / 1000,
                             quantile_ns(counts, self.middles, 0.999) / 1000)

    @property
    def full(self) -> bool:
        """The readings span the whole window (watch has run that long)."""
        return len(self._readings) >= 2 and self._readings[-1][0] - self._readings[0][0] >= self.window_s * 0.99


RECOVERY_MARGIN = 1.25  # "recovered" only this far under the limit: a p999 at the limit would flap


class RegressionWatch:
    """Says "regressed" once when a window's p999 exceeds ``factor`` times the verified p999, and
    "recovered" once when it falls to the limit / RECOVERY_MARGIN or under; nothing in between."""

    def __init__(self, verified_p999_us: float, factor: float, min_waits: int = MIN_WINDOW_WAITS):
        self.verified_p999_us, self.factor, self.min_waits = verified_p999_us, factor, min_waits
        self.regressed = False

    @property
    def limit_us(self) -> float:
        return self.verified_p999_us * self.factor

    def check(self, figures: WindowFigures | None) -> str | None:
        if figures is None or figures.waits < self.min_waits:
            return None
        if not self.regressed and figures.p999_us > self.limit_us:
            self.regressed = True
            return "regressed"
        if self.regressed and figures.p999_us <= self.limit_us / RECOVERY_MARGIN:
            self.regressed = False
            return "recovered"
        return None
