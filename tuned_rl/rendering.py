"""Tables and JSON as every command prints them: a floor below the reports of core, measure and
diagnose, so that none of them imports another's to format a table."""

from __future__ import annotations

import json

from tuned_rl.host.untrusted import printable


class RendersJson:
    """A report whose ``to_dict()`` is its stable JSON: ``to_json()`` writes it as every command does."""

    def to_dict(self) -> dict:
        raise NotImplementedError

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def format_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    """Left-aligned columns, the last one left ragged. Every cell is printed with its control and
    format characters escaped: a process name or cgroup holding a newline or a terminal escape
    cannot hide a row, or forge one, in a table a reviewer reads."""
    header = tuple(printable(cell) for cell in header)
    rows = [tuple(printable(cell) for cell in row) for row in rows]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    return ["  ".join([*(cell.ljust(w) for cell, w in zip(row, widths)), row[-1]]).rstrip()
            for row in [header, *rows]]
