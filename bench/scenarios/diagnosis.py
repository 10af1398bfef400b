"""Diagnose, then apply what it wrote: the step before `apply`, on the lab's two seed causes.

- ``noisy``: the request/response workload (workload.py) and three CPU-bound jobs on both CPUs.
  `tuned-rl diagnose --target name:... --write-profile` must name the jobs as the top holders,
  with at least 80% of the workload's worst-1% wait time; the written profile, applied, must be
  kept and lower p999.
- ``rt``: rt_throttling.py's setting (two SCHED_FIFO actors at 80% duty in a cpu cgroup with
  cpu.rt_runtime_us 500000). diagnose of a FIFO canary in that cgroup must report the cgroup and
  its budget; the written profile, applied, must be kept with p999 at least 100x lower.

After rollback the host is as before (the RT budget 500000 while the lab's cgroup lives; every
placement for ``noisy``).

    sudo .venv/bin/python bench/scenarios/diagnosis.py [--case noisy|rt] [--show] [--record tests/data]
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from lab import (CPU, apply_profile, cgroup, hog_command, placement, placement_differences, processes,  # noqa: E402
                 rollback, rt_actors, tuned_rl_json)
from workload import MARKER  # noqa: E402

RT_CGROUP = "tuned-rl-lab-diagnose-rt"


@dataclass
class Case:
    """What diagnose said, and what applying its profile did."""

    case: str
    diagnosis: dict
    profile: str
    report: dict
    host_restored: bool
    seconds: float
    raw: str = ""  # what --save-raw wrote

    @property
    def findings(self) -> list[str]:
        return [f["cause"] for f in self.diagnosis["findings"]]

    def jobs_share_of_tail(self, marker: str) -> float:
        """The share of the worst-1% wait held by processes whose command line has ``marker``."""
        return sum(h["share_of_worst_1pct"] for h in self.diagnosis["attribution"]["holders"]
                   if marker in h.get("cmdline", ""))

    def placement_step(self, plugin: str) -> dict:
        return next(s for s in self.report["steps"] if s["plugin"] == plugin)

    def row(self) -> str:
        steps = "; ".join(f"{s['plugin']} {s['outcome']} {_ms(s.get('before'))} -> {_ms(s.get('after'))}"
                          for s in self.report["steps"])
        top = self.diagnosis["attribution"]["holders"][:3]
        return (f"{self.case:<6} findings: {', '.join(self.findings)}; top holders: "
                + ", ".join(f"{h['holder']} ({h['name']}) {h['share_of_worst_1pct']:.0%}" for h in top)
                + f"\n       applied: {steps}; {self.seconds:.0f} s; restored: {'yes' if self.host_restored else 'NO'}")


def _ms(figures: dict | None) -> str:
    return "-" if not figures else f"{figures['p999_us'] / 1000:.2f} ms"


def diagnose(args: list[str], state_dir: Path, profile: Path, seconds: float = 8) -> dict:
    state_dir.mkdir(parents=True, exist_ok=True)
    return tuned_rl_json(["diagnose", *args, "--seconds", str(seconds), "--write-profile", str(profile),
                          "--save-raw", str(state_dir / "raw.json")], state_dir, seconds + 120)


def run_noisy(state_dir: Path) -> Case:
    original = placement()
    workload = [sys.executable, str(Path(__file__).parent / "workload.py"), "--marker", MARKER, "--clients", "4",
                "--period-us", "1000"]
    profile = state_dir / "diagnosed.toml"
    started = time.monotonic()
    with processes([workload]):
        time.sleep(3)
        with processes([hog_command()] * 3):
            time.sleep(1)
            diagnosis = diagnose(["--target", f"name:{MARKER}"], state_dir, profile)
            report, _ = apply_profile(profile.read_text(), state_dir)
            rollback(state_dir)
    return Case("noisy", diagnosis, profile.read_text(), report, not placement_differences(original, placement()),
                time.monotonic() - started, (state_dir / "raw.json").read_text())


def run_rt(state_dir: Path) -> Case:
    profile = state_dir / "diagnosed.toml"
    started = time.monotonic()
    with cgroup(CPU, RT_CGROUP, {"cpu.rt_runtime_us": "500000"}) as directory:
        with rt_actors(directory):
            diagnosis = diagnose(["--target", "canary", "--canary-cgroup", str(directory), "--canary-policy",
                                  "SCHED_FIFO", "--canary-priority", "50", "--canary-period-us", "2000",
                                  "--canary-threads", "4"], state_dir, profile)
            report, _ = apply_profile(profile.read_text(), state_dir)
            rollback(state_dir)
            restored = (directory / "cpu.rt_runtime_us").read_text().strip() == "500000"
    return Case("rt", diagnosis, profile.read_text(), report, restored, time.monotonic() - started,
                (state_dir / "raw.json").read_text())


CASES = {"noisy": run_noisy, "rt": run_rt}


if __name__ == "__main__":
    import tempfile
    chosen = [sys.argv[sys.argv.index("--case") + 1]] if "--case" in sys.argv else list(CASES)
    for name in chosen:
        with tempfile.TemporaryDirectory() as state:
            case = CASES[name](Path(state))
        print(case.row(), flush=True)
        if "--show" in sys.argv:
            print(case.profile)
        if "--record" in sys.argv:  # the recordings tests/test_diagnose.py replays
            (Path(sys.argv[sys.argv.index("--record") + 1]) / f"diagnose_{name}.json").write_text(case.raw)
