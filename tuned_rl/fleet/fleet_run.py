"""One fleet judgement: the treated and control nodes' bucket counters read from Prometheus over the
window (and the window before the change, when it is given), cut into sub-windows, and judged.

Nothing reaches a node: each side is one ``query_range`` on the histogram (`selection.bucket_query`),
evaluated at the sub-windows' boundaries. A node listed for a side that has no series there is named
and left out; a node that matches both sides is an error, not a choice."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tuned_rl.fleet.node_windows import NodeWindows, node_windows
from tuned_rl.fleet.prometheus import query_range
from tuned_rl.fleet.selection import Matcher, SelectionError, bucket_query, node_matcher
from tuned_rl.fleet.verdict import FleetSettings, FleetVerdict, NodeFigures, judge
from tuned_rl.host.untrusted import printable
from tuned_rl.rendering import format_table


@dataclass(frozen=True)
class Side:
    """The treated or the control nodes: matchers, a node list, or both."""

    matchers: tuple[Matcher, ...] = ()
    nodes: tuple[str, ...] = ()

    def all_matchers(self, common: list[Matcher], node_label: str) -> list[Matcher]:
        found = [*common, *self.matchers]
        if self.nodes:
            found.append(node_matcher(node_label, list(self.nodes)))
        return found


@dataclass(frozen=True)
class FleetQuery:
    url: str
    treated: Side
    control: Side
    end: float
    window_s: float = 900.0
    step_s: float = 60.0  # a sub-window
    changed_at: float | None = None  # the treated nodes' change: the window before it is compared too
    node_label: str = "instance"
    common: tuple[Matcher, ...] = ()
    settings: FleetSettings = field(default_factory=FleetSettings)

    def check(self) -> None:
        if not (self.treated.matchers or self.treated.nodes) or not (self.control.matchers or self.control.nodes):
            raise SelectionError("both sides need a selector or a node list: --treated/--treated-nodes and "
                                 "--control/--control-nodes")
        sub_windows = self.window_s / self.step_s
        if self.step_s <= 0 or abs(sub_windows - round(sub_windows)) > 1e-6 or round(sub_windows) < 2:
            raise SelectionError(f"a window of {self.window_s:g} s is not 2 or more sub-windows of {self.step_s:g} s")
        if round(sub_windows) > 11_000:  # Prometheus answers at most 11,000 points a series
            raise SelectionError(f"{round(sub_windows)} sub-windows: Prometheus answers 11,000 at most; a longer step")
        if self.changed_at is not None and self.changed_at > self.end - self.window_s:
            raise SelectionError("the window after the change starts before the change: an earlier --changed-at, "
                                 "a later --end or a shorter --window")

    def boundaries(self, end: float) -> list[float]:
        count = int(round(self.window_s / self.step_s))
        return [end - self.window_s + k * self.step_s for k in range(count + 1)]


@dataclass
class FleetJudgement:
    verdict: FleetVerdict
    queries: dict[str, str]
    windows: dict[str, list[float]]  # "after" (and "before"): [start, end]

    def to_dict(self) -> dict:
        return {**self.verdict.to_dict(), "queries": self.queries, "windows": self.windows}


def run_fleet_judge(query: FleetQuery, ask=query_range) -> FleetJudgement:
    """The verdict on ``query``; ``ask`` is query_range (a test passes its own)."""
    query.check()
    sides = {name: bucket_query(side.all_matchers(list(query.common), query.node_label), query.node_label)
             for name, side in (("treated", query.treated), ("control", query.control))}
    windows = {"after": [query.end - query.window_s, query.end]}
    after = _read(query, sides, query.end, ask)
    before = None
    if query.changed_at is not None:
        windows["before"] = [query.changed_at - query.window_s, query.changed_at]
        before = _read(query, sides, query.changed_at, ask)
    both = sorted(set(after["treated"]) & set(after["control"]))
    if both:
        raise SelectionError(f"node(s) {', '.join(both[:5])} match both the treated and the control selectors")
    verdict = judge(after["treated"], after["control"], query.settings,
                    {**before["treated"], **before["control"]} if before is not None else None)
    for group, side in (("treated", query.treated), ("control", query.control)):
        for node in side.nodes:
            if node not in after[group]:
                verdict.nodes.append(NodeFigures(node, group, left_out="no data: Prometheus has no series for it"))
    return FleetJudgement(verdict, sides, windows)


def _read(query: FleetQuery, sides: dict[str, str], end: float, ask) -> dict[str, dict[str, NodeWindows]]:
    boundaries = query.boundaries(end)
    found = {}
    for name, promql in sides.items():
        series = ask(query.url, promql, boundaries[0], boundaries[-1], query.step_s)
        found[name] = node_windows(series, query.node_label, boundaries)
    return found


def format_judgement(judgement: FleetJudgement) -> str:
    """The verdict, the figures that decided it, and every node's own figures, as text."""
    v = judgement.verdict
    lines = [f"fleet verdict: {v.outcome}: {printable(v.reason)}"]
    if v.p_value is not None:
        alpha, share, bound = v.settings["alpha_group"], v.quiet_share, f"{1 - v.settings['beta']:.0%}"
        lines.append(f"  treated p999 over the control's, every sub-window: x{v.shift:g} (upper {bound} bound x{v.upper:g}); "
                     f"group test p = {v.p_value:.2g} (fails at {alpha * (1 - share):.2g})")
        if share > 0:
            lines.append(f"  the same, each node's quieter half of sub-windows: x{v.quiet_shift:g} (upper {bound} bound "
                         f"x{v.quiet_upper:g}); group test p = {v.quiet_p_value:.2g} (fails at {alpha * share:.2g})")
        lines.append(f"  tolerance x{1 + v.settings['tolerance']:g}, harm x{v.settings['harm']:g}; reference: the control "
                     f"nodes' p{v.settings['reference_quantile'] * 100:g} each sub-window")
    for name, (start, end) in judgement.windows.items():
        lines.append(f"  window {name} the change: {_time(start)} .. {_time(end)}")
    rows = []
    for n in sorted(v.nodes, key=lambda n: (n.group, n.node)):
        notes = [*([f"LEFT OUT: {n.left_out}"] if n.left_out else []), *n.notes,
                 *(["REGRESSED ALONE"] if n.node in v.regressed_nodes else [])]
        rows.append((n.node, n.group, str(n.waits), _us(n.p99_us), _us(n.p999_us), str(n.sub_windows),
                     f"x{n.score:g}" if n.score is not None else "-",
                     f"x{n.quiet_score:g}" if n.quiet_score is not None else "-",
                     f"{n.p_value:.2g}" if n.p_value is not None else "-", "; ".join(notes)))
    header = ("node", "group", "waits", "p99 us", "p999 us", "sub-windows", "score", "quieter half", "p", "notes")
    lines += ["  " + line for line in format_table(header, rows)]
    return "\n".join(lines)


def _us(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:g}"


def _time(unix: float) -> str:
    import datetime
    return datetime.datetime.fromtimestamp(unix, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
