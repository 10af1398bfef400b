"""The fleet judge: PromQL's histogram_quantile, Prometheus's query_range answer read (and refused
when it is not one), each node's sub-windows with resets and gaps named, and the verdict."""

from __future__ import annotations

import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from tuned_rl.fleet.node_windows import NodeWindows, node_windows
from tuned_rl.fleet.prometheus import PrometheusError, Series, check_url, parse_matrix, query_range
from tuned_rl.fleet.quantiles import histogram_quantile
from tuned_rl.fleet.verdict import FAIL, INCONCLUSIVE, PASS, FleetSettings, _quiet_rank_p, judge

BOUNDS = [1e-6 * 2 ** (k / 4) for k in range(60)] + [math.inf]


def test_histogram_quantile_interpolates_in_its_bucket_as_promql_does():
    bounds, cumulative = [0.1, 0.2, 0.4, math.inf], [10, 60, 100, 100]
    assert histogram_quantile(0.5, bounds, cumulative) == pytest.approx(0.1 + 0.1 * 40 / 50)
    assert histogram_quantile(0.05, bounds, cumulative) == pytest.approx(0.05)  # from 0 below the first bound
    assert histogram_quantile(0.999, [0.1, 0.2, math.inf], [10, 20, 30]) == 0.2  # in +Inf: the highest finite bound
    assert math.isnan(histogram_quantile(0.9, bounds, [0, 0, 0, 0]))
    with pytest.raises(ValueError):
        histogram_quantile(0.5, [0.1, 0.2], [1, 2])


def node(name: str, rng, minutes: int = 15, ratio: float = 1.0, waits: int = 60_000, shared=None) -> NodeWindows:
    """A node whose waits are log-normal (median 20 us), scaled by its own factor and each minute's."""
    own = math.exp(rng.normal(0, 0.1))
    counts = []
    for minute in range(minutes):
        scale = own * ratio * (shared[minute] if shared is not None else 1.0)
        samples = np.exp(rng.normal(math.log(20e-6), 0.8, waits)) * scale
        counts.append(np.cumsum(np.bincount(np.searchsorted(BOUNDS, samples), minlength=len(BOUNDS))).astype(float))
    return NodeWindows(name, BOUNDS, counts)


def fleet(rng, treated_ratio=1.0, alone: float | None = None, sides=8):
    shared = np.exp(rng.normal(0, 0.15, 15))  # a fleet-wide peak moves every node
    treated = {f"t{i}": node(f"t{i}", rng, ratio=(alone if alone and i == 0 else treated_ratio), shared=shared)
               for i in range(sides)}
    control = {f"c{i}": node(f"c{i}", rng, shared=shared) for i in range(sides)}
    return treated, control


def test_an_unchanged_fleet_passes_a_broad_regression_fails_and_one_node_alone_is_named():
    rng = np.random.default_rng(3)
    same = judge(*fleet(rng))
    assert same.outcome == PASS and same.upper < 1.5, same.reason
    worse = judge(*fleet(rng, treated_ratio=2.0))
    assert worse.outcome == FAIL and worse.shift > 1.6 and worse.p_value < 0.005, worse.reason
    one = judge(*fleet(rng, alone=3.0))
    assert one.outcome == FAIL and one.regressed_nodes == ["t0"], one.reason
    assert "t0" in one.reason


def test_too_few_nodes_is_inconclusive_and_says_how_many_are_needed():
    rng = np.random.default_rng(4)
    treated, control = fleet(rng, sides=2)
    verdict = judge(treated, control)
    assert verdict.outcome == INCONCLUSIVE and verdict.needed_nodes == 3 and "at least 3" in verdict.reason


def test_an_undecided_wave_that_looks_worse_says_how_far_each_group_test_was_from_failing_it():
    rng = np.random.default_rng(4)
    treated, control = fleet(rng, treated_ratio=2.0, sides=3)  # 3 a side: no rank test of so few reaches 0.005
    verdict = judge(treated, control)
    assert verdict.outcome == INCONCLUSIVE and verdict.shift > 1.5, verdict.reason
    assert f"over every sub-window p = {verdict.p_value:.2g} (fails at 0.001)" in verdict.reason
    assert f"over the quieter halves p = {verdict.quiet_p_value:.2g} (fails at 0.004)" in verdict.reason
    assert "5 a side can" in verdict.reason
    same = judge(*fleet(rng, sides=3))
    assert "not shown" not in same.reason, same.reason  # nothing to say where it does not look worse


