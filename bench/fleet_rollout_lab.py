"""The roll-out play, for real, on a fleet simulated on one machine: its waves, soak, fleet judge and
rollback, against nodes whose latency is the only thing simulated.

    .venv/bin/python bench/fleet_rollout_lab.py [--ratio 2.0] [--nodes 12] [--waves 4 4 100%] [--window 40]

Each node is an Ansible inventory host on this machine (``ansible_connection=local``) with a host
tree of its own (TUNED_RL_HOST_ROOT: the files tuned-rl reads and writes, a sysctl among them) and a
state directory of its own, so the real role applies, journals and rolls back the real profile on
it. Each node also serves, on its own 127.0.0.1 port, the histogram watch serves, replaying a
recorded canary run (bench/data/canary8k_jobs) from an offset of its own; while its tree holds the
profile's value, its waits are multiplied by ``--ratio`` (1: a harmless profile). Debian's real
Prometheus scrapes the nodes every second. The real `ansible-playbook packaging/ansible/rollout.yml`
then rolls the profile out in waves; each wave is soaked ``--window`` seconds and judged by the real
`tuned-rl fleet judge` (the role's module, run on the controller) against the nodes not yet treated.

It prints the play's outcome, each wave's verdict, and every node's value afterwards: with a
harmful ratio the first wave is judged "fail", rolled back and the play stops (the other nodes never
treated); with 1 every wave goes on and every node ends treated. `--check` runs the play in check
mode first (the waves and what each would be compared with; nothing changes). Figures: docs/fleet.md.
tests/kernel/test_fleet_lab_kernel.py runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from fleet_lab import LE, RECORDING, Prometheus, Replay, histogram_exposition, serve_node, stop_lab  # noqa: E402
from fleet_sim import Recording  # noqa: E402

SYSCTL = "/proc/sys/vm/swappiness"
UNTREATED, TREATED = "60", "10"
PROFILE = f"""[profile]
name = "lab-rollout"
description = "the roll-out lab's profile: one sysctl, on each node's own host tree"

[sysctl]
"vm.swappiness" = {TREATED}
"""
PLAY = ROOT / "packaging" / "ansible" / "rollout.yml"
VENV = ROOT / ".venv" / "bin"


class LabNode:
    """One node: a host tree, a state directory, and a latency exporter that reads the tree: while
    the profile's value is in it, its waits are ``ratio`` times the recording's."""

    def __init__(self, name: str, directory: Path, recording: Recording, offset: int, factor: float, ratio: float):
        self.name, self.directory, self.offset = name, directory, offset
        self.plain, self.worse = Replay(recording, factor), Replay(recording, factor * ratio)
        self.window_s = recording.window_s
        self.root, self.state = directory / "root", directory / "state"
        for path, text in ((SYSCTL, UNTREATED), ("/proc/sys/kernel/random/boot_id", "1" * 8 + "-2222-3333-4444-" + "5" * 12),
                           ("/proc/self/mounts", "cgroup2 /sys/fs/cgroup cgroup2 rw,relatime 0 0"),
                           ("/sys/devices/system/cpu/online", "0-1")):
            file = self.root / path.lstrip("/")
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_text(text + "\n")
        self.started = time.time()
        self.index, self.total = offset, np.zeros(len(LE), dtype=np.int64)
        self.lock = threading.Lock()
        self.server: ThreadingHTTPServer | None = None
        self.stop_at: float | None = None  # fleet_lab.serve_node's: it never stops answering
        self.group = "lab"  # fleet_lab.Prometheus's scrape label

    def value(self) -> str:
        return (self.root / SYSCTL.lstrip("/")).read_text().strip()

    def treated(self) -> bool:
        return self.value() == TREATED

    def counts(self, now: float) -> np.ndarray:
        """The cumulative buckets now: each span since the last scrape replayed as the tree says now."""
        with self.lock:
            index = self.offset + int((now - self.started) / self.window_s)
            replay = self.worse if self.treated() else self.plain
            self.total = self.total + replay.at(index) - replay.at(self.index)
            self.index = index
            return self.total.copy()

    def exposition(self, now: float) -> bytes:
        return histogram_exposition(self.counts(now), 'target="canary",profile="lab-rollout",profile_digest="0",'
                                                      'node_class="lab"')


def inventory(nodes: list[LabNode], directory: Path) -> Path:
    hosts = {}
    for node in nodes:
        hosts[node.name] = {
            "ansible_connection": "local", "ansible_python_interpreter": str(VENV / "python"),
            "tuned_rl_state_dir": str(node.state), "tuned_rl_environment": {"TUNED_RL_HOST_ROOT": str(node.root)},
            "tuned_rl_profile_path": str(node.directory / "profile.toml"),
            "tuned_rl_defaults_file": str(node.directory / "default"), "tuned_rl_prometheus_node": node.name}
    path = directory / "inventory.json"
    path.write_text(json.dumps({"lab": {"hosts": hosts}}))  # JSON is YAML
    return path


def play(inventory_path: Path, prometheus: Prometheus, profile: Path, waves: list, window: float, step: float,
         check: bool = False) -> tuple[int, str]:
    extra = {"tuned_rl_rollout_hosts": "lab", "tuned_rl_waves": waves, "tuned_rl_prometheus_url": prometheus.url,
             "tuned_rl_prometheus_selector": 'job="tuned-rl-lab"', "tuned_rl_prometheus_node_label": "node",
             "tuned_rl_canary_window": window, "tuned_rl_judge_step": step, "tuned_rl_install": "none",
             "tuned_rl_executable": str(VENV / "tuned-rl"), "tuned_rl_controller_executable": str(VENV / "tuned-rl"),
             "tuned_rl_profile_src": str(profile), "tuned_rl_verify": False, "ansible_become": False}
    command = [str(VENV / "ansible-playbook"), "-i", str(inventory_path), str(PLAY), "-e", json.dumps(extra)]
    command += ["--check", "--diff"] if check else []
    environment = {**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_HOST_KEY_CHECKING": "0",
                   "PATH": f"{VENV}:{os.environ.get('PATH', '')}"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600, env=environment)
    return done.returncode, done.stdout + done.stderr


def verdicts(output: str) -> list[str]:
    """The play's lines saying what the judge decided of each wave (once: a stop is said by every node of the wave)."""
    lines = [m.group(1).strip() for m in re.finditer(r'"msg": "(wave [^"]*|the roll-out stopped[^"]*)"', output)]
    return list(dict.fromkeys(lines))


