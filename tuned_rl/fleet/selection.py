"""Which series the fleet judge asks Prometheus for: label matchers checked to be only matchers (an
operator's text is put into PromQL, so nothing but ``label OP "value"`` pairs gets in), node lists as an
anchored, escaped regex, and the one query: every node's bucket counters, other labels summed."""

from __future__ import annotations

import re
from dataclasses import dataclass

METRIC = "tuned_rl_runqueue_latency_seconds_bucket"
LABEL = r"[A-Za-z_][A-Za-z0-9_]*"
VALUE = r'"(?:[^"\\\n]|\\.)*"'  # a PromQL double-quoted string
MATCHER = re.compile(rf"\s*({LABEL})\s*(=~|!~|!=|=)\s*({VALUE})\s*")
MAX_NODES = 10_000  # a node list longer than any fleet is a mistake, not a query


class SelectionError(ValueError):
    """A selector or node list the judge will not put into a query."""


@dataclass(frozen=True)
class Matcher:
    label: str
    op: str
    value: str  # as written, quoted

    def __str__(self) -> str:
        return f"{self.label}{self.op}{self.value}"


def parse_selector(text: str) -> list[Matcher]:
    """``job="tuned-rl",node_class=~"a100.*"`` (braces allowed around it) as matchers; anything else
    (a function, a second metric, an unquoted value) is refused with where it went wrong."""
    body = text.strip()
    if body.startswith("{") and body.endswith("}"):
        body = body[1:-1]
    matchers, at = [], 0
    while body[at:].strip():
        found = MATCHER.match(body, at)
        if found is None:
            raise SelectionError(f"{text!r}: not label matchers (label=\"value\", with = != =~ !~, comma-separated) "
                                 f"from {body[at:at + 30]!r}")
        matchers.append(Matcher(found.group(1), found.group(2), found.group(3)))
        at = found.end()
        if at < len(body):
            if body[at] != ",":
                raise SelectionError(f"{text!r}: a comma was expected at {body[at:at + 30]!r}")
            at += 1
    if any(m.label == "le" for m in matchers):
        raise SelectionError(f"{text!r}: the judge reads every bucket; a matcher on le would drop some")
    return matchers


def parse_nodes(text: str) -> list[str]:
    """A comma-separated list of node label values (host:port as Prometheus names its targets)."""
    nodes = [n.strip() for n in text.split(",") if n.strip()]
    if not nodes:
        raise SelectionError("an empty node list")
    if len(nodes) > MAX_NODES:
        raise SelectionError(f"{len(nodes)} nodes: more than {MAX_NODES}")
    for node in nodes:
        if any(ord(c) < 32 for c in node) or len(node) > 253:
            raise SelectionError(f"{node!r} is not a node name")
    if len(set(nodes)) != len(nodes):
        raise SelectionError(f"a node is listed twice in {text!r}")
    return nodes


def node_matcher(node_label: str, nodes: list[str]) -> Matcher:
    """``node_label=~"a|b"``: each name escaped for RE2 and for PromQL's string (Prometheus anchors it)."""
    pattern = "|".join(re.escape(n) for n in nodes)
    quoted = pattern.replace("\\", "\\\\").replace('"', '\\"')
    return Matcher(node_label, "=~", f'"{quoted}"')


def bucket_query(matchers: list[Matcher], node_label: str) -> str:
    """Each node's cumulative bucket counters: ``sum by (node_label, le)`` of the histogram's series
    that match (a node with two series, a profile re-applied under a new name, counts once each)."""
    if not re.fullmatch(LABEL, node_label) or node_label == "le":
        raise SelectionError(f"{node_label!r} is not a label a node can be named by")
    return f"sum by ({node_label}, le) ({METRIC}{{{','.join(str(m) for m in matchers)}}})"
