"""The [verify] table: how a step's latency is measured and judged."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from tuned_rl.measure.judge import JudgeSettings
from tuned_rl.measure.switchback import RUN_SECONDS, SwitchbackSettings, block_events, run_blocks_for
from tuned_rl.profiles.schema import Key, Table

VERIFY_TABLE = Table(
    "verify",
    "How each step is measured (windows of the target's run-queue latency) and judged.",
    {
        "probe": Key(str, "Latency probe: auto (bpf, else tracefs, else schedstat), bpf, tracefs, schedstat.",
                     choices=("auto", "bpf", "tracefs", "schedstat")),
        "design": Key(str, "switchback: without and with the step alternate in blocks until the evidence decides "
                           "(drift-proof, the default); before-after: a fixed measurement without, then with it.",
                      choices=("switchback", "before-after")),
        "metric": Key(str, "The quantile judged.", choices=("p50", "p99", "p999")),
        "window_seconds": Key(float, "Length of one window.", minimum=0.1, maximum=600),
        "baseline_windows": Key(int, "Ignored since 0.2: the baseline is one block, as long as the others (kept so "
                                     "older profiles load).",
                                minimum=1, maximum=100),
        "block_windows": Key(int, "switchback: windows per block, after settle_seconds dropped; 0 (the default): "
                                  "sized by the target's event rate, enough for the metric's tail to rest on 4 waits "
                                  "(one window of 0.5 s at 8,000 events a second), at most 2.",
                             minimum=0, maximum=100),
        "run_seconds": Key(float, "switchback: the arms change in runs of blocks at least this long, and the "
                                  "metric's tail is also judged over each run, so that a stall the step adds once "
                                  "in this long lands in every run with it (1 s: runs of two 0.5 s blocks); 0: "
                                  "every block on its own.", minimum=0, maximum=60),
        "max_blocks": Key(int, "switchback: blocks at most before the verdict is inconclusive.", minimum=2,
                          maximum=100),
        "harm": Key(float, "switchback: a kept step's metric (its slowest 0.1% for p999) worse than this ratio is "
                           "ruled out at harm_confidence.", minimum=1.01, maximum=1000),
        "broad_harm": Key(float, "switchback: and its slowest 5% worse than this ratio.", minimum=1.01, maximum=1000),
        "harm_confidence": Key(float, "switchback: how sure a keep is that the harm is ruled out (1 - the share of "
                                      "harmful steps kept).", minimum=0.5, maximum=0.9999),
        "run_sign_p": Key(float, "switchback: no keep while the metric's tail over runs is worse beyond the "
                                 "tolerance at this p (a stall the step adds once a run); lower keeps harmless "
                                 "steps sooner and lets more such stalls be kept.", minimum=0.0001, maximum=0.5),
        "windows": Key(int, "before-after: windows per measurement (before, and again after).", minimum=2,
                       maximum=1000),
        "rounds": Key(int, "before-after: alternate without/with the step this many times and pool the arms.",
                      minimum=1, maximum=20),
        "min_samples": Key(int, "Fewer events than this in either arm is inconclusive.", minimum=1),
        "tolerance": Key(float, "How much worse the metric may get before it counts (0.1 = 10%).",
                         minimum=0, maximum=100),
        "confidence": Key(float, "How sure a revert must be: a step within the tolerance is reverted at most 1 - "
                                 "this of the time, over every look.", minimum=0.5, maximum=0.9999),
        "settle_seconds": Key(float, "After each change has been made, measured and dropped as settling (a step "
                                     "whose effect takes longer to take hold sets more).", minimum=0,
                              maximum=600),
        "on_inconclusive": Key(str, "Keep or revert a step the judge cannot decide on.", choices=("keep", "revert")),
        "noise_memory_hours": Key(float, "switchback: a keep's harm bound may borrow the host's block-to-block noise "
                                         "that an apply (or watch) measured on the same target this many hours ago at "
                                         "most, in the same boot (<state-dir>/noise.json); 0: each apply learns it "
                                         "afresh.", minimum=0, maximum=24 * 365),
    },
)


MAX_BLOCK_WINDOWS = 2  # a slow target's blocks: 1 s at most, with fewer waits in the metric's tail
# A block may hold this much fewer events than block_events and still be one window shorter: its
# tail rests on TAIL_AT_LEAST waits either way (then the slowest 0.125% instead of 0.1%). The sizing
# reads one window, and a rate that sits at the boundary halves the blocks by chance: the default
# canary (four threads every 500 us) delivered 7,890-8,005 events a second here (2026-12-04), so
# about every other apply read its first window under 4,000 and measured in 1 s blocks for all its
# steps (the quickstart's first step 42 windows in 20 blocks, 21.1 s, where 0.5 s blocks took 8.6 s).
BLOCK_EVENTS_SLACK = 0.8
# Settling: dropped after each change of arm has been made (the span begins where the last block
# ended, so a slow write is inside it however long it takes), for what follows the change at once.
# 0.25 s was 28% of an apply: ~0.75 changes a block of 0.5 s (the quickstart of 2026-12-04: 11.2 s of
# 40.2). The quickstart alternated at 0.25 and 0.1 s, 8 pairs the same hour: 0.76 -> 0.65 s a block,
# apply median 41.4 -> 28.8 s, 0 of 48 steps inconclusive or reverted; a block just after a change
# read x0.96 (0.25 s) and x1.13 (0.1 s) the others, which the fit's change term takes up
# (CHANGE_TERM_FROM). docs/judge.md, "Settling".
DEFAULT_SETTLE_SECONDS = 0.1


@dataclass(frozen=True)
class VerifySettings:
    probe: str = "auto"
    design: str = "switchback"
    metric: str = "p999"
    window_seconds: float = 0.5
    baseline_windows: int = 2
    block_windows: int = 0  # sized by the target's event rate (blocks_for)
    max_blocks: int = SwitchbackSettings.max_blocks
    harm: float = SwitchbackSettings.harm
    broad_harm: float = SwitchbackSettings.broad_harm
    harm_confidence: float = SwitchbackSettings.harm_confidence
    run_sign_p: float = SwitchbackSettings.run_sign_p
    windows: int = 15
    rounds: int = 1
    min_samples: int = JudgeSettings.min_samples
    tolerance: float = JudgeSettings.tolerance
    confidence: float = JudgeSettings.confidence
    settle_seconds: float = DEFAULT_SETTLE_SECONDS
    run_seconds: float = RUN_SECONDS  # the arms change in runs of blocks at least this long (0: every block)
    on_inconclusive: str = "keep"
    noise_memory_hours: float = 24.0  # a first step borrows the host's noise an apply learned this long ago at most (0: never)

    @classmethod
    def from_table(cls, table: dict | None) -> "VerifySettings":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (table or {}).items() if k in known})

    def judge_settings(self) -> JudgeSettings:
        return JudgeSettings(metric=self.metric, tolerance=self.tolerance, confidence=self.confidence,
                             min_samples=self.min_samples)

    def switchback_settings(self, block_windows: int = 1) -> SwitchbackSettings:
        """The sequential verdict's settings, for blocks of ``block_windows`` windows (which size the runs)."""
        run_blocks = run_blocks_for(block_windows * self.window_seconds, self.run_seconds) if self.run_seconds else 1
        return SwitchbackSettings(metric=self.metric, tolerance=self.tolerance, confidence=self.confidence,
                                  max_blocks=self.max_blocks, min_samples=self.min_samples, harm=self.harm,
                                  broad_harm=self.broad_harm, harm_confidence=self.harm_confidence,
                                  run_sign_p=self.run_sign_p,
                                  run_blocks=run_blocks)

    def windows_per_block(self, events_per_second: float) -> int:
        """``block_windows``, or (0) enough windows for a block's metric tail to rest on TAIL_AT_LEAST
        waits at the target's rate (BLOCK_EVENTS_SLACK short of it at most), at most MAX_BLOCK_WINDOWS."""
        if self.block_windows:
            return self.block_windows
        needed = BLOCK_EVENTS_SLACK * block_events(self.metric) / max(events_per_second * self.window_seconds, 1e-9)
        return int(min(max(math.ceil(needed - 1e-9), 1), MAX_BLOCK_WINDOWS))


DEFAULT_VERIFY = VerifySettings()
