"""A profile from diagnose's findings: a [target] naming the workload, and each recommended table
with comments citing the finding behind it. `tuned-rl apply` then verifies every step as always.
"""

from __future__ import annotations

from dataclasses import fields

from tuned_rl.diagnose.findings import Finding
from tuned_rl.host import printable
from tuned_rl.measure.canary import CanarySpec
from tuned_rl.measure.targets import Target


def target_table(target: Target, canary: CanarySpec | None) -> dict:
    """The [target] table that names what diagnose measured."""
    if target.kind != "canary":
        table = {target.kind: int(target.value) if target.kind == "pid" else target.value}
        if target.kind == "name" and target.users != ("root",):
            table["users"] = list(target.users)
        return table
    table: dict = {"canary": True}
    default = CanarySpec()
    for spec_field in fields(CanarySpec):
        value = getattr(canary or default, spec_field.name)
        if value is not None and value != getattr(default, spec_field.name):
            table[f"canary_{spec_field.name}"] = value
    return table


def write_profile(name: str, target: Target, canary: CanarySpec | None, findings: list[Finding],
                  latency: dict) -> str:
    """The profile's text (TOML). Findings without a table become comments only."""
    lines = [f"# Written by `tuned-rl diagnose --target {target}` from what it measured: p99 "
             f"{latency.get('p99_us', 0) / 1000:.2f} ms, p999 {latency.get('p999_us', 0) / 1000:.2f} ms, max "
             f"{latency.get('max_us', 0) / 1000:.2f} ms over {latency.get('n', 0)} waits.",
             "# Review it, then `tuned-rl apply` it: each step is measured before and after, and reverted if it",
             "# makes p999 worse.", "", "[profile]", f"name = {_value(name)}", "", "[target]"]
    if target.kind == "pid":
        lines.append("# A pid changes when the workload restarts: name it by process name, cgroup or unit instead.")
    lines += [f"{key} = {_value(value)}" for key, value in target_table(target, canary).items()]
    written = set()
    for finding in findings:
        lines.append("")
        lines += [f"# {text}" for text in _comment(finding)]
        if finding.table is None:
            continue
        if finding.table in written:  # a table is written once, with every finding's keys for it
            lines.append(f"# (its keys are in [{finding.table}] above)")
            continue
        written.add(finding.table)
        settings: dict = {}
        for same in (f for f in findings if f.table == finding.table):
            for key, value in (same.settings or {}).items():
                if isinstance(value, dict):
                    settings[key] = {**settings.get(key, {}), **value}
                else:
                    settings.setdefault(key, value)
        matchers = settings.pop("match", None)
        subtables = {key: settings.pop(key) for key in [k for k, v in settings.items() if isinstance(v, dict)]}
        lines.append(f"[{finding.table}]")
        lines += [f"{key} = {_value(value)}" for key, value in settings.items()]
        for key, table in subtables.items():
            lines += ["", f"[{finding.table}.{key}]"] + [f"{toml_string(k)} = {_value(v)}" for k, v in table.items()]
        for matcher in matchers or []:
            lines += ["", f"[[{finding.table}.match]]"] + [f"{k} = {_value(v)}" for k, v in matcher.items()]
    return "\n".join(lines) + "\n"


def _comment(finding: Finding) -> list[str]:
    head = f"Finding ({finding.cause}): {finding.summary}."
    body = [f"  - {line}" for line in finding.evidence]
    tail = [f"Fix: {finding.advice}." if finding.table else f"No table here can fix it: {finding.advice}."]
    return [printable(line) for line in (head, *body, *tail)]


def _value(value) -> str:
    """A TOML value: a boolean, a number, a list of them, or a basic string."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_value(item) for item in value) + "]"
    return toml_string(str(value))


def toml_string(text: str) -> str:
    """A TOML basic string holding ``text`` exactly: quote and backslash escaped, every control
    character as \\uXXXX (TOML allows none raw), everything else as it is (the file is UTF-8)."""
    out = ['"']
    for char in text:
        if char in '"\\':
            out.append("\\" + char)
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04X}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)
