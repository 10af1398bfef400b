"""What `rollback` did: every change restored (or left, gone, failed), records refused, a stale
journal carried over, as the stable JSON report and as a table for people."""

from __future__ import annotations

from dataclasses import dataclass, field

from tuned_rl.core.change_rows import RestoredChange, for_people
from tuned_rl.core.outcomes import Restore
from tuned_rl.rendering import RendersJson, format_table


@dataclass
class RollbackReport(RendersJson):
    profile: str | None  # the applied profile's name; None for an apply that never finished
    changes: list[RestoredChange] = field(default_factory=list)
    stale: dict | None = None  # a journal of an earlier boot: records, set_aside, carried, boot_ids, kept_in
    refused: list[dict] = field(default_factory=list)  # {"path", "reason"}: records not replayed
    refused_kept_in: str | None = None
    removed: list[str] = field(default_factory=list)  # leftovers of a killed tuned-rl, removed

    @property
    def failed(self) -> bool:
        return bool(self.refused) or any(c.outcome == Restore.FAILED for c in self.changes)

    def to_dict(self) -> dict:
        return {"profile": self.profile, "changes": [c.to_dict() for c in self.changes], "stale": self.stale,
                "refused": self.refused, "refused_kept_in": self.refused_kept_in, "removed": self.removed}

    def to_text(self) -> str:
        lines = [f"removed {path}: a killed tuned-rl had left it recording" for path in self.removed]
        lines += [f"refused, not replayed: {refused['reason']}" for refused in self.refused]
        if self.refused:
            lines.append(f"  moved to {self.refused_kept_in}: read them, then delete them; values they held were "
                         "not restored")
        if self.stale:
            stale = self.stale
            lines.append(f"{stale['records']} journaled changes are from an earlier boot: {stale['set_aside']} of "
                         f"kernel run-time state, which the reboot already reset, were not replayed; "
                         f"{stale['carried']} to files that survive a reboot were rolled back; the journal as it "
                         f"was is kept in {stale['kept_in']}")
        if not self.changes and not self.refused and not self.stale:
            lines.append("nothing to roll back")
        elif self.changes:
            lines.append(f"rolled back {self.profile or 'an unfinished apply'}")
            picked, rest = for_people(self.changes, "outcome", Restore.RESTORED)
            rows = [(c.target, str(c.outcome), f"{c.before} -> {c.after}" + (f"  ({c.reason})" if c.reason else ""))
                    for c in picked]
            lines += format_table(("TARGET", "OUTCOME", "NOW -> RESTORED"), rows) + rest
        return "\n".join(lines)
