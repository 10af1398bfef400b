"""watch's Prometheus endpoint: ``tuned-rl watch --metrics-address [ADDRESS]`` serves /metrics.

Loopback unless told otherwise: a port alone, ``localhost`` or no value at all serve on 127.0.0.1.
Another address is served only when named as an IP address (``10.0.0.5:9464``, ``[::]:9464``,
``0.0.0.0:9464``): a host name is refused, since it may resolve to a non-loopback address nobody
meant to expose.

What it serves (prometheus_client's text format; each family is read from watch's own figures
when scraped, nothing is kept twice):

- ``tuned_rl_runqueue_latency_seconds`` (histogram, per target): every wait the kernel measured
  since watch started, in buckets on the kernel's own bucket bounds (four per doubling, 1 µs to 8.6 s),
  labelled with what a fleet query groups nodes by: ``profile`` and ``profile_digest`` (the applied
  profile's name and the digest of its merged tables, as ``status`` names them) and ``node_class``
  (``--node-class``, what the operator calls this kind of node); one series set per node, never
  one per process;
- ``tuned_rl_runqueue_waits_over_threshold_total`` (per target and CPU), counted in the kernel;
  ``tuned_rl_alarm_threshold_seconds``; ``tuned_rl_alarms_total``, ``tuned_rl_alarms_suppressed_total``;
- ``tuned_rl_window_latency_seconds`` (p99 and p999 of the sliding window), ``tuned_rl_verified_p999_seconds``,
  ``tuned_rl_regressions_total``;
- ``tuned_rl_probe_lost_events_total`` (waits the probe could not measure),
  ``tuned_rl_watch_process_events_lost_total`` (process events the kernel dropped);
- ``tuned_rl_steps`` (the applied profile's verified steps, per outcome: kept, reverted, inconclusive);
- ``tuned_rl_watch_processes_placed_total``, ``tuned_rl_watch_processes_evicted_total``,
  ``tuned_rl_watch_cpu_seconds_total`` (watch's own CPU time), ``tuned_rl_watch_resident_memory_bytes``
  (its resident memory, from psutil).
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import re
import socket
import time
from dataclasses import dataclass
from typing import Callable

from tuned_rl.core.outcomes import Outcome

DEFAULT_ADDRESS = "127.0.0.1:9464"
# Any local user can connect to a loopback port: without a cap, each idle connection held a thread
# and a descriptor until watch ran out of them (~1,000 under systemd's default soft limit of 1,024)
# and exited. A scrape is one short request, answered in milliseconds: at the cap, a new connection
# ends the oldest (a burst of idle connections cannot keep the next scrape out), and one open past
# the deadline is shut down.
MAX_CONNECTIONS = 8
REQUEST_DEADLINE_S = 5.0
OUTCOMES = (Outcome.KEPT, Outcome.REVERTED, Outcome.INCONCLUSIVE)
# Bucket bounds: every fourth of the kernel's fine buckets (16 per doubling), from 2^10 ns to 2^33 ns.
FIRST_DOUBLING, LAST_DOUBLING = 10, 33
BOUNDS = [(doubling * 16 + 4 * quarter, (4 + quarter) << (doubling - 2))
          for doubling in range(FIRST_DOUBLING, LAST_DOUBLING) for quarter in range(4)] + [(LAST_DOUBLING * 16, 1 << LAST_DOUBLING)]


NODE_CLASS_PATTERN = re.compile(r"[A-Za-z0-9_.:/-]{1,64}")


def check_node_class(text: str) -> str:
    """``--node-class``: a label value a fleet query selects by (letters, digits, ``_.:/-``; 64 at most)."""
    if not NODE_CLASS_PATTERN.fullmatch(text):
        raise ValueError(f"a node class is 1-64 letters, digits or _.:/- (such as a100-6.1), not {text!r}")
    return text


class AddressError(ValueError):
    """--metrics-address names nothing watch may serve on."""


@dataclass(frozen=True)
class Address:
    host: str
    port: int

    @property
    def loopback(self) -> bool:
        return ipaddress.ip_address(self.host).is_loopback

    @property
    def family(self) -> int:
        return socket.AF_INET6 if ipaddress.ip_address(self.host).version == 6 else socket.AF_INET

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_address(text: str | None) -> Address:
    """``PORT``, ``:PORT``, ``localhost:PORT``, ``IPV4:PORT`` or ``[IPV6]:PORT`` (None: the default)."""
    text = DEFAULT_ADDRESS if text is None else text.strip()
    host, port_text = "127.0.0.1", text
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or not rest.startswith(":"):
            raise AddressError(f"{text!r}: write an IPv6 address as [ADDRESS]:PORT")
        port_text = rest[1:]
    elif ":" in text:
        host, _, port_text = text.rpartition(":")
        host = host or "127.0.0.1"
    if host == "localhost":
        host = "127.0.0.1"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise AddressError(f"{host!r} is not an IP address: name the address to serve on (a host name may resolve "
                           "to one reachable from other hosts); 127.0.0.1 is loopback") from None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise AddressError(f"{text!r}: the port must be a number from 1 to 65535")
    return Address(host, int(port_text))


def buckets(counts, sum_ns: int) -> tuple[list[tuple[str, int]], float]:
    """The kernel's fine-bucket counts as cumulative (le, count) pairs in seconds, and the sum in seconds."""
    cumulative = counts.cumsum()
    pairs = [(repr(bound_ns / 1e9), int(cumulative[index - 1])) for index, bound_ns in BOUNDS]
    return pairs + [("+Inf", int(cumulative[-1]))], sum_ns / 1e9


