"""The [verify] table: how a step's latency is measured and judged."""

from __future__ import annotations

from dataclasses import dataclass, fields

from tuned_rl.measure.judge import JudgeSettings
from tuned_rl.profiles.schema import Key, Table

VERIFY_TABLE = Table(
    "verify",
    "How each step is measured (windows of the target's run-queue latency) and judged.",
    {
        "probe": Key(str, "Latency probe: auto (bpf, else tracefs, else schedstat), bpf, tracefs, schedstat.",
                     choices=("auto", "bpf", "tracefs", "schedstat")),
        "metric": Key(str, "The quantile judged.", choices=("p50", "p99", "p999")),
        "windows": Key(int, "Windows per measurement (before, and again after).", minimum=2, maximum=1000),
        "window_seconds": Key(float, "Length of one window.", minimum=0.1, maximum=600),
        "min_samples": Key(int, "Fewer events than this in either measurement is inconclusive.", minimum=1),
        "tolerance": Key(float, "How much worse the metric may get before it counts (0.1 = 10%).",
                         minimum=0, maximum=100),
        "confidence": Key(float, "How sure the judge must be of a regression.", minimum=0.5, maximum=0.9999),
        "settle_seconds": Key(float, "Wait after a change before measuring it.", minimum=0, maximum=600),
        "rounds": Key(int, "Alternate without/with the step this many times (A B A B ...) and pool the arms.",
                      minimum=1, maximum=20),
        "on_inconclusive": Key(str, "Keep or revert a step the judge cannot decide on.", choices=("keep", "revert")),
    },
)


@dataclass(frozen=True)
class VerifySettings:
    probe: str = "auto"
    metric: str = "p999"
    windows: int = 15
    window_seconds: float = 1.0
    min_samples: int = JudgeSettings.min_samples
    tolerance: float = JudgeSettings.tolerance
    confidence: float = JudgeSettings.confidence
    settle_seconds: float = 1.0
    rounds: int = 1
    on_inconclusive: str = "keep"

    @classmethod
    def from_table(cls, table: dict | None) -> "VerifySettings":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (table or {}).items() if k in known})

    def judge_settings(self) -> JudgeSettings:
        return JudgeSettings(metric=self.metric, tolerance=self.tolerance, confidence=self.confidence,
                             min_samples=self.min_samples)


DEFAULT_VERIFY = VerifySettings()
