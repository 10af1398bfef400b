"""watch's /metrics: which addresses it serves on, and what a scrape shows, parsed with
prometheus_client's own parser."""

from __future__ import annotations
import os

import urllib.error
import urllib.request

import numpy as np
import pytest

from tuned_rl.measure.probes.bpf import FINE_BUCKETS, fine_bucket_range
from tuned_rl.measure.probes.continuous import Totals
from tuned_rl.watch.alarms import WindowFigures
from tuned_rl.watch.metrics_endpoint import BOUNDS, AddressError, WatchCollector, WatchFigures, parse_address, serve
from tuned_rl.watch.telemetry import TelemetryState

prometheus = pytest.importorskip("prometheus_client")


@pytest.mark.parametrize("text, host, port", [
    (None, "127.0.0.1", 9464), ("9464", "127.0.0.1", 9464), (":9100", "127.0.0.1", 9100),
    ("localhost:9464", "127.0.0.1", 9464), ("[::1]:9464", "::1", 9464),
    ("10.0.0.5:9464", "10.0.0.5", 9464), ("0.0.0.0:9464", "0.0.0.0", 9464), ("[::]:9464", "::", 9464)])
def test_loopback_unless_an_ip_address_is_named(text, host, port):
    address = parse_address(text)
    assert (address.host, address.port) == (host, port)
    assert address.loopback == (host in ("127.0.0.1", "::1"))


@pytest.mark.parametrize("text, says", [
    ("metrics.example.com:9464", "not an IP address"), ("node1:9464", "not an IP address"),
    ("127.0.0.1:0", "port"), ("127.0.0.1:70000", "port"), ("127.0.0.1:http", "port"), ("[::1]9464", "IPv6")])
def test_a_host_name_or_a_bad_port_is_refused(text, says):
    with pytest.raises(AddressError, match=says):
        parse_address(text)


def test_the_cli_refuses_a_host_name_before_it_changes_anything(cli):
    status, _, err = cli("watch", "--metrics-address", "example.com:9464")
    assert status == 2 and "not an IP address" in err


def test_bucket_bounds_are_the_kernels_own():
    for index, bound_ns in BOUNDS:
        assert fine_bucket_range(index)[0] == bound_ns  # each bound opens a kernel bucket: none is split
    assert BOUNDS[0][1] == 1024 and BOUNDS[-1][1] == 1 << 33 and len(BOUNDS) == 93


def figures(counts, over=None, window=None) -> WatchFigures:
    totals = Totals(counts, 123_456_789, 20_000_000, over or {0: 0, 1: 2}, 5, 0)
    state = TelemetryState(totals, window, 250.0, alarms=2, alarms_suppressed=7, regressions=1,
                           attribution_attached_s=31.5)
    return WatchFigures('name:model"\n', "node", state, 0.010, {"kept": 2, "reverted": 1}, 3, 4, 0, 1.25,
                        48_000_000, "0123456789abcdef", "a100-6.1")


def scrape_text(figures_fn) -> str:
    from prometheus_client import CollectorRegistry, generate_latest
    registry = CollectorRegistry(auto_describe=False)
    registry.register(WatchCollector(figures_fn))
    return generate_latest(registry).decode()


def samples(text: str) -> dict:
    from prometheus_client.parser import text_string_to_metric_families
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(text)
            for s in f.samples}


def test_a_scrape_parses_and_its_histogram_holds_the_kernels_counts():
    counts = np.zeros(FINE_BUCKETS, dtype=np.int64)
    counts[15 * 16 + 9] = 900   # 50 µs .. 51.2 µs: under the 2^15 * 1.75 = 57.3 µs bound
    counts[22 * 16 + 3] = 9     # about 4.9 ms
    counts[40 * 16] = 1         # 18 minutes: past the last bound
    text = scrape_text(lambda: figures(counts, window=WindowFigures(300, 910, 51.2, 4900.0)))
    got = samples(text)
    target = ("target", 'name:model"\n')  # a label value is escaped by prometheus_client, and parses back

    node = [target, ("profile", "node"), ("profile_digest", "0123456789abcdef"), ("node_class", "a100-6.1")]

    def bucket(le):
        return got[("tuned_rl_runqueue_latency_seconds_bucket", tuple(sorted([("le", le), *node])))]
    assert bucket("5.7344e-05") == 900 and bucket("4.9152e-05") == 0
    assert bucket("0.004194304") == 900 and bucket("0.00524288") == 909  # 4.98 ms is in [4.19, 5.24) ms
    assert bucket("+Inf") == 910 and bucket("8.589934592") == 909
    assert got[("tuned_rl_runqueue_latency_seconds_count", tuple(sorted(node)))] == 910
    assert got[("tuned_rl_runqueue_latency_seconds_sum", tuple(sorted(node)))] == pytest.approx(0.123456789)
    # The fleet's labels are the node's, never a process's: one series per bucket, whatever runs.
    assert sum(1 for name, _ in got if name == "tuned_rl_runqueue_latency_seconds_bucket") == len(BOUNDS) + 1
    assert got[("tuned_rl_runqueue_waits_over_threshold_total", tuple(sorted([("cpu", "1"), target])))] == 2
    assert got[("tuned_rl_alarms_suppressed_total", (target,))] == 7
    assert got[("tuned_rl_window_latency_seconds", tuple(sorted([("quantile", "0.999"), target])))] == 0.0049
    assert got[("tuned_rl_verified_p999_seconds", (target,))] == 0.00025
    assert got[("tuned_rl_steps", (("outcome", "reverted"), ("profile", "node")))] == 1
    assert got[("tuned_rl_steps", (("outcome", "inconclusive"), ("profile", "node")))] == 0
    assert got[("tuned_rl_watch_processes_evicted_total", ())] == 4
    assert got[("tuned_rl_watch_cpu_seconds_total", ())] == 1.25
    assert got[("tuned_rl_watch_resident_memory_bytes", ())] == 48_000_000
    assert "# TYPE tuned_rl_runqueue_latency_seconds histogram" in text