class WatchCollector:
    """prometheus_client's custom collector: each scrape asks ``figures()`` for a WatchFigures."""

    def __init__(self, figures: Callable[[], "WatchFigures"]):
        self.figures = figures

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        f = self.figures()
        target = [f.target] if f.target else None
        state = f.telemetry
        if target and state is not None and state.totals is not None:
            totals = state.totals
            histogram = HistogramMetricFamily("tuned_rl_runqueue_latency_seconds",
                                              "Run-queue latency of the target's threads (wakeup or preemption to "
                                              "running), every wait since watch started, measured in the kernel.",
                                              labels=["target", "profile", "profile_digest", "node_class"])
            bucket_pairs, total_s = buckets(totals.counts, totals.sum_ns)
            histogram.add_metric([f.target, f.profile, f.profile_digest, f.node_class], bucket_pairs, total_s)
            yield histogram
            over = CounterMetricFamily("tuned_rl_runqueue_waits_over_threshold",
                                       "Waits of the target at least as long as the alarm threshold, counted in the "
                                       "kernel, per CPU the wait ended on.", labels=["target", "cpu"])
            for cpu, count in sorted(totals.over_threshold.items()):
                over.add_metric([f.target, str(cpu)], count)
            yield over
            yield _family(GaugeMetricFamily, "tuned_rl_alarm_threshold_seconds", "The alarm threshold (--alarm-ms).",
                         target, f.alarm_s)
            yield _family(CounterMetricFamily, "tuned_rl_probe_lost_events",
                           "Waits of the target the probe could not measure (no room in a map, or a switch missed).",
                           target, totals.lost)
            yield _family(CounterMetricFamily, "tuned_rl_alarms", "Alarms watch reported.", target, state.alarms)
            yield _family(CounterMetricFamily, "tuned_rl_alarms_suppressed",
                           "Long waits not reported as alarms by the rate limit (each is in the over-threshold count).",
                           target, state.alarms_suppressed)
            yield _family(CounterMetricFamily, "tuned_rl_regressions",
                           "Times the sliding window's p999 passed the verified p999 times the factor.",
                           target, state.regressions)
            window = GaugeMetricFamily("tuned_rl_window_latency_seconds",
                                       "The target's run-queue latency over the sliding window (--regressed-window-seconds).",
                                       labels=["target", "quantile"])
            if state.window is not None and state.window.waits:
                window.add_metric([f.target, "0.99"], round(state.window.p99_us / 1e6, 9))
                window.add_metric([f.target, "0.999"], round(state.window.p999_us / 1e6, 9))
            yield window
            if state.verified_p999_us:
                yield _family(GaugeMetricFamily, "tuned_rl_verified_p999_seconds",
                             "The target's p999 as the profile's last verified step left it.", target,
                             round(state.verified_p999_us / 1e6, 9))
            yield _family(CounterMetricFamily, "tuned_rl_attribution_attached_seconds",
                           "Time the attributing probe ran (around long waits and regressions).", target,
                           state.attribution_attached_s)
        steps = GaugeMetricFamily("tuned_rl_steps", "The applied profile's verified steps, by outcome.",
                                  labels=["profile", "outcome"])
        for outcome in OUTCOMES:
            steps.add_metric([f.profile, outcome], f.outcomes.get(outcome, 0))
        yield steps
        for name, text, value in (
                ("tuned_rl_watch_processes_placed", "Processes watch placed (pinned, bound, FIFO removed) since it started.",
                 f.placed),
                ("tuned_rl_watch_processes_evicted", "Processes watch evicted since it started.", f.evicted),
                ("tuned_rl_watch_process_events_lost", "Process events the kernel dropped (each answered by a rescan).",
                 f.events_lost),
                ("tuned_rl_watch_cpu_seconds", "CPU time watch used (user and system).", f.cpu_seconds)):
            yield _family(CounterMetricFamily, name, text, None, value)
        yield _family(GaugeMetricFamily, "tuned_rl_watch_resident_memory_bytes",
                      "Memory watch holds now (its resident set, from psutil).", None, f.resident_bytes)


