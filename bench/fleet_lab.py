"""A fleet lab on one machine: nodes simulated as small exporters on loopback, a real Prometheus
scraping them, and the real `tuned-rl fleet judge` asking that Prometheus.

    .venv/bin/python bench/fleet_lab.py [--window 40] [--step 5] [--ratio 2.0]

The simulation is the nodes' latency and nothing else. Each node serves, on its own 127.0.0.1 port,
the histogram watch serves (`tuned_rl_runqueue_latency_seconds`, watch's bucket bounds and labels),
its counts a recorded canary run (bench/data/canary8k_jobs: 0.25 s windows of a real canary's
waits) replayed in real time from an offset of its own, scaled by a factor of its own. The
"regressed" nodes' waits are multiplied by ``--ratio`` from the change on. One control node's
counters start again from zero mid-window (watch restarted) and one stops answering (the node
went away). Prometheus (Debian's package, started here with its own configuration and data in a
temporary directory, scraping every second) stores them; the judge reads only Prometheus.

It waits out a window before the change and one after, then judges the regressed nodes and the
unchanged ("treated" but not regressed) nodes against the control nodes, and prints each verdict and
each node's p999 beside PromQL's own ``histogram_quantile(0.999, sum by (node, le)
(increase(...[window])))`` over the same window, in buckets. tests/kernel/test_fleet_lab_kernel.py
runs it.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from fleet_sim import BOUNDS_S, Recording, coarse  # noqa: E402

RECORDING = "canary8k_jobs"
LE = [repr(b) for b in BOUNDS_S[:-1]] + ["+Inf"]


class Replay:
    """A recording's cumulative watch buckets at any window index (looping), for one scale factor."""

    def __init__(self, recording: Recording, factor: float):
        self.windows = recording.windows
        self.cumulative = np.array([coarse(recording.prefix[k], recording.below_prefix[k], factor)
                                    for k in range(recording.windows + 1)]).round().astype(np.int64)

    def at(self, index: int) -> np.ndarray:
        loops, rest = divmod(index, self.windows)
        return loops * self.cumulative[-1] + self.cumulative[rest]


@dataclass
class LabNode:
    name: str
    group: str  # regressed, unchanged, control
    offset: int  # the recording window it starts at
    plain: Replay
    worse: Replay | None = None  # its waits from the change on
    reset_at: float | None = None  # its counters start again from 0 here (watch restarted)
    stop_at: float | None = None  # it stops answering here
    server: ThreadingHTTPServer | None = None
    started: float = 0.0
    change_at: float = math.inf
    window_s: float = 0.25
    served: list = field(default_factory=list)

    def counts(self, now: float) -> np.ndarray:
        since = self.started if self.reset_at is None or now < self.reset_at else self.reset_at
        first = self.offset + int((since - self.started) / self.window_s)
        last = self.offset + int((now - self.started) / self.window_s)
        if self.worse is None or now <= self.change_at:
            return self.plain.at(last) - self.plain.at(first)
        turn = max(first, self.offset + int((self.change_at - self.started) / self.window_s))
        return self.plain.at(turn) - self.plain.at(first) + self.worse.at(last) - self.worse.at(turn)

    def exposition(self, now: float) -> bytes:
        return histogram_exposition(self.counts(now), f'target="canary",profile="lab",profile_digest="0123456789abcdef",'
                                                      f'node_class="lab-{self.group}"')


def histogram_exposition(counts: np.ndarray, labels: str) -> bytes:
    """watch's latency histogram, as /metrics serves it, with these cumulative bucket counts."""
    lines = ["# TYPE tuned_rl_runqueue_latency_seconds histogram"]
    lines += [f'tuned_rl_runqueue_latency_seconds_bucket{{{labels},le="{le}"}} {int(c)}' for le, c in zip(LE, counts)]
    lines += [f"tuned_rl_runqueue_latency_seconds_count{{{labels}}} {int(counts[-1])}",
              f"tuned_rl_runqueue_latency_seconds_sum{{{labels}}} 0"]
    return ("\n".join(lines) + "\n").encode()


