"""The apply report as Prometheus metrics, for node_exporter's textfile collector.

    tuned-rl apply PROFILE --metrics-file /var/lib/node_exporter/textfile_collector/tuned_rl.prom

Written atomically (a temporary file in the same directory, then rename), so the collector
never reads half a file. Per step: its outcome, and its p50 / p99 / p999 before and after;
for the run: when it ended, how long it took, and its exit status.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from tuned_rl.core.report import OUTCOMES, Report

QUANTILES = (("0.5", "p50_us"), ("0.99", "p99_us"), ("0.999", "p999_us"))


def render(report: Report, started: float, ended: float, status: int) -> str:
    profile = {"profile": report.profile}
    lines = [
        "# HELP tuned_rl_step_outcome A step of the last apply: 1 for its outcome, 0 for the others.",
        "# TYPE tuned_rl_step_outcome gauge",
    ]
    latency = [
        "# HELP tuned_rl_step_latency_seconds The target's run-queue latency without (before) and with (after) "
        "the step.",
        "# TYPE tuned_rl_step_latency_seconds gauge",
    ]
    for step in report.steps:
        labels = {**profile, "plugin": step.plugin, "step": step.step}
        for outcome in OUTCOMES:
            lines.append(_sample("tuned_rl_step_outcome", {**labels, "outcome": outcome},
                                 1 if step.outcome == outcome else 0))
        for arm, figures in (("before", step.before), ("after", step.after)):
            for quantile, key in QUANTILES:
                if figures and figures.get(key) is not None:
                    latency.append(_sample("tuned_rl_step_latency_seconds", {**labels, "arm": arm,
                                                                              "quantile": quantile},
                                           figures[key] / 1e6))
    lines += latency
    lines += [
        "# HELP tuned_rl_apply_timestamp_seconds When the last apply ended (Unix time).",
        "# TYPE tuned_rl_apply_timestamp_seconds gauge",
        _sample("tuned_rl_apply_timestamp_seconds", profile, ended),
        "# HELP tuned_rl_apply_duration_seconds How long the last apply took.",
        "# TYPE tuned_rl_apply_duration_seconds gauge",
        _sample("tuned_rl_apply_duration_seconds", profile, ended - started),
        "# HELP tuned_rl_apply_exit_status The last apply's exit status (0: done; 1: a step failed).",
        "# TYPE tuned_rl_apply_exit_status gauge",
        _sample("tuned_rl_apply_exit_status", profile, status),
    ]
    return "\n".join(lines) + "\n"


def write(path: str | os.PathLike, text: str) -> None:
    """Replace ``path`` atomically with ``text`` (mode 0644: the collector runs as another user)."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            os.fchmod(handle.fileno(), 0o644)  # the file opened, not whatever the name points to by then
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _sample(name: str, labels: dict, value: float) -> str:
    text = ",".join(f'{key}="{_escape(str(val))}"' for key, val in labels.items())
    return f"{name}{{{text}}} {value:.9g}" if isinstance(value, float) else f"{name}{{{text}}} {value}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