@dataclass(frozen=True)
class WatchFigures:
    target: str
    profile: str
    telemetry: object  # telemetry.TelemetryState or None
    alarm_s: float
    outcomes: dict
    placed: int
    evicted: int
    events_lost: int
    cpu_seconds: float
    resident_bytes: int = 0
    profile_digest: str = ""
    node_class: str = ""


def figures_of(watcher, node_class: str = "") -> WatchFigures:
    """What a scrape shows of a running Watcher (read from the server's thread: only whole values)."""
    telemetry, applied = watcher.telemetry, watcher.applied
    outcomes: dict[str, int] = {}
    for verdict in applied.verdicts() if applied is not None else []:
        outcomes[verdict.get("outcome")] = outcomes.get(verdict.get("outcome"), 0) + 1
    return WatchFigures(str(telemetry.target) if telemetry else "", applied.profile if applied else "",
                        telemetry.state if telemetry else None, telemetry.settings.alarm_ms / 1e3 if telemetry else 0.0,
                        outcomes, watcher.stats.placed, watcher.stats.evicted, watcher.stats.lost, time.process_time(),
                        _own_process().memory_info().rss, (applied.digest or "") if applied else "", node_class)


@functools.lru_cache(maxsize=1)
def _own_process():
    """watch's own process, as psutil reads it (one object: psutil keeps its /proc file handles)."""
    import psutil
    return psutil.Process()


def _family(cls, name, text, target, value):
    """A gauge or counter family of one sample, labelled with the target when one is given."""
    family = cls(name, text, labels=["target"] if target else None)
    family.add_metric(target or [], value)
    return family


def serve(address: Address, figures: Callable[[], WatchFigures], max_connections: int = MAX_CONNECTIONS,
          deadline_s: float = REQUEST_DEADLINE_S):
    """Serve /metrics on ``address`` from a daemon thread; returns the server (``shutdown()`` ends it).

    At most ``max_connections`` are served at once (a new one ends the oldest), each for at most
    ``deadline_s``: whatever other users do with the port, watch holds at most twice that many
    descriptors and threads for it, and the scrape after a burst is served."""
    import threading
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    from prometheus_client import CollectorRegistry, make_wsgi_app

    registry = CollectorRegistry(auto_describe=False)
    registry.register(WatchCollector(figures))
    metrics = make_wsgi_app(registry)

    def app(environ, start_response):
        if environ.get("PATH_INFO") not in ("/metrics", "/"):
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"tuned-rl serves /metrics\n"]
        return metrics(environ, start_response)

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True
        address_family = address.family
        request_queue_size = 1024  # a burst of connects is queued, accepted and closed without the callers' SYN retries
        refused = 0
        errors = 0  # connections that ended in an error (a timeout, a reset)

        def server_activate(self):
            self._open: dict = {}  # each connection being served -> when it was accepted (monotonic)
            self._ending: set = set()  # those shut down, their threads closing them
            self._open_lock = threading.Lock()
            super().server_activate()

        def verify_request(self, request, client_address) -> bool:
            """Admit each connection; at ``max_connections`` end the oldest served (a scraper sends its
            request at once and is answered in milliseconds: the oldest is idle or slow). Refused only
            while as many again are still closing."""
            now = time.monotonic()
            with self._open_lock:
                serving = {r: t for r, t in self._open.items() if r not in self._ending}
                if len(serving) >= max_connections:
                    if len(self._open) >= 2 * max_connections:
                        self.refused += 1
                        return False  # socketserver closes it at once
                    self._end(min(serving, key=serving.get))
                self._open[request] = now
                return True

        def shutdown_request(self, request):
            with self._open_lock:
                self._open.pop(request, None)
                self._ending.discard(request)
            super().shutdown_request(request)

        def handle_error(self, request, client_address):
            """A connection that timed out or broke: counted, never printed (socketserver prints a
            traceback for each, and any local user can make thousands: a flood in journald)."""
            self.errors += 1

        def service_actions(self):
            """Called by serve_forever at least every half second: end the connections past the deadline."""
            now = time.monotonic()
            with self._open_lock:
                for request, accepted in list(self._open.items()):
                    if now - accepted > deadline_s and request not in self._ending:
                        self._end(request)

        def _end(self, request) -> None:
            """Shut a connection down: the thread blocked reading it wakes, and closes it."""
            self._ending.add(request)
            with contextlib.suppress(OSError):
                request.shutdown(socket.SHUT_RDWR)

    class Quiet(WSGIRequestHandler):
        timeout = deadline_s  # each read of the request waits at most this long

        def log_message(self, *args):  # a scrape every 15 s is not news
            pass

    server = make_server(address.host, address.port, app, Server, handler_class=Quiet)
    threading.Thread(target=server.serve_forever, name="tuned-rl-metrics", daemon=True).start()
    return server