def test_without_a_measured_target_only_watchs_own_figures_are_served():
    empty = WatchFigures("", "node", None, 0.0, {}, 0, 0, 2, 0.5)
    got = samples(scrape_text(lambda: empty))
    assert not [k for k in got if k[0].startswith("tuned_rl_runqueue")]
    assert got[("tuned_rl_watch_process_events_lost_total", ())] == 2


def test_the_endpoint_serves_metrics_on_loopback_and_nothing_else():
    from tuned_rl.watch.metrics_endpoint import Address
    server = serve(Address("127.0.0.1", 0), lambda: figures(np.zeros(FINE_BUCKETS, dtype=np.int64)))
    try:
        port = server.server_address[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            assert response.status == 200 and b"tuned_rl_runqueue_latency_seconds_bucket" in response.read()
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/anything", timeout=5)
        assert refused.value.code == 404
    finally:
        server.shutdown()
        server.server_close()


def test_watchs_own_resident_memory_is_read_through_psutil():
    from tuned_rl.watch import metrics_endpoint
    resident = metrics_endpoint._own_process().memory_info().rss
    with open("/proc/self/statm") as handle:
        pages = int(handle.read().split()[1])
    assert resident == pytest.approx(pages * os.sysconf("SC_PAGE_SIZE"), rel=0.2)


SERVER = """
import os, resource, sys, time
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
from tuned_rl.watch.metrics_endpoint import Address, WatchFigures, serve
server = serve(Address("127.0.0.1", 0), lambda: WatchFigures("", "node", None, 0.0, {}, 0, 0, 0, 0.0),
               deadline_s=1.0)
print(server.server_address[1], flush=True)
while True:  # what watch does between scrapes: read the host
    try:
        with open("/proc/self/stat") as handle:
            handle.read()
    except OSError as err:
        print(f"cannot read the host: {err}", file=sys.stderr, flush=True)
        sys.exit(3)
    time.sleep(0.05)
"""


def test_idle_connections_from_other_users_neither_stop_watch_nor_the_next_scrape(tmp_path):
    """Any local user can connect to the loopback port: 400 idle connections against a server whose
    process may hold 64 descriptors. It holds at most MAX_CONNECTIONS of them, ends those past the
    deadline, goes on reading the host, and serves the scrape that follows the burst."""
    import resource
    import socket
    import subprocess
    import sys
    import time

    from tuned_rl.watch.metrics_endpoint import MAX_CONNECTIONS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 600:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 1024), hard))
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    idle = []
    try:
        port = int(server.stdout.readline())
        base_fds = len(os.listdir(f"/proc/{server.pid}/fd"))
        most = 0
        for _ in range(400):
            connection = socket.create_connection(("127.0.0.1", port), timeout=5)
            idle.append(connection)
            if len(idle) % 50 == 0:
                most = max(most, len(os.listdir(f"/proc/{server.pid}/fd")) - base_fds)
        time.sleep(2.0)  # past the deadline: the server ended the ones it accepted
        assert server.poll() is None, server.stderr.read()
        assert most <= 2 * MAX_CONNECTIONS + 2, f"the server held {most} descriptors for idle connections"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            assert response.status == 200 and b"tuned_rl_watch_cpu_seconds_total" in response.read()
        assert server.poll() is None
        server.kill()
        assert "Traceback" not in server.communicate()[1]  # a timed-out idle connection is counted, not printed
    finally:
        for connection in idle:
            connection.close()
        server.kill()
        server.wait()
