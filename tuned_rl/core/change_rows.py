"""One row per journaled change, as rollback and status report it, and how many a table shows."""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass

from tuned_rl.core.outcomes import Restore, State

SHOWN_ROWS = 40  # a table for people shows this many rows, the unusual ones first; JSON lists all


class Row:
    """A row's JSON: its fields in order, ``reason`` only when there is one."""

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        if data["reason"] is None:
            del data["reason"]
        return data


@dataclass
class RestoredChange(Row):
    """What rollback did with one change: ``before`` is the value found, ``after`` the one left."""

    plugin: str | None
    step: str | None
    target: str
    before: str | None
    after: str | None
    outcome: Restore | None = None
    reason: str | None = None


@dataclass
class ChangeStatus(Row):
    """One applied change as status reads it back: original, applied, now, and its state."""

    plugin: str | None
    step: str | None
    target: str
    before: str | None
    after: str | None
    current: str | None
    state: State | None = None
    reason: str | None = None


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
