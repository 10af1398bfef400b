"""One row per journaled change, as rollback and status report it, and how many a table shows."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from tuned_rl.core.outcomes import Restore, State

SHOWN_ROWS = 40  # a table for people shows this many rows, the unusual ones first; JSON lists all


@dataclass
class RestoredChange:
    """What rollback did with one change: ``before`` is the value found, ``after`` the one left."""

    plugin: str | None
    step: str | None
    target: str
    before: str | None
    after: str | None
    outcome: Restore | None = None
    reason: str | None = None

    def to_dict(self) -> dict:
        data = {"plugin": self.plugin, "step": self.step, "target": self.target, "before": self.before,
                "after": self.after, "outcome": self.outcome}
        if self.reason is not None:
            data["reason"] = self.reason
        return data


@dataclass
class ChangeStatus:
    """One applied change as status reads it back: original, applied, now, and its state."""

    plugin: str | None
    step: str | None
    target: str
    before: str | None
    after: str | None
    current: str | None
    state: State | None = None
    reason: str | None = None

    def to_dict(self) -> dict:
        data = {"plugin": self.plugin, "step": self.step, "target": self.target, "before": self.before,
                "after": self.after, "current": self.current, "state": self.state}
        if self.reason is not None:
            data["reason"] = self.reason
        return data


def shown(value) -> str:
    """A value in a table cell: (absent), "" for an empty one, whitespace folded."""
    return "(absent)" if value is None else " ".join(str(value).split()) or '""'


def for_people(rows: list, key: str, routine: str) -> tuple[list, list[str]]:
    """At most SHOWN_ROWS rows (the unusual ones first, then in order), and a line counting the rest;
    ``key`` names the attribute whose value ``routine`` is the usual one."""
    if len(rows) <= SHOWN_ROWS:
        return rows, []
    order = sorted(range(len(rows)), key=lambda i: getattr(rows[i], key) == routine)[:SHOWN_ROWS]
    picked = [rows[i] for i in sorted(order)]
    left = Counter(str(getattr(rows[i], key)) for i in set(range(len(rows))) - set(order))
    return picked, [f"... and {sum(left.values())} more: " + ", ".join(f"{n} {state}" for state, n in left.items())
                    + " (--json lists every change)"]
