"""The documentation held to the code: every table and key the plugins declare, every change kind
registered, every module of the package and every command-line option has its line in docs/; the
README stays a front door."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tuned_rl.core.kinds import KINDS
from tuned_rl.core.plugin_host import CORE_TABLES, load_plugins
from tuned_rl.profiles.loader import PROFILE_TABLE

ROOT = Path(__file__).parent.parent
DOCS = ROOT / "docs"
sys.path.insert(0, str(ROOT / "tools"))
import manpage  # noqa: E402

# The package's folders, as the module map names them.
PACKAGE_FOLDERS = {"tuned_rl/": ROOT / "tuned_rl", "plugins/": ROOT / "plugins"}


def sections(text: str, level: int) -> dict[str, str]:
    """Heading -> the text below it, up to the next heading of the same or a higher level."""
    found, heading, lines = {}, None, []
    marker = re.compile(rf"^(#{{1,{level}}}) (.*)$")
    for line in text.split("\n"):
        match = marker.match(line)
        if match:
            if heading is not None:
                found[heading] = "\n".join(lines)
            heading, lines = (match.group(2) if len(match.group(1)) == level else None), []
        elif heading is not None:
            lines.append(line)
    if heading is not None:
        found[heading] = "\n".join(lines)
    return found


def table_rows(text: str, header: str) -> list[list[str]]:
    """The rows of the Markdown table whose header line starts with ``header``, as cells."""
    lines = [line.strip() for line in text.split("\n")]
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def documented(key: str, text: str) -> bool:
    """A key is documented by a line of its own: `key` in prose or a table, or an example
    line of a TOML block (``key = ...``, ``[table.key]``, ``[[table.key]]``)."""
    example_line = rf"^ {{4}}(\[{{1,2}}[a-z_]+\.)?{re.escape(key)}(\]{{1,2}}| =)"
    return f"`{key}`" in text or re.search(example_line, text, re.M) is not None


def every_table():
    plugins = load_plugins()
    return {"profile": PROFILE_TABLE, **CORE_TABLES, **plugins.tables}


def test_every_table_and_key_is_documented_in_profiles_md():
    by_table = {}
    for heading, text in sections((DOCS / "profiles.md").read_text(), 2).items():
        for name in re.findall(r"`\[([a-z_]+)\]`", heading):
            by_table[name] = text
    missing = []
    for name, table in every_table().items():
        if name not in by_table:
            missing.append(f"[{name}]: no '## `[{name}]`' section")
            continue
        missing += [f"[{name}] {key}" for key in table.keys if not documented(key, by_table[name])]
    assert not missing, "documented nowhere in docs/profiles.md: " + ", ".join(missing)


def test_the_kinds_table_is_the_registry():
    load_plugins()  # plugins register their own kinds
    rows = table_rows((DOCS / "internals.md").read_text(), "| kind |")
    documented = [name for row in rows for name in re.findall(r"`([a-z_]+)`", row[0])]
    assert len(documented) == len(set(documented)), documented
    assert set(documented) == set(KINDS), (sorted(set(KINDS) - set(documented)), sorted(set(documented) - set(KINDS)))


def package_folders() -> dict[str, Path]:
    """"tuned_rl/core/" -> its folder: every package of tuned_rl, and the plugins' folder."""
    found = {"plugins/": ROOT / "plugins"}
    for init in (ROOT / "tuned_rl").rglob("__init__.py"):
        found[f"{init.parent.relative_to(ROOT)}/"] = init.parent
    return found


# Names in backquotes in the module map that are not modules: a hook, the plugins' package name.
NOT_MODULES = {"tuned_rl_plan_process", "tuned_rl_plugins"}


def test_the_module_map_is_the_package():
    rows = table_rows((DOCS / "internals.md").read_text(), "| folder |")
    documented = {re.fullmatch(r"`(.+)`", row[0]).group(1): row[1] for row in rows}
    assert set(documented) == set(package_folders()), set(package_folders()) ^ set(documented)
    missing = []
    for name, folder in package_folders().items():
        modules = {p.stem for p in folder.glob("*.py")} - ({"__init__"} if name != "tuned_rl/" else set())
        named = set(re.findall(r"`([a-z_]+)`", documented[name])) - NOT_MODULES
        missing += [f"{name}{module}.py" for module in sorted(modules - named)]
        missing += [f"{name}{module} (no such module)" for module in sorted(named - modules)]
    assert not missing, "the module map and the package differ: " + ", ".join(missing)


def test_every_command_line_option_is_documented_in_commands_md():
    text = (DOCS / "commands.md").read_text()
    by_command = {}
    for heading, body in sections(text, 3).items():
        match = re.match(r"`([a-z]+(?: [a-z]+)*)", heading)
        if match:
            by_command[match.group(1)] = body
    parser = manpage.parser_without_environment()
    common = sections(text, 2)["Every option, command by command"].split("\n### ", 1)[0]
    missing = []
    for name, (sub, _) in manpage.commands(parser).items():
        if name not in by_command:
            missing.append(f"{name}: no '### `{name}`' section")
            continue
        for action in sub._actions:
            for option in action.option_strings:
                if option in ("-h", "--help"):
                    continue
                where = common if option in ("--json", "--state-dir") else by_command[name]
                if f"`{option}" not in where:
                    missing.append(f"{name} {option}")
    assert not missing, "documented nowhere in docs/commands.md: " + ", ".join(missing)


def test_the_readme_is_a_front_door_with_the_two_commands_and_links_to_every_doc():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.split("\n")) <= 300
    test_command = "bash tools/setup.sh && .venv/bin/python -m pytest -v"
    assert test_command in readme and test_command in (ROOT / ".ci" / "run").read_text()
    assert "bash tools/setup.sh && .venv/bin/tuned-rl apply profiles/quickstart.toml" in readme
    for doc in sorted(DOCS.glob("*.md")):
        assert f"docs/{doc.name}" in readme, f"README.md does not link docs/{doc.name}"


@pytest.mark.parametrize("doc", sorted(p.name for p in [ROOT / "README.md", ROOT / "CHANGELOG.md", *DOCS.glob("*.md")]))
def test_every_file_a_doc_links_to_exists(doc):
    path = ROOT / doc if (ROOT / doc).exists() else DOCS / doc
    text = path.read_text()
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    broken = [link for link in links if not link.startswith("http") and not (path.parent / link).exists()]
    assert not broken, broken


def test_the_watch_event_table_is_the_enum():
    """docs/watch.md lists every event watch emits, and no other: the table's first column against WatchEvent."""
    from tuned_rl.watch.events import WatchEvent
    text = (ROOT / "docs" / "watch.md").read_text()
    table = text.split("| event | when |", 1)[1].split("\n\n", 1)[0]
    documented = re.findall(r"^\| `([a-z-]+)` \|", table, re.M)
    assert sorted(documented) == sorted(e.value for e in WatchEvent), set(documented) ^ {e.value for e in WatchEvent}
    assert len(documented) == len(set(documented))


def test_every_event_the_package_emits_is_a_watch_event():
    """An event dict is built with a WatchEvent (or a step's verb through step_event), never a bare string."""
    bare = [f"{path.relative_to(ROOT)}:{number}" for path in (ROOT / "tuned_rl").rglob("*.py")
            for number, line in enumerate(path.read_text().splitlines(), 1) if re.search(r'"event": "', line)]
    assert not bare, bare