def test_a_reset_and_a_node_that_stops_reporting_are_named_and_flip_nothing():
    rng = np.random.default_rng(5)
    treated, control = fleet(rng)
    before = judge(treated, control)
    treated["t1"].counts[4] = None
    treated["t1"].resets.append(240.0)
    control["c2"].counts[9:] = [None] * 6
    control["c2"].missing += [600.0 + 60 * i for i in range(6)]
    control["c3"].counts[:9] = [None] * 9  # more than half its sub-windows gone: left out
    after = judge(treated, control)
    assert after.outcome == before.outcome == PASS
    figures = {n.node: n for n in after.nodes}
    assert "watch restarted" in figures["t1"].notes[0] and figures["t1"].left_out is None
    assert "did not report in 6" in figures["c2"].notes[0]
    assert figures["c3"].left_out and "6 of 15" in figures["c3"].left_out


def episodic_node(name: str, rng, ratio: float = 1.0, minutes: int = 15, waits: int = 60_000) -> NodeWindows:
    """A node whose minutes fall in two modes: in 45% of them a stall episode gives 0.3% of its waits
    1-10 ms more (minute p999 about x20); ``ratio`` multiplies every wait."""
    counts = []
    for _ in range(minutes):
        samples = np.exp(rng.normal(math.log(20e-6), 0.8, waits))
        if rng.random() < 0.45:
            hit = rng.random(waits) < 0.003
            samples[hit] += rng.uniform(1e-3, 10e-3, hit.sum())
        samples *= ratio
        counts.append(np.cumsum(np.bincount(np.searchsorted(BOUNDS, samples), minlength=len(BOUNDS))).astype(float))
    return NodeWindows(name, BOUNDS, counts)


def episodic_fleet(rng, treated_ratio: float, sides: int = 10):
    before = {f"{side}{i}": episodic_node(f"{side}{i}", rng) for side in "tc" for i in range(sides)}
    treated = {f"t{i}": episodic_node(f"t{i}", rng, ratio=treated_ratio) for i in range(sides)}
    control = {f"c{i}": episodic_node(f"c{i}", rng) for i in range(sides)}
    return treated, control, before


def test_on_nodes_with_stall_episodes_a_broad_regression_fails_by_the_quieter_halves_and_an_unchanged_fleet_passes():
    """Where a node's minutes jump between quiet and a stall episode, its score over every minute is
    noisy, and so is a reference that the episodes of a few control nodes move (the control nodes'
    pooled p999). Each node's quieter half of minutes, against a pooled p99.5, sees x1.5 plainly."""
    rng = np.random.default_rng(11)
    treated, control, before = episodic_fleet(rng, 1.5)
    verdict = judge(treated, control, before=before)
    assert verdict.outcome == FAIL and verdict.quiet_p_value <= 0.004, verdict.reason
    assert 1.35 < verdict.quiet_shift < 1.7 and "quieter half" in verdict.reason
    every_minute_alone = judge(treated, control, FleetSettings(reference_quantile=0.999, quiet_share=0), before=before)
    assert every_minute_alone.outcome != FAIL, every_minute_alone.reason  # the judge before: it could not tell
    same = judge(*episodic_fleet(rng, 1.0)[:2], before=episodic_fleet(rng, 1.0)[2])
    assert same.outcome != FAIL and not same.regressed_nodes, same.reason


def test_the_quieter_minutes_rank_test_holds_its_level_where_sub_windows_are_exchangeable():
    """Its p is a relabelling's: under no change (after and before drawn alike, two modes) p <= a
    in about a share a of trials, where a rank test on the two lower halves would not hold it."""
    rng = np.random.default_rng(13)

    def minutes():
        return np.where(rng.random(15) < 0.45, rng.normal(3, 0.5, 15), rng.normal(0, 0.2, 15))

    p = np.array([_quiet_rank_p(minutes(), minutes(), relabellings=999) for _ in range(600)])
    assert 0.03 <= np.mean(p <= 0.05) <= 0.075 and np.mean(p <= 0.01) <= 0.02
    shifted = [_quiet_rank_p(minutes() + 0.6, minutes(), relabellings=4999) for _ in range(20)]
    assert np.median(shifted) < 0.01


def series(node_name: str, le: str, samples) -> Series:
    return Series({"instance": node_name, "le": le, "target": "name:infer"}, samples)


