"""Treated nodes against control nodes, the nodes the units, time-matched.

Each sub-window's reference is the p99.5 of the control nodes' waits of that sub-window together (a
control node's own left out): a fleet-wide peak moves it, and every node with it, and a stall
episode on a few control nodes hardly does (their pooled p999 jumps with how many are in one). A
node's residual is its log p999 less that reference; its score is its median residual, or with a
window before the change (``before``: the same nodes, none treated yet) the Hodges-Lehmann shift of
its residuals after over those before, so that its own level (its hardware, its tenants) leaves the
test. Each node has two scores: over every sub-window, and over its quieter half (the lower half of
its residuals after, and of those before), where a step that slows every wait shows at a fraction
of the noise that minutes jumping in and out of a stall episode give every sub-window's; the
quieter half is tested where the window holds ``quiet_from`` sub-windows or more (a half of 5 or
more: a half of 4 is no steadier than the whole). Then:

- **fail**, treated worse beyond the tolerance: a one-sided exact Mann-Whitney test of the treated
  scores, less log(1 + tolerance), against the control scores, at ``alpha_group`` shared by the two
  scores (``quiet_share`` of it the quieter halves'); or one treated node alone beyond the
  tolerance at ``alpha_node`` shared by the treated nodes and the two scores (Bonferroni): its
  score above the control scores' prediction interval (Student's t, ``n_control - 1`` degrees of
  freedom) and, with a window before, its sub-windows after above its own before (every
  sub-window: exact Mann-Whitney; the quieter half: a rank test capped at the pooled median, by
  relabelling); both must say so. The node is named: one hardware class can regress alone.
- **pass**: no fail, and the Hodges-Lehmann upper ``1 - beta`` confidence bound on the treated
  shift over every sub-window (the Mann-Whitney test inverted) below log(``harm``): the claim
  "the treated p999 is not x``harm`` worse" is the score over every sub-window's.
- **inconclusive**: neither, or fewer than ``min_nodes`` nodes with data on a side; it says how
  many nodes a side would need at the spread seen, and when so few nodes cannot reach the group
  test's level at all.

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
    quiet_share: float = 0.8  # of alpha_group, the quieter halves' test's; the rest every sub-window's
    quiet_from: int = 10  # sub-windows a window needs for its quieter half (5 or more) to be tested
    alpha_node: float = 0.005
    beta: float = 0.05
    min_nodes: int = 3
    min_waits: int = 2000  # a sub-window's p999 rests on 2 waits or more
    quantile: float = 0.999
    reference_quantile: float = 0.995  # of the control nodes' waits together, each sub-window


@dataclass
class NodeFigures:
    node: str
    group: str  # "treated" or "control"
    p99_us: float | None = None
    p999_us: float | None = None
    waits: int = 0
    sub_windows: int = 0  # with data
    score: float | None = None  # its p999 over the time-matched control reference (a ratio): all its sub-windows
    quiet_score: float | None = None  # the same of its quieter half of sub-windows
    p_value: float | None = None  # a treated node's own test
    left_out: str | None = None
    notes: list[str] = field(default_factory=list)


@dataclass
class FleetVerdict:
    outcome: str
    reason: str
    shift: float | None = None  # the treated p999 over the control's (Hodges-Lehmann), a ratio
    upper: float | None = None  # its upper 1 - beta bound
    p_value: float | None = None  # the group test's, on every sub-window
    quiet_shift: float | None = None  # the same three on each node's quieter half of sub-windows
    quiet_upper: float | None = None
    quiet_p_value: float | None = None
    quiet_share: float = 0.0  # of alpha_group and alpha_node, what the quieter halves' tests spent (0: not tested)
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
    earlier: dict[str, list[float]] = {}
    if before is not None:
        earlier = _residuals({n: w for n, w in before.items() if n in treated},
                             {n: w for n, w in before.items() if n in control}, s, {})
        for name in list(after):
            if name not in earlier:
                figures[name].left_out = "no data in the window before the change"
                del after[name]
    scores, quiet_scores = {}, {}
    for name, residuals in after.items():
        now, then = np.array(residuals), np.array(earlier[name]) if before is not None else None
        scores[name] = node_change(now, then)
        quiet_scores[name] = node_change(_quieter_half(now), _quieter_half(then) if then is not None else None)
        figures[name].quiet_score = round(math.exp(quiet_scores[name]), 4)
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
    sub_windows = max(len(w.counts) for w in {**treated, **control}.values())
    share = verdict.quiet_share = s.quiet_share if sub_windows >= s.quiet_from else 0.0
    treated_quiet = np.array([quiet_scores[n] for n in treated if n in scores])
    control_quiet = np.array([quiet_scores[n] for n in control if n in scores])
    verdict.p_value = _mann_whitney_p(treated_scores - tolerance, control_scores)
    verdict.quiet_p_value = _mann_whitney_p(treated_quiet - tolerance, control_quiet)
    floor = 1 / math.comb(len(treated_scores) + len(control_scores), len(treated_scores))  # the smallest p it has
    estimate = float(np.median(np.subtract.outer(treated_scores, control_scores)))
    upper = _upper_bound(treated_scores, control_scores, s.beta)
    verdict.shift, verdict.upper = round(math.exp(estimate), 4), round(math.exp(upper), 4)
    quiet_estimate = float(np.median(np.subtract.outer(treated_quiet, control_quiet)))
    quiet_upper = _upper_bound(treated_quiet, control_quiet, s.beta)
    verdict.quiet_shift, verdict.quiet_upper = round(math.exp(quiet_estimate), 4), round(math.exp(quiet_upper), 4)
    group_fails = [f"{label} x{shift:g} the control's (beyond x{1 + s.tolerance:g}: p = {p:.2g})" for label, shift, p, level in
                   (("treated p999, each node's quieter half of sub-windows,", verdict.quiet_shift, verdict.quiet_p_value,
                     s.alpha_group * share),
                    ("treated p999, every sub-window,", verdict.shift, verdict.p_value, s.alpha_group * (1 - share)))
                   if level > 0 and p <= level]
    # Each score with its control scores, its share of alpha_node, and the node's own before/after test.
    per_score = ((scores, control_scores, 1 - share, _mann_whitney_p), (quiet_scores, control_quiet, share, _quiet_rank_p))
    for name in treated:
        if name not in scores:
            continue
        p_values = []
        for node_scores, controls, spent, own_test in per_score:
            if spent <= 0:
                continue
            spread = float(np.std(controls, ddof=1)) if len(controls) > 1 else 0.0
            if spread <= 0:
                p_values.append(1.0)
                continue
            # Its score against the control nodes' prediction interval (Student's t) ...
            t = (node_scores[name] - tolerance - float(np.mean(controls))) / (spread * math.sqrt(1 + 1 / len(controls)))
            p = float(t_sf(t, len(controls) - 1))
            if before is not None and p <= s.alpha_node * spent / len(treated_scores):
                # ... and, with a window before, its own sub-windows after against before, by relabelling
                # them (exact where they are exchangeable): named only when both say so. Alone, the
                # interval is a normal model's (heavy-tailed node scores named 1.8% of 20-node A/As), and
                # the relabelling treats sub-windows as independent (short ones are not: 5% of A/As at 15 s).
                p = max(p, own_test(np.array(after[name]) - tolerance, np.array(earlier[name])))
            p_values.append(p / spent)
        figures[name].p_value = min(1.0, min(p_values))  # at the node's alpha_node, both scores' shares spent
        if figures[name].p_value <= s.alpha_node / len(treated_scores):
            verdict.regressed_nodes.append(name)
    if group_fails or verdict.regressed_nodes:
        verdict.outcome = FAIL
        alone = (f"one node alone beyond x{1 + s.tolerance:g}: {', '.join(verdict.regressed_nodes)}"
                 if verdict.regressed_nodes else "")
        verdict.reason = "; ".join(group_fails + ([alone] if alone else []))
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
        if estimate > tolerance:  # it looks beyond the tolerance: say how far the group tests were from failing it
            tests = [(f"over every sub-window p = {verdict.p_value:.2g} (fails at {s.alpha_group * (1 - share):.2g})", 1 - share),
                     (f"over the quieter halves p = {verdict.quiet_p_value:.2g} (fails at {s.alpha_group * share:.2g})", share)]
            verdict.reason += f"; beyond x{1 + s.tolerance:g} not shown: group test " + ", ".join(
                text for text, spent in tests if spent > 0)
        level = s.alpha_group * max(share, 1 - share)
        if floor > level:  # ranks of so few nodes cannot reach the group test's level, whatever they say
            enough = next(n for n in range(2, 64) if 1 / math.comb(2 * n, n) <= level)
            verdict.needed_nodes = max(verdict.needed_nodes or 0, enough)
            verdict.reason += (f"; with {len(treated_scores)} and {len(control_scores)} nodes the group test cannot "
                               f"fail at {level:g} (its smallest p is {floor:.2g}): {enough} a side can")
    return verdict


def node_change(after: np.ndarray, before: np.ndarray | None) -> float:
    """A node's score: the Hodges-Lehmann shift of its residuals after over those ``before`` (a node
    whose minutes fall in two modes, a stall episode in some, keeps the shift of like minutes against
    like, where a difference of two medians jumps between the modes); without a window before, its
    median residual."""
    if before is None:
        return float(np.median(after))
    return float(np.median(np.subtract.outer(after, before)))


RELABELLINGS = 20000  # resolves a node's p to 5e-5: alpha_node shared by 10 nodes and two scores is 1e-4 and more


def _quiet_rank_p(after: np.ndarray, before: np.ndarray, relabellings: int = RELABELLINGS) -> float:
    """One-sided p of "after above before" in a node's quieter sub-windows: a rank test whose scores
    stop growing at the pooled median (each sub-window scores its rank among both windows', at most
    half their number), so that the louder half (stall episodes, which come and go) weighs as one
    value. Its null distribution is found by relabelling the pooled sub-windows into after and before
    at random (exact where they are exchangeable; seeded: the same figures give the same verdict)."""
    pooled = np.concatenate([after, before])
    ranks = np.argsort(np.argsort(pooled, kind="stable"), kind="stable") + 1.0
    for value in np.unique(pooled):  # ties share their mean rank
        tied = pooled == value
        ranks[tied] = ranks[tied].mean()
    scores = np.minimum(ranks, (len(pooled) + 1) // 2)
    observed = scores[:len(after)].sum()
    order = np.random.default_rng(20261204).random((relabellings, len(pooled))).argsort(axis=1)
    relabelled = scores[order[:, :len(after)]].sum(axis=1)
    return float((1 + np.sum(relabelled >= observed - 1e-9)) / (relabellings + 1))


def _quieter_half(residuals: np.ndarray) -> np.ndarray:
    """A node's lower half of sub-windows (the middle one with them): its minutes outside any stall
    episode, where a step that slows every wait shows at a fraction of the noise of all its minutes."""
    return np.sort(residuals)[:(len(residuals) + 1) // 2]


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
            value, level = w.quantile(index, s.quantile), histogram_quantile(s.reference_quantile, w.bounds, reference)
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
