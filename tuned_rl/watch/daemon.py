"""`tuned-rl watch` as a daemon: its start-up (priority, signals, the always-on measurement, the
/metrics server, the process connector) around the watcher's loop, and its output, one event a line."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import dataclass

from tuned_rl.core.agent import Agent
from tuned_rl.watch.events import WatchEvent, event_line
from tuned_rl.watch.metrics_endpoint import AddressError, figures_of, parse_address, serve
from tuned_rl.watch.proc_events import ProcEventSource, ProcEventsError
from tuned_rl.watch.telemetry import telemetry_factory
from tuned_rl.watch.watcher import NothingApplied, Watcher, run

FAILED, BAD_INPUT = 1, 2  # exit statuses, as every command's
WATCH_NICE = -10  # watch's own priority: ahead of the nice-0 jobs it moves, behind real-time threads


@dataclass(frozen=True)
class DaemonOptions:
    """What the command line says of a watch (``tuned-rl watch --help`` says what each does, and its defaults)."""

    json: bool
    metrics_address: str | None
    measure: bool
    alarm_ms: float
    regressed_window_s: float
    regressed_factor: float
    rescan_s: float
    warm_up_s: float
    node_class: str = ""


def run_daemon(agent: Agent, options: DaemonOptions) -> int:
    """Watch until SIGTERM or SIGINT; returns the exit status (an error is said on stderr)."""
    address = None
    if options.metrics_address is not None:
        try:
            address = parse_address(options.metrics_address)
            import prometheus_client  # noqa: F401
        except AddressError as err:
            return _fail(f"--metrics-address {err}", BAD_INPUT)
        except ImportError:
            return _fail("--metrics-address needs prometheus_client (apt-get install python3-prometheus-client, "
                         "or pip install prometheus_client)")

    def emit(event: dict) -> None:
        event = {"time": round(time.time(), 3), **event}
        print(json.dumps(event) if options.json else event_line(event), flush=True)

    try:  # the jobs watch must evict are CPU-bound: at nice 0 they would delay it by their slices
        os.setpriority(os.PRIO_PROCESS, 0, WATCH_NICE)
    except OSError:
        pass
    stop = []
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda *_: stop.append(True))
    telemetry_for = telemetry_factory(agent.host, emit, alarm_ms=options.alarm_ms, window_s=options.regressed_window_s,
                                      factor=options.regressed_factor) if options.measure else None
    watcher = Watcher(agent, emit, options.rescan_s, warm_up_seconds=options.warm_up_s, telemetry_for=telemetry_for)
    server = None
    try:
        if address is not None:
            try:
                server = serve(address, lambda: figures_of(watcher, options.node_class))
            except OSError as err:
                return _fail(f"cannot serve metrics on {address}: {err.strerror or err}")
            emit({"event": WatchEvent.SERVING, "url": f"http://{address}/metrics", "loopback": address.loopback})
        with ProcEventSource() as source:
            return run(watcher, source, lambda: bool(stop))
    except (ProcEventsError, NothingApplied) as err:
        return _fail(str(err))
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()


def _fail(message: str, status: int = FAILED) -> int:
    print(f"tuned-rl: watch: {message}", file=sys.stderr)
    return status