def test_node_windows_take_increments_between_boundaries_and_name_resets_and_gaps():
    times = [0.0, 60.0, 120.0, 180.0]
    rows = [series("a:9100", "0.001", [(0, 10), (60, 20), (120, 5), (180, 15)]),  # watch restarted before 120
            series("a:9100", "+Inf", [(0, 12), (60, 25), (120, 6), (180, 20)]),
            series("b:9100", "0.001", [(0, 1), (60, 2), (180, 4)]),  # no sample at 120
            series("b:9100", "+Inf", [(0, 1), (60, 3), (180, 9)])]
    windows = node_windows(rows, "instance", times)
    a, b = windows["a:9100"], windows["b:9100"]
    assert a.counts[0].tolist() == [10, 13] and a.counts[1] is None and a.resets == [120.0]
    assert a.counts[2].tolist() == [10, 14]
    assert b.counts[1] is None and b.counts[2] is None and b.missing == [120.0, 180.0]


class FakePrometheus(BaseHTTPRequestHandler):
    answer: bytes = b""
    status = 200
    asked: list = []

    def do_GET(self):  # noqa: N802 - http.server's name
        FakePrometheus.asked.append(self.path)
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(self.answer)

    def log_message(self, *args):
        pass


@pytest.fixture
def prometheus():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakePrometheus)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_query_range_asks_prometheus_and_reads_its_matrix(prometheus):
    FakePrometheus.status, FakePrometheus.asked = 200, []
    FakePrometheus.answer = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"instance": "a", "le": "+Inf"}, "values": [[0, "1"], [60, "5"]]}]}}).encode()
    found = query_range(prometheus, 'tuned_rl_runqueue_latency_seconds_bucket{job="nodes"}', 0, 60, 60)
    assert found == [Series({"instance": "a", "le": "+Inf"}, [(0.0, 1.0), (60.0, 5.0)])]
    assert "/api/v1/query_range?query=tuned_rl_runqueue_latency_seconds_bucket" in FakePrometheus.asked[0]
    FakePrometheus.status, FakePrometheus.answer = 400, b'{"status": "error", "error": "parse error at char 5"}'
    with pytest.raises(PrometheusError, match="HTTP 400: parse error at char 5"):
        query_range(prometheus, "bad{", 0, 60, 60)


def test_anything_but_a_successful_matrix_is_refused_with_why():
    with pytest.raises(PrometheusError, match="not JSON"):
        parse_matrix(b"<html>")
    with pytest.raises(PrometheusError, match="not a matrix"):
        parse_matrix(b'{"status": "success", "data": {"resultType": "vector", "result": []}}')
    with pytest.raises(PrometheusError, match="cannot be read"):
        parse_matrix(b'{"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {}}]}}')
    with pytest.raises(PrometheusError, match="not an http"):
        check_url("file:///etc/passwd")
    with pytest.raises(PrometheusError, match="cannot ask"):
        query_range("http://127.0.0.1:9", "x", 0, 60, 60, timeout=2)
    assert FleetSettings().alpha_group + FleetSettings().alpha_node == 0.01


def test_a_selector_is_only_label_matchers_and_node_names_are_escaped():
    from tuned_rl.fleet.selection import SelectionError, bucket_query, node_matcher, parse_nodes, parse_selector
    matchers = parse_selector('{job="tuned-rl", node_class=~"a100.*",zone!="b\\"x"}')
    assert [str(m) for m in matchers] == ['job="tuned-rl"', 'node_class=~"a100.*"', 'zone!="b\\"x"']
    for bad in ('job="a"} or vector(1)', "job=a", "up", 'le="0.1"', 'job="a",,', 'job="a" job="b"', 'job="a\n"'):
        with pytest.raises(SelectionError):
            parse_selector(bad)
    assert parse_selector("") == []
    # A node name is matched as itself: regex characters and quotes escaped, for RE2 and PromQL's string.
    matcher = node_matcher("instance", ['10.0.0.1:9464', 'odd"|.*'])
    assert str(matcher) == 'instance=~"10\\\\.0\\\\.0\\\\.1:9464|odd\\"\\\\|\\\\.\\\\*"'
    assert bucket_query(matchers[:1], "instance") == (
        'sum by (instance, le) (tuned_rl_runqueue_latency_seconds_bucket{job="tuned-rl"})')
    for bad in ("", "a,a", "x\x1b[2J"):
        with pytest.raises(SelectionError):
            parse_nodes(bad)
    with pytest.raises(SelectionError):
        bucket_query([], "le")