def serve_node(node: LabNode) -> None:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            now = time.time()
            if node.stop_at is not None and now >= node.stop_at:
                self.send_error(503)
                return
            body = node.exposition(now)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):  # a scrape Prometheus gave up on (its timeout)
                pass

        def log_message(self, *args):
            pass

    node.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=node.server.serve_forever, daemon=True).start()


class Prometheus:
    """Debian's prometheus, on a free loopback port, scraping ``nodes`` every second."""

    def __init__(self, nodes: list[LabNode], directory: Path):
        binary = shutil.which("prometheus")
        if binary is None:
            raise SystemExit("prometheus is not installed (apt-get install prometheus; tools/setup.sh does)")
        scrape = []
        for node in nodes:
            host, port = node.server.server_address
            scrape.append({"targets": [f"{host}:{port}"], "labels": {"node": node.name, "group": node.group}})
        config = {"global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
                  "scrape_configs": [{"job_name": "tuned-rl-lab", "static_configs": scrape}]}
        (directory / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
        with socket_port() as port:
            self.url = f"http://127.0.0.1:{port}"
        self.log = open(directory / "prometheus.log", "wb")
        self.process = subprocess.Popen(
            [binary, f"--config.file={directory / 'prometheus.yml'}", f"--storage.tsdb.path={directory / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.url.rsplit(':', 1)[1]}", "--storage.tsdb.retention.time=1d"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                if self.process.poll() is not None:
                    raise SystemExit(f"prometheus exited: {(directory / 'prometheus.log').read_text()[-2000:]}")
                time.sleep(0.2)
        raise SystemExit("prometheus did not become ready in 60 s")

    def instant(self, query: str, at: float) -> list[dict]:
        address = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": query, "time": f"{at:.3f}"})
        with urllib.request.urlopen(address, timeout=30) as answer:
            return json.loads(answer.read())["data"]["result"]

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


class socket_port:
    """A free loopback port (bound, then released for the server to take)."""

    def __enter__(self) -> int:
        import socket
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        return self.sock.getsockname()[1]

    def __exit__(self, *exc) -> None:
        self.sock.close()


def stop_lab(prometheus: Prometheus, nodes: list) -> None:
    prometheus.stop()
    for node in nodes:
        node.server.shutdown()
        node.server.server_close()


def judge(prometheus: Prometheus, treated_group: str, end: float, changed_at: float, window: float,
          step: float, control: str = 'group="control"') -> tuple[int, dict]:
    """`tuned-rl fleet judge --json` as a user runs it: its exit status and its report."""
    command = [str(ROOT / ".venv/bin/tuned-rl"), "fleet", "judge", "--prometheus", prometheus.url,
               "--selector", 'job="tuned-rl-lab"', "--treated", f'group="{treated_group}"', "--control",
               control, "--node-label", "node", "--end", f"{end:.3f}", "--window", f"{window:g}",
               "--step", f"{step:g}", "--changed-at", f"{changed_at:.3f}", "--json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if done.returncode not in (0, 1, 3):
        raise SystemExit(f"fleet judge exited {done.returncode}: {done.stderr}")
    return done.returncode, json.loads(done.stdout)


def promql_p999(prometheus: Prometheus, end: float, window: float) -> dict[str, float]:
    """PromQL's own p999 of each node over the window, in seconds."""
    query = (f'histogram_quantile(0.999, sum by (node, le) (increase(tuned_rl_runqueue_latency_seconds_bucket'
             f'{{job="tuned-rl-lab"}}[{int(window)}s])))')
    return {r["metric"]["node"]: float(r["value"][1]) for r in prometheus.instant(query, end)}


def bucket_index(seconds: float) -> int:
    return int(np.searchsorted(BOUNDS_S, seconds - 1e-12))


def run_lab(window: float = 40.0, step: float = 5.0, ratio: float = 2.0, per_group: int = 10, seed: int = 1,
            say=print) -> dict:
    rng = np.random.default_rng(seed)
    recording = Recording(RECORDING)
    factors = {}
    nodes = []
    for group in ("regressed", "unchanged", "control"):
        for number in range(per_group):
            factor = float(math.exp(rng.normal(0, 0.1)))
            key = round(factor, 6)
            plain = factors.setdefault(key, Replay(recording, factor))
            worse = Replay(recording, factor * ratio) if group == "regressed" else None
            nodes.append(LabNode(f"{group}-{number}", group, int(rng.integers(recording.windows)), plain, worse,
                                 window_s=recording.window_s))
    with tempfile.TemporaryDirectory(prefix="tuned-rl-fleet-lab-") as directory:
        for node in nodes:
            node.started = time.time()
            serve_node(node)
        prometheus = Prometheus(nodes, Path(directory))
        try:
            began = time.time() + 3  # the first scrapes land before the window before the change opens
            changed_at = began + window
            end = changed_at + window
            for node in nodes:
                node.change_at = changed_at
            nodes[-1].reset_at = changed_at + window / 2  # control-3's watch restarts mid-window
            nodes[-2].stop_at = changed_at + window * 0.75  # control-2 goes away for the last quarter
            say(f"lab: {len(nodes)} nodes scraped by {prometheus.url}; windows of {window:g} s before and after "
                f"the change, sub-windows of {step:g} s; regressed nodes x{ratio:g}")
            time.sleep(max(0.0, end + 2.5 - time.time()))  # the last scrape at or after the end is in
            results = {}
            for group in ("regressed", "unchanged"):
                status, report = judge(prometheus, group, end, changed_at, window, step)
                results[group] = {"exit": status, "report": report}
                say(f"judge {group} v control: exit {status}: {report['outcome']}: {report['reason']}")
            odd = f"{nodes[-1].name}|{nodes[-2].name}"
            for group in ("regressed", "unchanged"):  # the restarted and the vanished node left out by hand
                status, report = judge(prometheus, group, end, changed_at, window, step,
                                       f'group="control",node!~"{odd}"')
                results[f"{group} without {odd}"] = {"exit": status, "report": report}
                say(f"judge {group} v control without {odd}: exit {status}: {report['outcome']}: {report['reason']}")
            promql = promql_p999(prometheus, end, window)
            rows = []
            for group in ("regressed", "unchanged"):
                for figures in results[group]["report"]["nodes"]:
                    if figures["group"] == "control" and group == "unchanged":
                        continue
                    own = figures["p999_us"]
                    theirs = promql.get(figures["node"])
                    apart = (abs(bucket_index(own / 1e6) - bucket_index(theirs)) if own is not None and theirs is not None
                             and math.isfinite(theirs) else None)
                    rows.append({"node": figures["node"], "judge_p999_us": own,
                                 "promql_p999_us": round(theirs * 1e6, 1) if theirs is not None else None,
                                 "buckets_apart": apart, "left_out": figures["left_out"], "notes": figures["notes"]})
            for row in rows:
                say(f"  {row['node']:<12} judge p999 {row['judge_p999_us']} us, PromQL {row['promql_p999_us']} us, "
                    f"{row['buckets_apart']} bucket(s) apart; {row['left_out'] or ''} {'; '.join(row['notes'])}")
            return {"results": results, "p999": rows, "prometheus": prometheus.url}
        finally:
            stop_lab(prometheus, nodes)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--window", type=float, default=40.0, help="seconds before and after the change")
    parser.add_argument("--step", type=float, default=5.0, help="the judge's sub-window")
    parser.add_argument("--ratio", type=float, default=2.0, help="the regressed nodes' waits times this")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    run_lab(args.window, args.step, args.ratio, seed=args.seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
