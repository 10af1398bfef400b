"""Treated nodes against control nodes, the nodes the units, time-matched.

Each sub-window's reference is the p999 of the control nodes' waits of that sub-window together (a
control node's own left out): a fleet-wide peak moves it, and every node with it. A node's
residual is its log p999 less that reference; its score is its median residual, or with a window
before the change (``before``: the same nodes, none treated yet) the Hodges-Lehmann shift of its
residuals after over those before, so that its own level (its hardware, its tenants) leaves the
test and minutes in a stall episode meet like minutes. Then:

- **fail**, treated worse beyond the tolerance: a one-sided exact Mann-Whitney test of the treated
  scores, less log(1 + tolerance), against the control scores, at ``alpha_group``; or one treated
  node alone beyond the tolerance at ``alpha_node`` shared by the treated nodes (Bonferroni): its
  score above the control scores' prediction interval (Student's t, ``n_control - 1`` degrees of
  freedom) and, with a window before, its sub-windows after above its own before (exact
  Mann-Whitney); both must say so. The node is named: one hardware class can regress alone.
- **pass**: no fail, and the Hodges-Lehmann upper ``1 - beta`` confidence bound on the treated
  shift (the Mann-Whitney test inverted) below log(``harm``).
- **inconclusive**: neither, or fewer than ``min_nodes`` nodes with data on a side; it says how
  many nodes a side would need at the spread seen, and when so few nodes cannot reach
  ``alpha_group`` at all.

Error rates, as designed: an A/A (no change) fails at most ``alpha_group + alpha_node`` (1% by
default); a regression of ``harm`` passes at most ``beta`` (5%), whatever the number of nodes; a
regression within the tolerance fails at most ``alpha_group + alpha_node``. bench/fleet_sim.py
measures them, and the power against nodes and window, on recorded canary histograms (docs/fleet.md).

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
from tuned_rl.fleet.quantiles import histogram_quantile
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
    after = _residuals(treated, control, s, figures)
    scores = {name: float(np.median(r)) for name, r in after.items()}
    earlier: dict[str, list[float]] = {}
    if before is not None:
        earlier = _residuals({n: w for n, w in before.items() if n in treated},
                             {n: w for n, w in before.items() if n in control}, s, {})
        for name in list(scores):
            if name not in earlier:
                figures[name].left_out = "no data in the window before the change"
                del scores[name]
                continue
            # Its change: the Hodges-Lehmann shift of its sub-windows after over those before. A node
            # whose minutes fall in two modes (a stall episode in some) keeps the shift of like minutes
            # against like, where a difference of two medians jumps between the modes.
            scores[name] = float(np.median(np.subtract.outer(after[name], earlier[name])))
    for name, score in scores.items():
        figures[name].score = round(math.exp(score), 4)
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
    floor = 1 / math.comb(len(treated_scores) + len(control_scores), len(treated_scores))  # the smallest p it has
    estimate = float(np.median(np.subtract.outer(treated_scores, control_scores)))
    upper = _upper_bound(treated_scores, control_scores, s.beta)
    verdict.shift, verdict.upper = round(math.exp(estimate), 4), round(math.exp(upper), 4)
    spread = float(np.std(control_scores, ddof=1)) if len(control_scores) > 1 else 0.0
    for name in treated:
        if name not in scores:
            continue
        if spread <= 0:
            continue
        # Its score against the control nodes' prediction interval (Student's t) ...
        t = (scores[name] - tolerance - float(np.mean(control_scores))) / (spread * math.sqrt(1 + 1 / len(control_scores)))
        p = float(t_sf(t, len(control_scores) - 1))
        if before is not None:
            # ... and, with a window before, its own sub-windows after against before (exact Mann-Whitney):
            # named only when both say so, each at the node's share of alpha_node. Alone, the interval
            # is a normal model's (heavy-tailed node scores named 1.8% of 20-node A/As), and the rank
            # test treats sub-windows as independent (short ones are not: 5% of A/As at 15 s).
            p = max(p, _mann_whitney_p(np.array(after[name]) - tolerance, np.array(earlier[name])))
        figures[name].p_value = p
        if p <= s.alpha_node / len(treated_scores):
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
        if floor > s.alpha_group:  # ranks of so few nodes cannot reach the group test's level, whatever they say
            enough = next(n for n in range(2, 64) if 1 / math.comb(2 * n, n) <= s.alpha_group)
            verdict.needed_nodes = max(verdict.needed_nodes or 0, enough)
            verdict.reason += (f"; with {len(treated_scores)} and {len(control_scores)} nodes the group test cannot "
                               f"fail at {s.alpha_group:g} (its smallest p is {floor:.2g}): {enough} a side can")
    return verdict


def _residuals(treated: dict[str, NodeWindows], control: dict[str, NodeWindows], s: FleetSettings,
               figures: dict[str, NodeFigures]) -> dict[str, list[float]]:
    """Each node's log p999 less the time-matched reference, per sub-window both have, for the nodes
    with data in half the sub-windows or more (the others named in ``figures``). The reference is the
    p999 of the control nodes' waits of that sub-window together (a control node's own left out):
    the control fleet's tail then, which a stall episode on a few nodes moves far less than a median of
    per-node p999s that each jump between a quiet and a stalled mode."""
    nodes = {**treated, **control}
    windows = max((len(w.counts) for w in nodes.values()), default=0)
    kept = {name: [_kept(w, i, s) for i in range(windows)] for name, w in nodes.items()}
    totals = []
    for index in range(windows):
        present = [kept[c][index] for c in control if kept[c][index] is not None]
        totals.append(np.sum(present, axis=0) if present else None)
    found = {}
    for name, w in nodes.items():
        differences = []
        for index in range(windows):
            own, total = kept[name][index], totals[index]
            if own is None or total is None:
                continue
            reference = total - own if name in control else total
            if reference[-1] < s.min_waits:
                continue
            value, level = w.quantile(index, s.quantile), histogram_quantile(s.quantile, w.bounds, reference)
            if value > 0 and level > 0:
                differences.append(math.log(value) - math.log(level))
        record = figures.get(name, NodeFigures(name, ""))  # a window before: figures of its own, not kept
        record.sub_windows = len(differences)
        if len(differences) * 2 < windows or not differences:
            record.left_out = f"data in {len(differences)} of {windows} sub-windows (fewer than half)"
            continue
        found[name] = differences
    return found


def _kept(windows: NodeWindows, index: int, s: FleetSettings) -> np.ndarray | None:
    """Sub-window ``index``'s cumulative counts, if it has enough waits for a p999."""
    if index >= len(windows.counts) or windows.waits(index) < s.min_waits:
        return None
    return windows.counts[index]


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
