"""watch's always-on measurement, seen as its user sees it: an alarm that names who held the CPU,
the /metrics endpoint against `tuned-rl measure`, and "regressed" when a neighbour starts after
the profile was verified.

The lab's request/response workload (workload.py) is pinned to CPU 1; the profile names it and
changes nothing (the first two scenarios) or removes a FIFO neighbour (the third); then
`tuned-rl watch --json --alarm-ms 10` runs.

- ``alarm``: a helper pinned to CPU 1, SCHED_FIFO, spins 15 ms twice a second for 4 s. Records how
  long after its first spin the first alarm naming its pid came, and how many alarms named it.
  Then the same helper is made SCHED_IDLE (it gives way to every wake-up at once) for 30 s: an
  alarm then is a false one (``quiet_alarms``).
- ``provisioned``: as at provisioning, watch starts before the workload; the workload starts, and
  3 s later the FIFO helper: whether an alarm names it (the workload's own start-up stalls, five
  Python processes on one CPU, come first and may take the rate limit's first alarms).
- ``metrics``: no helper; /metrics is scraped before and after a 20 s `tuned-rl measure` of the
  same target, and the p99 / p999 of the histogram's difference are set beside measure's.
- ``regressed``: apply verifies a step on the quiet workload; then the helper starts SCHED_FIFO
  (5 ms every 0.1 s: the p999 rises, the p99 hardly moves); watch, with a 20 s window, says
  "regressed" with both figures and the holders. (Every 0.5 s, as the alarm's helper, is too rare
  for a 20 s window of 200,000 waits: 40 stalls of 2-4 waits each, under its 0.1%.)

    sudo .venv/bin/python bench/scenarios/watch_alarm.py [--scenario alarm|provisioned|metrics|regressed] [--runs N]
"""

from __future__ import annotations

import argparse
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from lab import apply_profile, processes, rollback, start_watch, tuned_rl_json, wait_for  # noqa: E402
from rare_stalls import workload_command  # noqa: E402
from workload import MARKER  # noqa: E402

HELPER = Path(__file__).parent / "stall_helper.py"
PROFILE = f"""\
[profile]
name = "lab-watch-alarm"

[target]
name = "{MARKER}"
"""
CPU = 1


@dataclass
class AlarmRun:
    scenario: str
    helper_pid: int = 0
    first_spin_at: float = 0.0        # time.time() of the helper's first spin (its start + 0.5 s)
    first_named_after_s: float | None = None
    alarms: int = 0
    naming_helper: int = 0
    suppressed: int = 0
    events: list[dict] = field(default_factory=list)
    figures: dict = field(default_factory=dict)
    watch_exit: int | None = None

    def row(self) -> str:
        after = "-" if self.first_named_after_s is None else f"{self.first_named_after_s:.2f} s"
        extra = " ".join(f"{k}={v}" for k, v in self.figures.items())
        return (f"{self.scenario}: {self.alarms} alarms, {self.naming_helper} naming the helper, first naming it "
                f"{after} after its first spin, {self.suppressed} suppressed; {extra}; watch exit {self.watch_exit}")


def helper_command(policy: str, spin_ms: float, every_s: float) -> list[str]:
    chrt = ["chrt", "-f", "10"] if policy == "fifo" else ["chrt", "--idle", "0"]
    return ["taskset", "-c", str(CPU), *chrt, sys.executable, str(HELPER), "--spin-ms", str(spin_ms),
            "--every-s", str(every_s)]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def histogram(text: str, name: str = "tuned_rl_runqueue_latency_seconds") -> list[tuple[float, float]]:
    """(le, cumulative count) of the histogram's buckets, parsed with prometheus_client's parser."""
    from prometheus_client.parser import text_string_to_metric_families
    for family in text_string_to_metric_families(text):
        if family.name == name:
            return sorted((float(s.labels["le"]), s.value) for s in family.samples if s.name == name + "_bucket")
    raise AssertionError(f"{name} is not in /metrics")


def histogram_quantile(q: float, before: list, after: list) -> float:
    """PromQL's histogram_quantile over the difference of two scrapes (linear within a bucket), in µs."""
    buckets = [(le, a - b) for (le, a), (_, b) in zip(after, before)]
    total = buckets[-1][1]
    rank, lower, below = q * total, 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if le == float("inf"):
                return lower * 1e6
            return (lower + (le - lower) * (rank - below) / max(count - below, 1e-9)) * 1e6
        lower, below = le, count
    return lower * 1e6


@contextmanager
def measuring_watch(state_dir: Path, result: AlarmRun, args: tuple):
    """`tuned-rl watch --json ARGS`, measuring; then SIGTERM, its exit status kept, and rollback."""
    watch = start_watch(state_dir, result.events, args=args)
    try:
        wait_for(lambda: any(e["event"] == "measuring" for e in result.events), 20, "watch to measure")
        yield watch
    finally:
        watch.send_signal(signal.SIGTERM)
        result.watch_exit = watch.wait(30)
        rollback(state_dir)


