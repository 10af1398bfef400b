"""One latency measurement of a target: windows of per-event run-queue latencies from a probe."""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from tuned_rl.measure.canary import Canary, CanarySpec
from tuned_rl.host import Host
from tuned_rl.measure.probes import LatencyProbe, Obstacle, ProbeError, choose_probe
from tuned_rl.measure.probes.schedstat import SchedstatProbe
from tuned_rl.measure.probes.tracefs import remove_leftover_instances
from tuned_rl.measure.stats import Summary, summarize
from tuned_rl.measure.targets import Target, TargetError, describe_lookalikes, resolve_tids

REFRESH_S = 0.25  # how often the probe's events are taken (and threads it cannot follow looked up again)
RESCAN_S = 1.0  # how often a probe that follows forks has the target looked up again (new processes)
GRACE_S = 0.05  # after the last window: for the waits that began in it and were still going on


@dataclass
class Span:
    """An interval of CLOCK_MONOTONIC time and the waits that *began* in it: a window, or a
    settling time after a change, whose waits are dropped.

    A wait is counted where it began, whenever it is reported: one that began in the last window
    before a step was applied and ended after it belongs to the arm without the step, and fills
    in that window late. ``ended_after`` counts such waits (they ended after the span did).
    """

    start_ns: int
    end_ns: int
    kept: bool = True
    chunks: list[np.ndarray] = field(default_factory=list)
    tid_chunks: list[np.ndarray] = field(default_factory=list)
    ended_after: int = 0

    @property
    def values(self) -> np.ndarray:
        return np.concatenate(self.chunks) if self.chunks else np.array([], dtype=np.int64)

    @property
    def tids(self) -> np.ndarray:
        return np.concatenate(self.tid_chunks) if self.tid_chunks else np.array([], dtype=np.int64)

    @property
    def count(self) -> int:
        return sum(map(len, self.chunks))

    @property
    def midpoint(self) -> float:
        """In seconds of time.monotonic()."""
        return (self.start_ns + self.end_ns) / 2e9


@dataclass
class Measurement:
    """Windows of per-wait latencies (ns), each holding the waits that began in it, and what stands behind them."""

    probe: str
    spans: list[Span] = field(default_factory=list)
    lost: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    ioctl: dict | None = None  # the ioctl timer's figures (IoctlTimes.to_dict), when one was asked for

    @property
    def windows(self) -> list[np.ndarray]:
        return [span.values for span in self.spans]

    @property
    def times(self) -> list[float]:
        return [span.midpoint for span in self.spans]

    @property
    def values(self) -> np.ndarray:
        chunks = [c for span in self.spans for c in span.chunks]
        return np.concatenate(chunks) if chunks else np.array([], dtype=np.int64)

    @property
    def tids(self) -> set[int]:
        return {int(t) for span in self.spans for chunk in span.tid_chunks for t in chunk}

    def summary(self) -> Summary:
        return summarize(self.values)

    def to_dict(self) -> dict:
        summary = self.summary().to_dict()
        under = [key for key in ("p50_us", "p99_us", "p999_us", "max_us") if 0 <= summary[key] < 1]
        return {**summary, **({"under_1us": under} if under else {}), "lost": self.lost, "probe": self.probe,
                "windows": len(self.spans), "seconds": round(self.seconds, 2), "notes": self.notes,
                **({"ioctl": self.ioctl} if self.ioctl is not None else {})}