def cumulative_series(windows: NodeWindows, label: str, start: float, step: float) -> list[Series]:
    """What Prometheus answers for a node whose sub-window increments are ``windows.counts``."""
    total = np.zeros(len(windows.bounds))
    values = [total.copy()]
    for counts in windows.counts:
        total = total + counts
        values.append(total.copy())
    return [Series({label: windows.node, "le": "+Inf" if math.isinf(b) else repr(b)},
                   [(start + k * step, float(v[i])) for k, v in enumerate(values)])
            for i, b in enumerate(windows.bounds)]


def test_the_fleet_judge_asks_once_a_side_and_names_a_listed_node_without_data():
    from tuned_rl.fleet.fleet_run import FleetQuery, Side, format_judgement, run_fleet_judge
    from tuned_rl.fleet.selection import SelectionError, parse_selector
    rng = np.random.default_rng(6)
    treated, control = fleet(rng, treated_ratio=2.0)
    end, step = 10_000.0, 60.0
    asked = []

    def ask(url, query, start, stop, every):
        asked.append((query, start, stop, every))
        side = treated if 'group="treated"' in query else control
        return [s for w in side.values() for s in cumulative_series(w, "instance", start, every)]

    query = FleetQuery("http://prometheus:9090", Side(tuple(parse_selector('group="treated"'))),
                       Side(tuple(parse_selector('group="control"')), ("c0", "c1", "c2", "c3", "c4", "c5", "c6", "c7",
                                                                         "gone:9464")),
                       end, 900.0, step)
    judgement = run_fleet_judge(query, ask)
    assert judgement.verdict.outcome == FAIL and judgement.verdict.shift > 1.6
    assert [a[1:] for a in asked] == [(end - 900, end, step)] * 2
    assert 'instance=~"c0|c1|c2|c3|c4|c5|c6|c7|gone:9464"' in asked[1][0]
    gone = next(n for n in judgement.verdict.nodes if n.node == "gone:9464")
    assert gone.left_out.startswith("no data") and gone.group == "control"
    text = format_judgement(judgement)
    assert text.startswith("fleet verdict: fail: ") and "gone:9464" in text and "LEFT OUT: no data" in text
    assert judgement.to_dict()["queries"]["treated"].startswith("sum by (instance, le)")
    # A node on both sides is an error, not a choice; so is a window that is not whole sub-windows.
    with pytest.raises(SelectionError, match="both"):
        run_fleet_judge(FleetQuery("http://p:9090", Side(tuple(parse_selector('group="treated"'))),
                                   Side(tuple(parse_selector('group="treated"'))), end), ask)
    with pytest.raises(SelectionError, match="sub-windows"):
        run_fleet_judge(FleetQuery("http://p:9090", query.treated, query.control, end, 90.0, 60.0), ask)


def test_fleet_judge_on_the_command_line_exits_by_its_verdict(prometheus, capsys):
    from tuned_rl.cli import main
    rng = np.random.default_rng(7)
    treated, control = fleet(rng)
    end = 20_000.0

    def answer(group):
        side = treated if group == "treated" else control
        return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
            {"metric": s.labels, "values": [[t, repr(v)] for t, v in s.samples]}
            for w in side.values() for s in cumulative_series(w, "instance", end - 900, 60.0)]}}).encode()

    class Answering(FakePrometheus):
        def do_GET(self):  # noqa: N802
            FakePrometheus.answer = answer("treated" if "treated" in self.path else "control")
            super().do_GET()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answering)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        FakePrometheus.status = 200
        status = main(["fleet", "judge", "--prometheus", url, "--treated", 'group="treated"', "--control",
                       'group="control"', "--end", "1970-01-01T05:33:20Z", "--window", "15m", "--json"])
        report = json.loads(capsys.readouterr().out)
        assert status == 0 and report["outcome"] == "pass" and len(report["nodes"]) == 16
        assert report["windows"]["after"] == [end - 900, end]
        status = main(["fleet", "judge", "--prometheus", url, "--treated", 'group="treated"', "--control",
                       'group="control"', "--end", "20000", "--window", "15m", "--harm", "1.0001"])
        out = capsys.readouterr().out
        assert status == 3 and out.startswith("fleet verdict: inconclusive")
    finally:
        server.shutdown()
        server.server_close()
    assert main(["fleet", "judge", "--prometheus", "http://127.0.0.1:9", "--treated", 'a="b"', "--control",
                 'a="c"', "--end", "20000"]) == 4
    assert main(["fleet", "judge", "--prometheus", "http://127.0.0.1:9", "--treated", "up or 1", "--control",
                 'a="c"']) == 2