def run(state_dir: Path, scenario: str = "alarm", seconds: float = 30.0) -> AlarmRun:
    result = AlarmRun(scenario)
    state_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    if scenario == "provisioned":
        return _provisioned(state_dir, result)
    with processes([workload_command(CPU)]):
        time.sleep(2)  # past its start-up
        if scenario == "regressed":
            return _regressed(state_dir, result)
        apply_profile(PROFILE, state_dir)
        args = ["--alarm-ms", "10"] + (["--metrics-address", f"127.0.0.1:{port}"] if scenario == "metrics" else [])
        with measuring_watch(state_dir, result, tuple(args)):
            if scenario == "metrics":
                _metrics(state_dir, port, result)
            else:
                with processes([helper_command("fifo", 15, 0.5)]) as (helper,):
                    result.helper_pid = helper.pid
                    result.first_spin_at = time.time() + 0.5
                    time.sleep(4)
                    subprocess.run(["chrt", "--idle", "-p", "0", str(helper.pid)], check=True)
                    time.sleep(1.5)  # alarms of the spins before, said within a second
                    quiet_from = time.time()
                    time.sleep(seconds)
                    result.figures["quiet_alarms"] = sum(1 for e in result.events if e["event"] == "alarm"
                                                         and e["time"] >= quiet_from)
            time.sleep(1)
    _count_alarms(result)
    return result


def _provisioned(state_dir: Path, result: AlarmRun) -> AlarmRun:
    apply_profile(PROFILE, state_dir)  # no workload yet
    with measuring_watch(state_dir, result, ("--alarm-ms", "10")):
        with processes([workload_command(CPU)]):
            time.sleep(3)
            with processes([helper_command("fifo", 15, 0.5)]) as (helper,):
                result.helper_pid = helper.pid
                result.first_spin_at = time.time() + 0.5
                time.sleep(4)
            time.sleep(1)
    _count_alarms(result)
    return result


def _count_alarms(result: AlarmRun) -> None:
    alarms = [e for e in result.events if e["event"] == "alarm"]
    result.alarms = len(alarms)
    result.suppressed = sum(e.get("suppressed", 0) for e in alarms)
    named = [e for e in alarms if any(h.get("pid") == result.helper_pid for h in e.get("holders", []))]
    result.naming_helper = len(named)
    if named:
        result.first_named_after_s = named[0]["time"] - result.first_spin_at


def _metrics(state_dir: Path, port: int, result: AlarmRun) -> None:
    """Scraped every 0.25 s while `measure` runs; the two scrapes compared are those about
    `measure`'s seconds apart whose window holds the number of waits nearest measure's own: its
    start-up (a BPF compile) and its exit (the program's teardown) are not in its figures, and a
    few long waits there moved a thin tail's p999 x2 when the last scrape, after its exit, was one."""
    import threading
    scrapes: list[tuple[float, list]] = []
    done = threading.Event()

    def scraper() -> None:
        while not done.is_set():
            scrapes.append((time.monotonic(), histogram(scrape(port))))
            time.sleep(0.25)
    time.sleep(2)
    thread = threading.Thread(target=scraper, daemon=True)
    thread.start()
    measured = tuned_rl_json(["measure", "--target", f"name:{MARKER}", "--seconds", "20"], state_dir, 120)
    ended = time.monotonic()
    done.set()
    thread.join()
    scrapes.append((time.monotonic(), histogram(scrape(port))))
    pairs = [(b, a) for i, (tb, b) in enumerate(scrapes) for ta, a in scrapes[i + 1:]
             if abs((ta - tb) - measured["seconds"]) <= 0.5]
    if not pairs:  # no scrape came during measure (a stalled scraper): its whole run, exit included
        _, before = min(scrapes, key=lambda s: abs(s[0] - (ended - measured["seconds"] - 0.1)))
        pairs = [(before, scrapes[-1][1])]
    before, after = min(pairs, key=lambda pair: abs(pair[1][-1][1] - pair[0][-1][1] - measured["n"]))
    result.figures = {"scraped_p99_us": round(histogram_quantile(0.99, before, after), 1),
                      "scraped_p999_us": round(histogram_quantile(0.999, before, after), 1),
                      "measure_p99_us": measured["p99_us"], "measure_p999_us": measured["p999_us"],
                      "scraped_waits": int(after[-1][1] - before[-1][1]), "measure_waits": measured["n"]}


REGRESSED_PROFILE = PROFILE + """
[sysctl]
"vm.stat_interval" = 10
"""


def _regressed(state_dir: Path, result: AlarmRun) -> AlarmRun:
    stat_interval = Path("/proc/sys/vm/stat_interval").read_text()
    report, _ = apply_profile(REGRESSED_PROFILE, state_dir)
    step = report["steps"][-1]
    result.figures["verified_p999_us"] = (step.get("after") or {}).get("p999_us")
    try:
        with measuring_watch(state_dir, result, ("--regressed-window-seconds", "20", "--alarm-ms", "100")):
            _regressed_window(result)
    finally:
        result.figures["stat_interval_restored"] = Path("/proc/sys/vm/stat_interval").read_text() == stat_interval
    return result


def _regressed_window(result: AlarmRun) -> None:
    """A full window of the verified state, then a FIFO neighbour until watch says "regressed"."""
    time.sleep(22)
    with processes([helper_command("fifo", 5, 0.1)]) as (helper,):
        result.helper_pid = helper.pid
        wait_for(lambda: any(e["event"] == "regressed" for e in result.events), 60, "a regressed event")
    regressed = next(e for e in result.events if e["event"] == "regressed")
    result.figures.update(p999_us=regressed["p999_us"],
                          limit_us=round(regressed["verified_p999_us"] * regressed["factor"], 1),
                          holders=[h.get("pid") for h in regressed["holders"]],
                          named_helper=any(h.get("pid") == result.helper_pid for h in regressed["holders"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", choices=("alarm", "provisioned", "metrics", "regressed"), default="alarm")
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    for index in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="tuned-rl-watch-alarm-") as tmp:
            result = run(Path(tmp), args.scenario)
            print(f"run {index + 1}: {result.row()}", flush=True)


if __name__ == "__main__":
    main()
