"""How often does the judge call a regression when there is none, and how often does it see a real one?

    .venv/bin/python bench/judge_sim.py [--trials 1000] [--real bench/data/canary_windows.npz]

Each trial builds a before arm and an after arm of windows at the default window budget
([verify] defaults) and asks the judge. Printed: the false regression rate on A/A pairs
(no change at all) with heavy tails, with bursty noise, and on windows the real BPF probe
recorded (consecutive blocks, in time order); and the detection rate of a true 1.5x and
2x p999 regression (every value of the after arm scaled).

The "drift" recording was made while CPU-heavy jobs started and stopped on the machine:
consecutive before/after blocks then differ for reasons no judge can tell from an effect,
which is what interleaved rounds (A B A B) are for.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np

from tuned_rl.measure.judge import REGRESSION, JudgeSettings, judge
from tuned_rl.measure.settings import DEFAULT_VERIFY

EVENTS_PER_WINDOW = 1000  # a default canary wakes 1,000 times a second; windows are 1 s


def heavy_tail(rng, n: int, scale: float = 1.0) -> np.ndarray:
    """A run-queue-latency-like sample: 20 µs body, a Pareto tail (alpha 1.5) reaching into ms (ns)."""
    body = rng.lognormal(np.log(20_000), 0.3, n)
    tail = rng.random(n) < 0.02
    body[tail] += 50_000 * (rng.pareto(1.5, tail.sum()) + 1)
    return (body * scale).astype(np.int64)


def synthetic_arm(rng, windows: int, scale: float, bursty: bool) -> list[np.ndarray]:
    arm = []
    for _ in range(windows):
        jitter = 1.0
        if bursty:
            jitter = rng.lognormal(0, 0.25)  # window-to-window scale jitter
            if rng.random() < 0.05:
                jitter *= 3  # an occasional 3x window: another tenant's burst
        arm.append(heavy_tail(rng, EVENTS_PER_WINDOW, scale * jitter))
    return arm


def rate(trials: int, make_pair, settings: JudgeSettings) -> tuple[float, float]:
    """Share of trials judged a regression, and the median time one judgement took (s)."""
    hits, times = 0, []
    for trial in range(trials):
        before, after = make_pair(trial)
        started = time.perf_counter()
        hits += judge(before, after, settings).outcome == REGRESSION
        times.append(time.perf_counter() - started)
    return hits / trials, float(np.median(times))


def real_pairs(path: str, windows: int, seed: int):
    """A/A pairs cut from windows the real probe recorded: consecutive blocks, in time order."""
    data = np.load(path)
    recorded = [data[key] for key in sorted(data.files, key=lambda k: int(k.split("_")[1]))]
    rng = np.random.default_rng(seed)

    def pair(trial):
        start = rng.integers(0, len(recorded) - 2 * windows + 1)
        block = recorded[start:start + 2 * windows]
        return block[:windows], block[windows:]
    return pair, len(recorded)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--real", default="bench/data/canary_windows.npz")
    parser.add_argument("--drift", default="bench/data/canary_windows_drift.npz",
                        help="windows recorded while CPU-heavy jobs started and stopped")
    parser.add_argument("--windows", type=int, default=DEFAULT_VERIFY.windows, help="per arm (explore)")
    parser.add_argument("--tolerance", type=float, default=DEFAULT_VERIFY.tolerance, help="(explore)")
    args = parser.parse_args()
    settings = dataclasses.replace(DEFAULT_VERIFY.judge_settings(), tolerance=args.tolerance)
    windows = args.windows
    print(f"judge defaults: {settings.metric}, tolerance {settings.tolerance:.0%}, confidence "
          f"{settings.confidence:.0%}; {windows} windows of {EVENTS_PER_WINDOW} events per arm; "
          f"{args.trials} trials each")
    rows = []
    for label, scale, bursty in [("A/A heavy tail", 1.0, False), ("A/A bursty (jitter + 3x windows)", 1.0, True),
                                 ("2x regression, heavy tail", 2.0, False), ("2x regression, bursty", 2.0, True),
                                 ("1.5x regression, heavy tail", 1.5, False), ("1.5x regression, bursty", 1.5, True)]:
        rng = np.random.default_rng(args.seed)
        pair = lambda trial: (synthetic_arm(rng, windows, 1.0, bursty),  # noqa: E731
                              synthetic_arm(rng, windows, scale, bursty))
        rows.append((label, *rate(args.trials, pair, settings)))
    try:
        pair, recorded = real_pairs(args.real, windows, args.seed)
        rows.append((f"A/A real probe windows ({recorded} recorded)", *rate(args.trials, pair, settings)))
        doubled = lambda trial: (lambda b, a: (b, [w * 2 for w in a]))(*pair(trial))  # noqa: E731
        rows.append(("2x regression on real windows", *rate(args.trials, doubled, settings)))
    except FileNotFoundError:
        print(f"({args.real} not found: record it with bench/record_windows.py)")
    try:
        pair, recorded = real_pairs(args.drift, windows, args.seed)
        rows.append((f"A/A real windows with drift ({recorded}; other jobs came and went)",
                     *rate(args.trials, pair, settings)))
    except FileNotFoundError:
        pass
    width = max(len(r[0]) for r in rows)
    print(f"{'case':<{width}}  judged regression  median judge time")
    for label, share, seconds in rows:
        print(f"{label:<{width}}  {share:>17.1%}  {seconds * 1000:>14.1f} ms")


if __name__ == "__main__":
    main()