class Recorder:
    """Takes a started probe's waits and counts each in the span (window) where it began.

    ``record`` measures consecutive windows, ``settle`` a span whose waits are dropped (the
    time a change takes, and takes hold). Spans follow one another; a wait that began between
    them (or before the first) is counted in ``unplaced``. Span boundaries fall on the probe's
    start resolution (a probe summing waits in the kernel counts them per 33.6 ms of start).
    """

    def __init__(self, probe: LatencyProbe, tid_source: Callable[[], set[int]]):
        self.probe, self.tid_source = probe, tid_source
        self.spans: list[Span] = []
        self.unplaced = 0
        self._starts = np.array([], dtype=np.int64)  # of self.spans, for placing
        self._ends = np.array([], dtype=np.int64)
        self._rescanned = time.monotonic()  # the caller has just looked the target up

    def record(self, windows: int, window_seconds: float, progress: Callable[[float], None] = lambda left: None,
               measurement: Measurement | None = None) -> Measurement:
        """``windows`` consecutive windows of ``window_seconds``, as a Measurement (its windows go on filling)."""
        measurement = measurement or Measurement(self.probe.name)
        started = time.monotonic()
        first = self._next_start()
        ends = [self._boundary(first + round((i + 1) * window_seconds * 1e9)) for i in range(windows)]
        for begin, end in zip([first] + ends[:-1], ends):
            span = self._open(begin, end, kept=True)
            measurement.spans.append(span)
            self._run_until(end, lambda: progress((ends[-1] - time.monotonic_ns()) / 1e9))
        measurement.seconds += time.monotonic() - started
        measurement.lost = self.probe.lost
        return measurement

    def settle(self, seconds: float) -> Span:
        """A span from the end of the last one (so that it covers the change just made) to
        ``seconds`` from now, whose waits are dropped."""
        begin = self._next_start(contiguous=True)
        end = self._boundary(time.monotonic_ns() + round(seconds * 1e9))
        span = self._open(begin, end, kept=False)
        self._run_until(end, lambda: None)
        return span

    def take(self) -> None:
        """Drain the probe and count each wait in its span."""
        waits = self.probe.drain()
        if not len(waits):
            return
        if not self.spans:
            self.unplaced += len(waits)
            return
        if waits.starts is None:  # the probe cannot tell: each wait counts where it was drained
            index = np.full(len(waits), len(self.spans) - 1)
            inside = index >= 0
        else:
            index = np.searchsorted(self._starts, waits.starts, side="right") - 1
            inside = (index >= 0) & (waits.starts < self._ends[np.maximum(index, 0)])
        self.unplaced += int((~inside).sum())
        for position in np.unique(index[inside]).tolist():
            chosen = inside & (index == position)
            span = self.spans[position]
            span.chunks.append(waits.latencies[chosen])
            if len(waits.tids):
                span.tid_chunks.append(waits.tids[chosen])
            if waits.starts is not None:
                span.ended_after += int((waits.starts[chosen] + waits.latencies[chosen] > span.end_ns).sum())

    def forget_all_but(self, spans: list[Span]) -> None:
        """Keep only ``spans`` (a baseline about to be reused): the rest are measured and judged."""
        keep = {id(span) for span in spans}
        self.spans = [span for span in self.spans if id(span) in keep]
        self._index()

    # -- internals -------------------------------------------------------------

    def _open(self, begin: int, end: int, kept: bool) -> Span:
        if not self.spans:
            self.take()  # waits reported before the first span began in no span
        span = Span(begin, end, kept)
        self.spans.append(span)
        self._index()
        return span

    def _index(self) -> None:
        self._starts = np.array([s.start_ns for s in self.spans], dtype=np.int64)
        self._ends = np.array([s.end_ns for s in self.spans], dtype=np.int64)

    def _run_until(self, end_ns: int, progress: Callable[[], None]) -> None:
        # Looking a name target up reads every process's command line: a burst of this process's CPU
        # the workload may wait behind. A probe that follows forks needs it only for new processes.
        rescan_s = RESCAN_S if self.probe.follows_forks else REFRESH_S
        while True:  # at least one drain per span, even one this process reached late (a loaded host)
            time.sleep(max(0.0, min(REFRESH_S, (end_ns - time.monotonic_ns()) / 1e9)))
            if time.monotonic() - self._rescanned >= rescan_s:
                self.probe.watch(self.tid_source())
                self._rescanned = time.monotonic()
            self.take()
            progress()
            if time.monotonic_ns() >= end_ns:
                break

    def _next_start(self, contiguous: bool = False) -> int:
        """Where the next span begins: where the last one ended if that was a moment ago (or
        ``contiguous``), else at the next boundary from now."""
        now = time.monotonic_ns()
        if self.spans and (contiguous or now - self.spans[-1].end_ns < self._resolution()):
            return self.spans[-1].end_ns
        return self._boundary(now)

    def _boundary(self, ns: int) -> int:
        resolution = self._resolution()
        return -(-ns // resolution) * resolution

    def _resolution(self) -> int:
        return max(int(getattr(self.probe, "start_resolution_ns", 1)), 1)


def record_windows(probe: LatencyProbe, tid_source: Callable[[], set[int]], windows: int,
                   window_seconds: float, progress: Callable[[float], None] = lambda left: None,
                   measurement: Measurement | None = None) -> Measurement:
    """Record ``windows`` windows from a started ``probe``; ``tid_source`` gives the target's threads now.

    Each window holds the waits that began in it, as far as they were reported by the time the
    last window ended.
    """
    return Recorder(probe, tid_source).record(windows, window_seconds, progress, measurement)


@dataclass
class Attached:
    """A started probe on a target's threads (and the canary it started, if any)."""

    probe: LatencyProbe
    tid_source: Callable[[], set[int]]
    initial_tids: set[int]
    notes: list[str]


def attach_probe(stack: ExitStack, host: Host, target: Target, probe_name: str,
                 canary: CanarySpec | None, probe_class: type[LatencyProbe] | None = None) -> Attached:
    """Choose a probe (or use ``probe_class``), start the canary if the target is one, and start the
    probe on its threads.

    Everything started is stopped when ``stack`` closes. Raises ProbeError or TargetError.
    """
    notes = [f"removed {path}, left recording by a tuned-rl that was killed" for path in remove_leftover_instances(host)]
    if probe_class is None:
        probe_class, passed_over = choose_probe(probe_name, host, target.kind == "canary")
        notes += [f"probe {probe_name} chose {probe_class.name}; passed over {p}" for p in passed_over]
    else:
        obstacles = probe_class.obstacles(host, target.kind == "canary")
        if obstacles:
            raise ProbeError(Obstacle.describe(obstacles))
    if target.kind == "canary":
        running = stack.enter_context(Canary(canary or CanarySpec(), host,
                                             report_schedstat=probe_class is SchedstatProbe))
        tid_source = running.tids
        probe = SchedstatProbe(running.process.stdout) if probe_class is SchedstatProbe else probe_class()
    else:
        tid_source = lambda: resolve_tids(host, target)  # noqa: E731
        probe = probe_class()
        notes += describe_lookalikes(host, target)
    initial = tid_source()
    if not initial and target.kind == "pid":
        raise TargetError(f"no process has pid {target.value}")
    if not initial:
        notes.append(f"{target} had no threads when the measurement started")
    probe.start(initial)
    stack.callback(probe.stop)
    return Attached(probe, tid_source, initial, notes)


def measure_target(host: Host, target: Target, windows: int, window_seconds: float, probe_name: str = "auto",
                   canary: CanarySpec | None = None, progress: Callable[[float], None] = lambda left: None,
                   ioctl: str | None = None) -> Measurement:
    """Record ``windows`` windows of ``target`` (nothing is left running afterwards); with ``ioctl``,
    also time the target's calls of that kernel function (``Measurement.ioctl``).

    Raises ProbeError or TargetError.
    """
    with ExitStack() as stack:
        attached = attach_probe(stack, host, target, probe_name, canary)
        tid_source, timer = attached.tid_source, None
        if ioctl:
            from tuned_rl.measure.probes.ioctl import attach_timer
            timer, tid_source = attach_timer(stack, host, ioctl, attached.initial_tids, tid_source)
        recorder = Recorder(attached.probe, tid_source)
        measurement = recorder.record(windows, window_seconds, progress)
        time.sleep(GRACE_S)
        recorder.take()  # waits that began in the last window and ended since
        if timer is not None:
            measurement.ioctl = timer.times().to_dict()
            measurement.notes.append(f"ioctl timer: {timer.describe()}")
    measurement.notes = attached.notes + measurement.notes
    seen = len(measurement.values) + measurement.lost
    if measurement.lost > 0.01 * seen:
        measurement.notes.append(f"{measurement.lost} of {seen} events were lost ({measurement.lost / seen:.0%}): "
                                 f"the figures may be biased; try another probe")
    return measurement
