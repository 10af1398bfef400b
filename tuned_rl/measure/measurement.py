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
from tuned_rl.measure.targets import Target, TargetError, resolve_tids

REFRESH_S = 0.25  # how often the probe's events are taken (and threads it cannot follow looked up again)
RESCAN_S = 1.0  # how often a probe that follows forks has the target looked up again (new processes)


@dataclass
class Measurement:
    """Per-window latencies (ns) and what stands behind them."""

    probe: str
    windows: list[np.ndarray] = field(default_factory=list)
    window_tids: list[np.ndarray] = field(default_factory=list)
    times: list[float] = field(default_factory=list)  # each window's midpoint (time.monotonic())
    lost: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def values(self) -> np.ndarray:
        return np.concatenate(self.windows) if self.windows else np.array([], dtype=np.int64)

    @property
    def tids(self) -> set[int]:
        return {int(t) for w in self.window_tids for t in w}

    def summary(self) -> Summary:
        return summarize(self.values)

    def to_dict(self) -> dict:
        return {**self.summary().to_dict(), "lost": self.lost, "probe": self.probe,
                "windows": len(self.windows), "seconds": round(self.seconds, 2), "notes": self.notes}


def record_windows(probe: LatencyProbe, tid_source: Callable[[], set[int]], windows: int,
                   window_seconds: float, progress: Callable[[float], None] = lambda left: None,
                   measurement: Measurement | None = None) -> Measurement:
    """Record ``windows`` windows from a started ``probe``; ``tid_source`` gives the target's threads now."""
    measurement = measurement or Measurement(probe.name)
    started = time.monotonic()
    probe.drain()  # events from before the first window belong to no window
    # Looking a name target up reads every process's command line: a burst of this process's CPU
    # the workload may wait behind. A probe that follows forks needs it only for new processes.
    rescan_s = RESCAN_S if probe.follows_forks else REFRESH_S
    rescanned = started
    for index in range(windows):
        end = started + (index + 1) * window_seconds
        tids, latencies = [], []
        while True:  # at least one drain per window, even one this process reached late (a loaded host)
            time.sleep(max(0.0, min(REFRESH_S, end - time.monotonic())))
            if time.monotonic() - rescanned >= rescan_s:
                probe.watch(tid_source())
                rescanned = time.monotonic()
            batch = probe.drain()
            tids.append(batch[0])
            latencies.append(batch[1])
            progress(started + windows * window_seconds - time.monotonic())
            if time.monotonic() >= end:
                break
        measurement.window_tids.append(np.concatenate(tids) if tids else np.array([], dtype=np.int64))
        measurement.times.append(end - window_seconds / 2)
        measurement.windows.append(np.concatenate(latencies) if latencies else np.array([], dtype=np.int64))
    measurement.seconds += time.monotonic() - started
    measurement.lost = probe.lost
    return measurement


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
    initial = tid_source()
    if not initial and target.kind == "pid":
        raise TargetError(f"no process has pid {target.value}")
    if not initial:
        notes.append(f"{target} had no threads when the measurement started")
    probe.start(initial)
    stack.callback(probe.stop)
    return Attached(probe, tid_source, initial, notes)


def measure_target(host: Host, target: Target, windows: int, window_seconds: float, probe_name: str = "auto",
                   canary: CanarySpec | None = None, progress: Callable[[float], None] = lambda left: None
                   ) -> Measurement:
    """Record ``windows`` windows of ``target`` (nothing is left running afterwards).

    Raises ProbeError or TargetError.
    """
    with ExitStack() as stack:
        attached = attach_probe(stack, host, target, probe_name, canary)
        measurement = record_windows(attached.probe, attached.tid_source, windows, window_seconds, progress,
                                     Measurement(attached.probe.name))
    measurement.notes = attached.notes
    seen = len(measurement.values) + measurement.lost
    if measurement.lost > 0.01 * seen:
        measurement.notes.append(f"{measurement.lost} of {seen} events were lost ({measurement.lost / seen:.0%}): "
                                 f"the figures may be biased; try another probe")
    return measurement
