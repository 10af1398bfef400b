"""What `status` reads back: the applied profile, each change's state, what waits for the workload
and what watch did since, as the stable JSON report and as a table for people."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tuned_rl.core.change_rows import ChangeStatus, for_people, shown
from tuned_rl.core.outcomes import State
from tuned_rl.rendering import RendersJson, format_table
from tuned_rl.host.untrusted import printable
from tuned_rl.measure.stats import format_us

NOW_SHOWN = (State.HOLDS, State.DRIFTED, State.INTERRUPTED)  # states whose current value is worth a cell


def _when(at: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) if at else "?"


@dataclass
class StatusReport(RendersJson):
    profile: str | None
    path: str | None = None
    digest: str | None = None
    applied_at: float | None = None
    stale: bool = False  # the journal is of an earlier boot
    changes: list[ChangeStatus] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    deferred: list[str] = field(default_factory=list)  # tables waiting for the workload
    deferred_results: list[dict] = field(default_factory=list)  # what watch made of them
    awaiting: list[dict] = field(default_factory=list)  # steps applied unverified, verified when it starts
    verified: list[dict] = field(default_factory=list)
    verified_p999_us: float | None = None  # what watch compares with
    watched: list[dict] = field(default_factory=list)  # records watch wrote since the apply
    watch_plugin_failures: dict = field(default_factory=dict)  # plugin -> its failures on processes, as watch noted

    def to_dict(self) -> dict:
        return {"profile": self.profile, "path": self.path, "digest": self.digest, "applied_at": self.applied_at,
                "stale": self.stale, "changes": [c.to_dict() for c in self.changes], "removed": self.removed,
                "deferred": self.deferred, "deferred_results": self.deferred_results, "awaiting": self.awaiting,
                "verified": self.verified, "verified_p999_us": self.verified_p999_us, "watched": self.watched,
                "watch_plugin_failures": self.watch_plugin_failures}

    def to_text(self) -> str:
        lines = [f"removed {path}: a killed tuned-rl had left it recording" for path in self.removed]
        if self.profile is None and not self.changes:
            return "\n".join(lines + ["nothing applied"])
        boot = ("an earlier boot: a reboot reset its kernel run-time values; files it wrote survive it"
                if self.stale else "this boot")
        lines.append(f"profile {self.profile} ({self.path}) applied {_when(self.applied_at)}, {boot}")
        picked, rest = for_people(self.changes, "state", State.HOLDS)
        rows = [(c.target, shown(c.before), shown(c.after), shown(c.current) if c.state in NOW_SHOWN else "-",
                 str(c.state) + (f" ({c.reason})" if c.reason is not None else "")) for c in picked]
        lines += format_table(("TARGET", "ORIGINAL", "APPLIED", "NOW", "STATE"), rows) + rest
        lines += [f"[{table}]: deferred until the workload starts (`tuned-rl watch` applies and verifies it then)"
                  for table in self.deferred]
        lines += [f"[{entry['table']}] {printable(entry['step'])}: applied unverified (the workload was not "
                  "running); `tuned-rl watch` verifies it when it starts" for entry in self.awaiting]
        if self.verified_p999_us:
            lines.append(f"the target's p999 as the last verified step left it: {format_us(self.verified_p999_us)} "
                         "(`tuned-rl watch`, measuring a workload target, says \"regressed\" when its window passes "
                         "this by --regressed-factor)")
        for result in self.deferred_results:
            figures = (f", p999 {format_us(result['p999_without_us'])} -> {format_us(result['p999_with_us'])}"
                       f" (n {result['samples_without']} / {result['samples_with']})"
                       if "p999_with_us" in result and "samples_with" in result else "")
            lines.append(f"[{result['table']}] {printable(result.get('step', ''))}: {result.get('after', 'deferred')}, "
                         f"then {result['outcome']} by watch at {_when(result['at'])} when pid {result['pid']} "
                         f"started{figures} ({result['reason']})")
        for plugin, failure in sorted(self.watch_plugin_failures.items()):
            lines.append(printable(f"plugin {plugin} failed on {failure.get('count')} process(es) under tuned-rl watch, "
                                   f"last at {_when(failure.get('last_at'))}: {failure.get('last_error')} (its steps "
                                   "were left out for those processes; the other plugins acted)"))
        if self.watched:
            lines.append(f"placed or evicted by tuned-rl watch since the apply ({len(self.watched)} records; their "
                         "changes are among the rows above):")
            rows = [(_when(w["at"]), w["plugin"], w["step"],
                     ", ".join(map(str, w["pids"][:8])) + (" ..." if len(w["pids"]) > 8 else ""))
                    for w in self.watched[-20:]]
            lines += format_table(("AT", "PLUGIN", "STEP", "PIDS"), rows)
        return "\n".join(lines)
