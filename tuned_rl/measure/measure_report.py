"""What `tuned-rl measure` prints: one measurement of a target, as JSON and as a table."""

from __future__ import annotations

from dataclasses import dataclass

from tuned_rl.rendering import RendersJson, format_table
from tuned_rl.measure.measurement import Measurement
from tuned_rl.measure.probes.ioctl import format_times
from tuned_rl.measure.stats import format_us


@dataclass
class MeasureReport(RendersJson):
    target: str
    measurement: Measurement

    def to_dict(self) -> dict:
        return {"target": self.target, **self.measurement.to_dict()}

    def to_text(self) -> str:
        figures = self.to_dict()
        lines = [f"note: {note}" for note in self.measurement.notes]
        rows = [(str(figures["n"]), *(format_us(figures[k]) for k in ("p50_us", "p99_us", "p999_us", "max_us")),
                 str(figures["lost"]), figures["probe"])]
        lines += format_table(("N", "P50", "P99", "P999", "MAX", "LOST", "PROBE"), rows)
        if self.measurement.ioctl is not None:
            lines += format_times(self.measurement.ioctl)
        return "\n".join(lines)
