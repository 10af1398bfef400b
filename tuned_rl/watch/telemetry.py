"""watch's always-on measurement of the target: the kernel's histogram read once a second, an alarm
for each wait past the threshold that names what held the CPU, and "regressed" when the p999 of a
sliding window passes what the profile's steps were verified at.

Two probes. The continuous one (probes/continuous.py) runs all the time and costs what `measure`'s
probe costs: one program on sched_switch. The attributing one (diagnose's, probes/attribution.py)
is compiled and loaded at start but left detached; it is attached only around the worst waits: when
a long wait is seen (it then names the holders of the next ones, and stays attached until none has
come for ``attribution_s``), and for ``holders_s`` after a regression (whose holders it ranks). The
first long wait of a burst is reported at once with its length, thread and CPU; what held the CPU
is known from the next one on.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from typing import Callable

from tuned_rl.measure import holder_lookup
from tuned_rl.measure.holders import SOFTIRQ_NAMES, rank
from tuned_rl.host import Host, TaskGone, printable
from tuned_rl.measure.probes.attribution import AttributedWait, AttributingProbe
from tuned_rl.measure.probes.base import ProbeError
from tuned_rl.measure.probes.bpf import FINE_BUCKET_MIDDLES
from tuned_rl.measure.probes.continuous import ContinuousProbe, LongWait, Totals
from tuned_rl.measure.targets import Target, TargetError, resolve_pids, resolve_tids
from tuned_rl.watch.events import WatchEvent
from tuned_rl.watch.alarms import AlarmMatcher, HolderGates, RegressionWatch, TailWindow, WindowFigures, stalls

READ_S = 1.0  # the kernel's totals are read this often
REFRESH_S = 1.0  # the target's threads are looked up again this often (its processes' task lists, or its cgroup's)
POLICY_NAMES = {0: "SCHED_OTHER", 1: "SCHED_FIFO", 2: "SCHED_RR", 3: "SCHED_BATCH", 5: "SCHED_IDLE", 6: "SCHED_DEADLINE"}
TOP_HOLDERS = 5


@dataclass
class TelemetrySettings:
    alarm_ms: float = 10.0           # a wait this long (or longer) is an alarm
    window_s: float = 300.0          # the sliding window of the regressed check
    factor: float = 2.0              # regressed: the window's p999 over this times the verified one
    attribution_s: float = 30.0      # attribution stays attached this long after the last long wait
    holders_s: float = 10.0          # after a regression, attribution runs this long before the event
    alarm_burst: int = 3
    alarm_interval_s: float = 10.0   # after a burst, at most one alarm this often

    @property
    def alarm_ns(self) -> int:
        return int(self.alarm_ms * 1e6)


@dataclass
class TelemetryState:
    """What the metrics endpoint shows (read from the watch loop's thread; replaced, never mutated)."""

    totals: Totals | None = None
    window: WindowFigures | None = None
    verified_p999_us: float | None = None
    alarms: int = 0
    alarms_suppressed: int = 0
    regressions: int = 0
    attribution_attached_s: float = 0.0


@dataclass
class _Regression:
    figures: WindowFigures
    due: float
    began_ns: int


class Telemetry:
    """Run by the watch loop: ``start``, then ``tick`` on each pass (cheap: ring buffers are polled,
    totals read once a second), ``add_tids`` for each target process watch finds, ``stop``."""

    def __init__(self, host: Host, target: Target, settings: TelemetrySettings, emit: Callable[[dict], None],
                 verified_p999_us: float | None, continuous: Callable[[int], ContinuousProbe] = ContinuousProbe,
                 attributing: Callable[[int], AttributingProbe] | None = None, clock: Callable[[], float] = time.monotonic):
        self.host, self.target, self.settings, self.emit, self.clock = host, target, settings, emit, clock
        self._make_continuous = continuous
        self._make_attributing = attributing or (lambda alarm_ns: AttributingProbe(alarm_ns=alarm_ns))
        self.continuous: ContinuousProbe | None = None
        self.attributing: AttributingProbe | None = None
        self.notes: list[str] = []
        self.tids: set[int] = set()
        self.pids: set[int] = set()  # the target's processes, as found
        self.regressions = 0
        self.window = TailWindow(settings.window_s, FINE_BUCKET_MIDDLES)
        self.regression = RegressionWatch(verified_p999_us, settings.factor) if verified_p999_us else None
        self.matcher = AlarmMatcher()
        self.gate = HolderGates(settings.alarm_burst, settings.alarm_interval_s)
        self.state = TelemetryState(verified_p999_us=verified_p999_us)
        self._next_read = 0.0
        self._next_refresh = 0.0
        self._attached_since_ns: int | None = None
        self._attached_at = 0.0
        self._attached_total = 0.0
        self._last_long = 0.0
        self._regression: _Regression | None = None
        self._irq_names: dict[int, str] = {}
        # watch is verifying a step: long waits are still said at once, but attribution stays off and
        # the regressed check waits (the judge is measuring, and the step under test may be harmful).
        self.verifying = False

    # -- life ---------------------------------------------------------------------

    def start(self) -> None:
        """Load both probes (the attributing one detached); raises ProbeError if the continuous one cannot run."""
        self.tids = resolve_tids(self.host, self.target)
        self.pids = resolve_pids(self.host, self.target)
        self.continuous = self._make_continuous(self.settings.alarm_ns)
        self.continuous.start(self.tids)
        try:
            self.attributing = self._make_attributing(self.settings.alarm_ns)
            self.attributing.start(self.tids)
            self.attributing.detach()
        except ProbeError as err:
            self.attributing = None
            self.notes.append(f"alarms cannot name what held the CPU here: {err}")
        try:
            self._irq_names = holder_lookup.irq_names(holder_lookup.interrupt_counts(self.host))
        except OSError:  # no /proc/interrupts: an interrupt holder is then named by its number only
            self._irq_names = {}
        self._next_read = self.clock() + READ_S

    def stop(self) -> None:
        for probe in (self.attributing, self.continuous):
            if probe is not None:
                probe.stop()
        self.attributing = self.continuous = None

    def set_verified(self, p999_us: float | None) -> None:
        """watch verified a step: the regressed check compares with the figure it left."""
        if p999_us and p999_us != self.state.verified_p999_us:
            self.regression = RegressionWatch(p999_us, self.settings.factor)
            self.state = dataclasses.replace(self.state, verified_p999_us=p999_us)

    def add_tids(self, tids: set[int]) -> None:
        new = set(tids) - self.tids
        if not new or self.continuous is None:
            return
        self.tids |= new
        self.continuous.watch(new)
        if self.attributing is not None and self.attributing.attached:
            self.attributing.watch(new)

    def add_process(self, pid: int) -> None:
        """A target process watch found (started, or renamed into the target): measure all its threads."""
        self.pids.add(pid)
        self.add_tids(self.host.thread_ids(pid))

    # -- each pass ------------------------------------------------------------------

    def tick(self) -> None:
        if self.continuous is None:
            return
        now = self.clock()
        if now >= self._next_refresh:
            self._next_refresh = now + REFRESH_S
            self._refresh_tids()
        if self.verifying and self._attached_since_ns is not None:
            self._detach(now)
        waits = self.continuous.long_waits()
        attributed = self.attributing.attributed_waits() if self._attached_since_ns is not None else []
        if waits:
            self._last_long = now
            if not self.verifying:
                self._attach(now)
        for stall in stalls(self.matcher.add(now, waits, attributed, self._attached_since_ns)):
            self._alarm(stall)
        if now >= self._next_read:
            self._next_read = now + READ_S
            self._read(now)
        if self._regression is not None and now >= self._regression.due:
            self._report_regression(self._regression)
            self._regression = None
        if (self._attached_since_ns is not None and self._regression is None
                and now - self._last_long >= self.settings.attribution_s):
            self._detach(now)

    def _read(self, now: float) -> None:
        totals = self.continuous.totals()
        self.window.add(now, totals.counts)
        figures = self.window.figures()
        if self.regression is not None and self.window.full and self._regression is None and not self.verifying:
            self._check_regression(now, figures)  # (not while a regression's holders are being read)
        self.state = TelemetryState(totals, figures, self.state.verified_p999_us, self.gate.passed_total,
                                    self.gate.suppressed_total, self.regressions,
                                    self._attached_total + (now - self._attached_at if self._attached_since_ns else 0))

    def _check_regression(self, now: float, figures: WindowFigures) -> None:
        verdict = self.regression.check(figures)
        if verdict == "regressed":
            self.regressions += 1
            began = time.monotonic_ns()
            if self._attached_since_ns is not None and now - self._attached_at >= self.settings.holders_s:
                self._report_regression(_Regression(figures, now, self._attached_since_ns))
            else:
                self._attach(now)
                self._regression = _Regression(figures, now + self.settings.holders_s, began)
        elif verdict == "recovered":
            self.emit({"event": WatchEvent.RECOVERED, "target": str(self.target), "p999_us": figures.p999_us,
                       "verified_p999_us": self.regression.verified_p999_us, "factor": self.settings.factor,
                       "window_s": round(figures.seconds, 1), "waits": figures.waits})

    # -- attribution ----------------------------------------------------------------

    def _attach(self, now: float) -> None:
        if self.attributing is None or self._attached_since_ns is not None:
            return
        self._refresh_tids()  # the threads the target has now
        self.attributing.attach(self.tids)
        self._attached_since_ns, self._attached_at = time.monotonic_ns(), now

    def _refresh_tids(self) -> None:
        """Look the target's threads up again: add those it started (the continuous probe followed
        forks in the kernel; user space had the threads of each process as first seen), and forget
        those that exited (a node runs for months: the set must not grow with every thread ever
        made, and an exited thread's id may be another process's next)."""
        try:
            current = self._current_tids()
        except (TargetError, OSError):  # its cgroup is gone for now (a unit restarting): no threads
            current, self.pids = set(), set()
        gone = self.tids - current
        if gone and self.continuous is not None:
            self.continuous.forget(gone)
        self.tids -= gone
        self.add_tids(current)

    def _current_tids(self) -> set[int]:
        if self.target.kind != "name":  # a pid, cgroup or unit names its processes outright
            self.pids = resolve_pids(self.host, self.target)
            return resolve_tids(self.host, self.target)
        tids: set[int] = set()
        for pid in list(self.pids):
            threads = self.host.thread_ids(pid)
            if not threads:
                self.pids.discard(pid)  # exited
            tids |= threads
        return tids

    def _detach(self, now: float) -> None:
        self.attributing.detach()
        self._attached_total += now - self._attached_at
        self._attached_since_ns = None

    # -- events ---------------------------------------------------------------------

    def _alarm(self, stall: list[tuple[LongWait, AttributedWait | None]]) -> None:
        """One alarm for one stall: its longest wait attributed (or, with none attributed, its longest);
        rate-limited per holder (the one that held the CPU longest)."""
        wait, twin = stall[0]
        names = self.attributing.holder_names() if twin is not None else {}
        parts = sorted(twin.parts, key=lambda part: -part[2]) if twin is not None else []
        who = _holder_key(parts[0], names) if parts else "unknown"
        if not self.gate.allow(self.clock(), who):
            return
        event = {"event": WatchEvent.ALARM, "target": str(self.target), "wait_us": round(wait.wait_ns / 1000, 1),
                 "threshold_us": round(self.settings.alarm_ns / 1000, 1), "tid": wait.tid, "cpu": wait.cpu,
                 **self._thread(wait.tid), "threads_stalled": len(stall), "longest_us":
                 round(max(w.wait_ns for w, _ in stall) / 1000, 1), "suppressed": self.gate.take_suppressed(who)}
        if twin is not None:
            event["holders"] = [self._holder(kind, ident, ns, names) for kind, ident, ns in parts]
            event["not_attributed_us"] = round(twin.not_attributed_ns / 1000, 1)
            event["holder_cpu"] = twin.cpu
        else:
            event["holders"] = []
            if self.attributing is None:
                event["holders_note"] = self.notes[0] if self.notes else ""
            elif self.verifying:
                event["holders_note"] = ("not known: watch is verifying a step, and attribution stays off while the "
                                         "judge measures")
            elif self._attached_since_ns is not None and self._attached_since_ns <= wait.start_ns:
                event["holders_note"] = ("not known: the attributing probe ran but did not see this wait (the thread "
                                         "was new to it, or changed CPU while it waited)")
            else:
                event["holders_note"] = ("not known: attribution was off when this wait began; it runs now, and names "
                                         f"the holders of the long waits in the next {self.settings.attribution_s:g} s")
        self.emit(event)

    def _thread(self, tid: int) -> dict:
        """The waiting thread's process and name (/proc/TID, else the target process that has it)."""
        for pid in [tid, *sorted(self.pids)]:
            try:
                if pid != tid and tid not in self.host.thread_ids(pid):
                    continue
                process = self.host.process(pid)
            except (TaskGone, OSError):
                continue
            return {"pid": process.tgid, "comm": printable(process.comm)}
        return {"pid": None, "comm": ""}

    def _holder(self, kind: str, ident: int, ns: int, names: dict[int, dict]) -> dict:
        held = {"kind": kind, "held_us": round(ns / 1000, 1)}
        if kind == "task":
            name = names.get(ident, {})
            held.update(tid=ident, pid=int(name.get("tgid") or ident), comm=printable(name.get("comm", "")),
                        policy=POLICY_NAMES.get(name.get("policy"), str(name.get("policy", ""))))
            if held["pid"] in self.pids:
                held["role"] = "target"
            info = holder_lookup.holder_info(self.host, held["pid"], self.pids, {os.getpid()})
            if info is not None:
                held.update(cgroup=printable(info.cgroup), user=printable(info.user), policy=info.policy or held["policy"],
                            cmdline=printable(info.cmdline[:200]), kernel_thread=info.kernel_thread)
        elif kind == "irq":
            held.update(irq=ident, name=printable(self._irq_names.get(ident, "")))
        elif kind == "softirq":
            held.update(softirq=SOFTIRQ_NAMES[ident] if ident < len(SOFTIRQ_NAMES) else str(ident))
        return held

    def _report_regression(self, regression: _Regression) -> None:
        attribution = self.attributing.attribution() if self.attributing is not None else None
        event = {"event": WatchEvent.REGRESSED, "target": str(self.target), "p999_us": regression.figures.p999_us,
                 "p99_us": regression.figures.p99_us, "verified_p999_us": self.regression.verified_p999_us,
                 "factor": self.settings.factor, "window_s": round(regression.figures.seconds, 1),
                 "waits": regression.figures.waits}
        if attribution is None:
            event.update(holders=[], holders_note=self.notes[0] if self.notes else "")
        else:
            target_pids = set(self.pids)
            infos = {}
            for record in attribution.held:
                if record.kind == "task":
                    pid = int(attribution.names.get(record.id, {}).get("tgid") or record.id)
                    if pid not in infos:
                        info = holder_lookup.holder_info(self.host, pid, target_pids, {os.getpid()})
                        if info is not None:
                            infos[pid] = info
            ranking = rank(attribution, infos, self._irq_names)
            event["holders"] = [_short(h.to_dict()) for h in ranking.holders[:TOP_HOLDERS]]
            event["holders_seconds"] = round((time.monotonic_ns() - regression.began_ns) / 1e9, 1)
            event["holders_latency"] = attribution.latency_summary()
        self.emit(event)


def _holder_key(part: tuple[str, int, int], names: dict[int, dict]) -> str:
    """Who a wait's main holder is, for the rate limit: a process, an IRQ line, a softirq vector, idle."""
    kind, ident, _ = part
    if kind == "task":
        return f"pid {int(names.get(ident, {}).get('tgid') or ident)}"
    return f"{kind} {ident}"


def _short(holder: dict) -> dict:
    """A ranked holder as the regressed event carries it: who, and its shares (text made printable)."""
    keep = ("kind", "holder", "role", "name", "pid", "user", "cgroup", "policy", "share_of_wait",
            "share_of_worst_1pct", "wait_ms", "tail_ms")
    short = {k: printable(v) if isinstance(v, str) else v for k, v in holder.items() if k in keep}
    if holder["kind"] == "task" and "pid" not in short:  # exited before it could be looked up
        short["pid"] = int(holder["holder"].split()[1])
    return short


def telemetry_factory(host: Host, emit: Callable[[dict], None], alarm_ms: float, window_s: float, factor: float
                      ) -> Callable[[object, object], "Telemetry | str"]:
    """For the Watcher: the measurement of a loaded profile's target, or why there is none."""
    from tuned_rl.measure.targets import target_from_table

    def make(profile, applied) -> Telemetry | str:
        table = profile.get("target")
        if not table or table.get("canary"):
            return "the profile's target is a canary: there is no workload to measure"
        if host.moved_root is not None:
            return f"the host is the tree at {host.moved_root}: the kernel's probe measures only this machine's tasks"
        target = target_from_table(table)[0]
        settings = TelemetrySettings(alarm_ms=alarm_ms, window_s=window_s, factor=factor)
        return Telemetry(host, target, settings, emit, applied.verified_p999_us())
    return make
