"""[lab_write]: the scenario lab's throw-away plugin, writing one cgroup or sysctl file.

Installed by lab.py into a folder of its own and loaded through the `tuned_rl`
entry point, like any third-party plugin. Not shipped with tuned-rl.
"""

from tuned_rl import Change, Key, Problem, Step, Table, hookimpl

ALLOWED = ("/sys/fs/cgroup/", "/proc/sys/")


@hookimpl
def tuned_rl_tables():
    return [Table("lab_write", "Write one value (scenario lab only).", {
        "path": Key(str, "A cgroupfs or /proc/sys file."),
        "value": Key(str, "What to write."),
        "title": Key(str, "The step's name in reports."),
        "steps": Key(list, "More steps, one each: \"PATH=VALUE\".", item_type=str),
    })]


def _writes(table: dict) -> list[tuple[str, str, str]]:
    """(path, value, title) of each step the table asks for."""
    writes = [(table["path"], table["value"], table.get("title", f"write {table['path']}"))] if "path" in table else []
    for text in table.get("steps", []):
        path, _, value = text.partition("=")
        writes.append((path, value, f"write {path}"))
    return writes


@hookimpl
def tuned_rl_validate(profile, host):
    table = profile.get("lab_write")
    if table is None:
        return None
    problems = [] if _writes(table) else [Problem("lab_write", "set path and value, or steps")]
    for path, _, _ in _writes(table):
        if not path.startswith(ALLOWED) or ".." in path:
            problems.append(Problem("lab_write.path", f"{path} must be below {' or '.join(ALLOWED)}"))
        elif not host.exists(path):
            problems.append(Problem("lab_write.path", f"{path} does not exist"))
    return problems


@hookimpl
def tuned_rl_plan(profile, host):
    table = profile.get("lab_write")
    if table is None:
        return None
    return [Step("lab_write", title, [Change("file", path, host.read(path), value)])
            for path, value, title in _writes(table)]
