"""Treated nodes against control nodes, the nodes the units, time-matched.

Each sub-window's reference is the control nodes' median log p999 then (a fleet-wide peak moves it,
and every node with it); a node's score is the median, over its sub-windows, of its log p999 less
that reference (a control node's own reference leaves it out). With a window before the change
(``before``: the same nodes, none treated yet), a node's score is its change from that window, so
that its own level (its hardware, its tenants) leaves the test. Then:

- **fail**, treated worse beyond the tolerance: a one-sided exact Mann-Whitney test of the treated
  scores, less log(1 + tolerance), against the control scores, at ``alpha_group``; or one treated
  node alone beyond the tolerance at ``alpha_node`` shared by the treated nodes (Bonferroni): with a
  window before, its sub-windows after against its sub-windows before (exact Mann-Whitney, so a
  heavy tail holds); without, its score against the control scores' prediction interval
  (Student's t, ``n_control - 1`` degrees of freedom). The node is named: one hardware class can
  regress alone.
- **pass**: no fail, and the Hodges-Lehmann upper ``1 - beta`` confidence bound on the treated
  shift (the Mann-Whitney test inverted) below log(``harm``).
- **inconclusive**: neither, or fewer than ``min_nodes`` nodes with data on a side; it says how
  many nodes a side would need at the spread seen.

Error rates, as designed: an A/A (no change) fails at most ``alpha_group + alpha_node`` (1% by
default); a regression of ``harm`` passes at most ``beta`` (5%), whatever the number of nodes; a
regression within the tolerance fails at most ``alpha_group`` on the group test. bench/fleet_sim.py
measures them, and the power against nodes and window, on recorded canary histograms
(docs/fleet.md: the A/A fails 0.0% of 300; on a recording with a stall episode the judge is mostly
inconclusive). Not yet wired into a command.

A node whose counters fell in a sub-window (watch restarted), that did not report at a boundary,
or whose sub-window holds fewer than ``min_waits`` waits has that sub-window left out, and is
named; a node left with fewer than half its sub-windows is left out of the test, named, never
counted as good.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from functools import lru_cache

import numpy as np

from tuned_rl.fleet.node_windows import NodeWindows
from tuned_rl.measure.stats import t_sf

PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"


@dataclass(frozen=True)
class FleetSettings:
    tolerance: float = 0.1  # a treated p999 up to 1.1x the control's is not a regression
    harm: float = 1.5  # pass rules out a treated p999 this much worse, at 1 - beta
    alpha_group: float = 0.005
    alpha_node: float = 0.005
    beta: float = 0.05
    min_nodes: int = 3
    min_waits: int = 2000  # a sub-window's p999 rests on 2 waits or more
    quantile: float = 0.999


@dataclass
class NodeFigures:
    node: str
    group: str  # "treated" or "control"
    p99_us: float | None = None
    p999_us: float | None = None
    waits: int = 0
    sub_windows: int = 0  # with data
    score: float | None = None  # its p999 over the time-matched control reference (a ratio)
    p_value: float | None = None  # a treated node's own test
    left_out: str | None = None
    notes: list[str] = field(default_factory=list)


@dataclass
class FleetVerdict:
    outcome: str
    reason: str
    shift: float | None = None  # the treated p999 over the control's (Hodges-Lehmann), a ratio
    upper: float | None = None  # its upper 1 - beta bound
    p_value: float | None = None  # the group test's
    regressed_nodes: list[str] = field(default_factory=list)
    needed_nodes: int | None = None
    nodes: list[NodeFigures] = field(default_factory=list)
    settings: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def judge(treated: dict[str, NodeWindows], control: dict[str, NodeWindows],
          settings: FleetSettings = FleetSettings(), before: dict[str, NodeWindows] | None = None) -> FleetVerdict:
    """The verdict on ``treated`` against ``control`` (each node's sub-windows of the same hours).
    ``before``: every node's sub-windows of a window before the treated nodes changed; each node's
    score is then its change from that window, and a node's own level (its hardware) leaves the test."""
    s = settings
    figures = {name: _figures(w, "treated" if name in treated else "control", s) for name, w in
               {**treated, **control}.items()}
    after, earlier_residuals = {}, {}
    scores = _scores(treated, control, s, figures, after)
    if before is not None:
        earlier = _scores({n: w for n, w in before.items() if n in treated},
                          {n: w for n, w in before.items() if n in control}, s, {}, earlier_residuals)
        for name in list(scores):
            if name not in earlier:
                figures[name].left_out = "no data in the window before the change"
                del scores[name]
                continue
            scores[name] -= earlier[name]
            figures[name].score = round(math.exp(scores[name]), 4)
    treated_scores = np.array([scores[n] for n in treated if n in scores])
    control_scores = np.array([scores[n] for n in control if n in scores])
    verdict = FleetVerdict(INCONCLUSIVE, "", nodes=list(figures.values()), settings=asdict(s))
    if len(treated_scores) < s.min_nodes or len(control_scores) < s.min_nodes:
        verdict.reason = (f"{len(treated_scores)} treated and {len(control_scores)} control node(s) with data: at least "
                          f"{s.min_nodes} a side are needed")
        verdict.needed_nodes = s.min_nodes
        return verdict
    tolerance = math.log1p(s.tolerance)
    verdict.p_value = _mann_whitney_p(treated_scores - tolerance, control_scores)
    estimate = float(np.median(np.subtract.outer(treated_scores, control_scores)))
    upper = _upper_bound(treated_scores, control_scores, s.beta)
    verdict.shift, verdict.upper = round(math.exp(estimate), 4), round(math.exp(upper), 4)
    spread = float(np.std(control_scores, ddof=1)) if len(control_scores) > 1 else 0.0
    for name in treated:
        if name not in scores:
            continue
        if before is not None:  # its sub-windows after against its own before, by ranks: heavy tails hold
            figures[name].p_value = _mann_whitney_p(np.array(after[name]) - tolerance,
                                                    np.array(earlier_residuals[name]))
        elif spread > 0:  # its score against the control nodes' prediction interval
            t = (scores[name] - tolerance - float(np.mean(control_scores))) / (
                spread * math.sqrt(1 + 1 / len(control_scores)))
            figures[name].p_value = float(t_sf(t, len(control_scores) - 1))
        else:
            continue
        if figures[name].p_value <= s.alpha_node / len(treated_scores):
            verdict.regressed_nodes.append(name)
    if verdict.p_value <= s.alpha_group or verdict.regressed_nodes:
        verdict.outcome = FAIL
        alone = (f"; alone beyond it: {', '.join(verdict.regressed_nodes)}" if verdict.regressed_nodes else "")
        verdict.reason = (f"treated p999 x{verdict.shift:g} the control's (beyond x{1 + s.tolerance:g}: p = "
                          f"{verdict.p_value:.2g}){alone}")
    elif upper < math.log(s.harm):
        verdict.outcome = PASS
        verdict.reason = (f"treated p999 x{verdict.shift:g} the control's; worse than x{s.harm:g} ruled out at "
                          f"{1 - s.beta:.0%} (bound x{verdict.upper:g})")
    else:
        room = math.log(s.harm) - estimate
        sides = min(len(treated_scores), len(control_scores))
        verdict.needed_nodes = math.ceil(sides * ((upper - estimate) / room) ** 2) if room > 0 else None
        verdict.reason = (f"treated p999 x{verdict.shift:g} the control's, up to x{verdict.upper:g} not ruled out "
                          f"(harm x{s.harm:g})" + (f"; about {verdict.needed_nodes} nodes a side would decide at "
                                                    "this spread" if verdict.needed_nodes else ""))
    return verdict


def _scores(treated: dict[str, NodeWindows], control: dict[str, NodeWindows], s: FleetSettings,
            figures: dict[str, NodeFigures], residuals: dict[str, list[float]] | None = None) -> dict[str, float]:
    """Each node's log p999 over the time-matched control reference, for the nodes with data in half
    the sub-windows or more (the others named in ``figures``); ``residuals`` gets each node's
    per-sub-window differences."""
    logs = {name: _log_quantiles(w, s) for name, w in {**treated, **control}.items()}
    windows = max((len(w.counts) for w in {**treated, **control}.values()), default=0)
    scores = {}
    for name in logs:
        differences = _differences(logs[name], [logs[c] for c in control if c != name], windows)
        record = figures.get(name, NodeFigures(name, ""))  # a window before: figures of its own, not kept
        record.sub_windows = len(differences)
        if len(differences) * 2 < windows or not differences:
            record.left_out = f"data in {len(differences)} of {windows} sub-windows (fewer than half)"
            continue
        scores[name] = float(np.median(differences))
        record.score = round(math.exp(scores[name]), 4)
        if residuals is not None:
            residuals[name] = differences
    return scores


def _log_quantiles(windows: NodeWindows, s: FleetSettings) -> list[float | None]:
    found = []
    for index in range(len(windows.counts)):
        value = windows.quantile(index, s.quantile) if windows.waits(index) >= s.min_waits else math.nan
        found.append(math.log(value) if value > 0 else None)
    return found


def _differences(own: list[float | None], controls: list[list[float | None]], windows: int) -> list[float]:
    """The node's log p999 less the control nodes' median, in each sub-window both have."""
    differences = []
    for index in range(min(windows, len(own))):
        reference = [c[index] for c in controls if index < len(c) and c[index] is not None]
        if own[index] is not None and reference:
            differences.append(own[index] - float(np.median(reference)))
    return differences


def _figures(windows: NodeWindows, group: str, s: FleetSettings) -> NodeFigures:
    figures = NodeFigures(windows.node, group, waits=sum(windows.waits(i) for i in range(len(windows.counts))))
    if figures.waits:
        figures.p99_us = round(windows.pooled_quantile(0.99) * 1e6, 1)
        figures.p999_us = round(windows.pooled_quantile(0.999) * 1e6, 1)
    if windows.resets:
        figures.notes.append(f"counters fell (watch restarted) in {len(windows.resets)} sub-window(s), left out")
    if windows.missing:
        figures.notes.append(f"did not report in {len(windows.missing)} sub-window(s), left out")
    few = sum(1 for i, c in enumerate(windows.counts) if c is not None and windows.waits(i) < s.min_waits)
    if few:
        figures.notes.append(f"{few} sub-window(s) with fewer than {s.min_waits} waits, left out")
    return figures


@lru_cache(maxsize=256)
def _u_distribution(n1: int, n2: int) -> tuple[float, ...]:
    """P(U = u) for u = 0 .. n1*n2 under the null (no ties): the exact Mann-Whitney distribution."""
    # counts[i][j] is a polynomial in q (as an array): the number of arrangements by U.
    table = [[np.ones(1)] * (n2 + 1)]
    for i in range(1, n1 + 1):
        row = [np.ones(1)]
        for j in range(1, n2 + 1):
            shifted = np.concatenate([np.zeros(j), table[i - 1][j]])  # the last is treated: beats the j controls
            other = row[j - 1]
            size = max(len(shifted), len(other))
            row.append(np.pad(shifted, (0, size - len(shifted))) + np.pad(other, (0, size - len(other))))
        table.append(row)
    counts = table[n1][n2]
    return tuple(counts / counts.sum())


def _mann_whitney_p(treated: np.ndarray, control: np.ndarray) -> float:
    """One-sided p of "treated above control": P(U >= u) (ties count a half)."""
    u = float((treated[:, None] > control[None, :]).sum() + 0.5 * (treated[:, None] == control[None, :]).sum())
    if len(treated) * len(control) > 2500:
        n1, n2 = len(treated), len(control)
        z = (u - n1 * n2 / 2 - 0.5) / math.sqrt(n1 * n2 * (n1 + n2 + 1) / 12)
        return 0.5 * math.erfc(z / math.sqrt(2))
    distribution = _u_distribution(len(treated), len(control))
    return float(sum(distribution[math.ceil(u):]))


def _upper_bound(treated: np.ndarray, control: np.ndarray, beta: float) -> float:
    """The smallest shift d for which "treated - d below control" is rejected at ``beta``: the
    upper 1 - beta bound of the Hodges-Lehmann shift."""
    differences = np.sort(np.subtract.outer(treated, control).ravel())
    low, high = 0, len(differences) - 1
    while low < high:
        middle = (low + high) // 2
        if _mann_whitney_p(control, treated - differences[middle] - 1e-12) <= beta:
            high = middle
        else:
            low = middle + 1
    return float(differences[low])