def run_lab(ratio: float = 2.0, nodes: int = 12, waves: list | None = None, window: float = 40.0, step: float = 5.0,
            check: bool = False, seed: int = 1, say=print) -> dict:
    waves = waves or [4, 4, "100%"]
    rng = np.random.default_rng(seed)
    recording = Recording(RECORDING)
    with tempfile.TemporaryDirectory(prefix="tuned-rl-rollout-lab-") as name:
        directory = Path(name)
        lab = [LabNode(f"node{k}", directory / f"node{k}", recording, int(rng.integers(recording.windows)),
                       float(np.exp(rng.normal(0, 0.1))), ratio) for k in range(nodes)]
        profile = directory / "profile.toml"
        profile.write_text(PROFILE)
        for node in lab:
            serve_node(node)
        prometheus = Prometheus(lab, directory)
        result: dict = {"ratio": ratio, "waves": waves}
        try:
            hosts = inventory(lab, directory)
            if check:
                status, output = play(hosts, prometheus, profile, waves, window, step, check=True)
                result["check"] = {"exit": status, "verdicts": verdicts(output),
                                   "values": {n.name: n.value() for n in lab}}
                say(f"check mode: exit {status}; values unchanged: "
                    f"{all(v == UNTREATED for v in result['check']['values'].values())}")
                for line in result["check"]["verdicts"]:
                    say(f"  {line}")
            say(f"lab: {nodes} nodes scraped by {prometheus.url}; treated nodes' waits x{ratio:g}; waves {waves}, "
                f"each soaked {window:g} s; the window before the first wave fills first")
            time.sleep(window + 3)
            started = time.monotonic()
            status, output = play(hosts, prometheus, profile, waves, window, step)
            result.update({"exit": status, "seconds": round(time.monotonic() - started, 1), "verdicts": verdicts(output),
                           "values": {n.name: n.value() for n in lab},
                           "records": {n.name: sorted(p.name for p in (n.state / "journal").glob("*"))
                                       for n in lab},
                           "output": output})
            say(f"play: exit {status} in {result['seconds']} s")
            for line in result["verdicts"]:
                say(f"  {line}")
            say("values: " + ", ".join(f"{k}={v}" for k, v in result["values"].items()))
            return result
        finally:
            stop_lab(prometheus, lab)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ratio", type=float, default=2.0, help="a treated node's waits times this (1: harmless)")
    parser.add_argument("--nodes", type=int, default=12)
    parser.add_argument("--waves", nargs="+", default=["4", "4", "100%"], help="the play's serial, wave by wave")
    parser.add_argument("--window", type=float, default=40.0, help="the soak and each judged window, seconds")
    parser.add_argument("--step", type=float, default=5.0, help="the judge's sub-window, seconds")
    parser.add_argument("--check", action="store_true", help="first run the play in check mode")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    waves = [int(w) if w.isdigit() else w for w in args.waves]
    result = run_lab(args.ratio, args.nodes, waves, args.window, args.step, args.check, args.seed)
    if result["exit"] not in (0, 2):
        print(result["output"][-4000:])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
