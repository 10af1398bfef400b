"""diagnose's report for people, from its JSON form."""

from __future__ import annotations

from tuned_rl.rendering import format_table
from tuned_rl.measure.probes.ioctl import format_times as format_ioctl
from tuned_rl.measure.stats import format_us

SHOWN_HOLDERS = 10


def format_diagnosis(result: dict) -> list[str]:
    latency, attribution = result["latency"], result["attribution"]
    lines = [f"{result['target']}: {latency['n']} waits in {latency['seconds']:.0f} s; p50 "
             f"{format_us(latency['p50_us'])}, p99 {format_us(latency['p99_us'])}, p999 "
             f"{format_us(latency['p999_us'])}, max {format_us(latency['max_us'])}"
             + (f"; {latency['lost']} lost" if latency["lost"] else ""), "",
             f"Who it waited behind: {attribution['wait_ms']:.1f} ms of waiting in all; the worst waits "
             f"({format_us(attribution['worst_1pct_from_us'])} and more: {attribution['tail_waits']}, "
             f"{attribution['tail_waits'] / max(attribution['waits'], 1):.1%} of them) "
             f"{attribution['worst_1pct_ms']:.1f} ms"]
    rows = []
    for holder in attribution["holders"][:SHOWN_HOLDERS]:
        rows.append((holder["holder"], holder["name"][:24], holder["role"] or "-", f"{holder['share_of_worst_1pct']:.0%}",
                     f"{holder['share_of_wait']:.0%}", ",".join(holder["cpus"]) or "-",
                     holder.get("policy", "") or "-", (holder.get("cgroup") or "-")[:32]))
    lines += format_table(("HOLDER", "NAME", "ROLE", "WORST 1%", "ALL", "CPUS", "POLICY", "CGROUP"), rows)
    left = len(attribution["holders"]) - SHOWN_HOLDERS
    if left > 0:
        lines.append(f"(and {left} more: --json lists them all)")
    lines += ["", "Findings:" if result["findings"] else "Findings: none of the known causes passed its threshold."]
    for number, finding in enumerate(result["findings"], 1):
        lines.append(f"{number}. {finding['summary']}")
        lines += [f"   - {line}" for line in finding["evidence"]]
        lines.append(f"   fix: [{finding['table']}]: {finding['advice']}" if finding["table"]
                     else f"   no table can fix this: {finding['advice']}")
    if result.get("ioctl"):
        lines += ["", *format_ioctl(result["ioctl"])]
    lines += [f"note: {note}" for note in result.get("notes", [])]
    return lines
