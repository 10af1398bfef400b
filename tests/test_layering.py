"""The package's layers, read from its run-time imports (those under ``if TYPE_CHECKING:`` left out,
those inside functions counted: they run too).

docs/internals.md ("Layers") names the order and every import that points up; this test holds the
code to it: no import circle between modules, every import between folders pointing down the
order, and the built-in plugins importing the public API (``tuned_rl``) and nothing below it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import tuned_rl

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tuned_rl"
PLUGINS = ROOT / "plugins"
INTERNALS = ROOT / "docs" / "internals.md"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def runtime_imports(tree: ast.AST) -> list[tuple[str, list[str], int]]:
    """(module, names imported from it, line) of each import that runs: not those under
    ``if TYPE_CHECKING:``, but those inside functions and other blocks."""
    found = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for other in child.orelse:
                    visit_one(other)
                continue
            visit_one(child)

    def visit_one(child: ast.AST) -> None:
        if isinstance(child, ast.Import):
            found.extend((alias.name, [], child.lineno) for alias in child.names)
        elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
            found.append((child.module, [alias.name for alias in child.names], child.lineno))
        visit(child)

    visit(tree)
    return found


def package_graph() -> dict[str, set[str]]:
    """module -> the package modules it imports at run time (``from a import b`` is a.b if that is a module)."""
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for module, names, _ in runtime_imports(ast.parse(path.read_text())):
            targets = [f"{module}.{n}" for n in names if f"{module}.{n}" in modules] or [module]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def layer_order() -> list[str]:
    """The layers as docs/internals.md lists them, top first: "1. `cli`, the API `__init__`", ..."""
    section = INTERNALS.read_text().split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\d+\. (.+)$", section, re.M)
    return [re.findall(r"`([^`]+)`", row.split(" (")[0]) for row in rows]  # a row's names, not its comment


def documented_upward_imports() -> set[tuple[str, str]]:
    section = INTERNALS.read_text().split("## Layers", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^- upward: `([\w.]+)` -> `([\w.]+)`", section, re.M))


def layer_of(module: str, order: list[list[str]]) -> int:
    """A module's layer: its folder's (``tuned_rl.core.agent`` -> ``core``), or its own name for a
    module right in tuned_rl/ (``tuned_rl.cli`` -> ``cli``; the package itself is ``__init__``)."""
    parts = module.split(".")
    key = "__init__" if len(parts) == 1 else parts[1]
    for index, names in enumerate(order):
        if key in names:
            return index
    raise AssertionError(f"{module}: its folder {key!r} is in no layer of docs/internals.md's list")


def test_no_two_modules_import_each_other_round_a_circle():
    graph = package_graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def strongly_connected(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                strongly_connected(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            strongly_connected(node)
    assert not circles, f"import circles: {circles}"


def test_every_import_between_folders_points_down_the_documented_order():
    order = layer_order()
    assert order, "docs/internals.md has no numbered list of layers under ## Layers"
    named = [name for names in order for name in names]
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    loose = {p.stem for p in PACKAGE.glob("*.py")}
    assert set(named) == folders | loose, f"layers and package differ: {set(named) ^ (folders | loose)}"
    upward = {(a, b) for a, imported in package_graph().items() for b in imported
              if layer_of(b, order) < layer_of(a, order)}
    assert upward == documented_upward_imports(), (
        f"imports pointing up the layers: {sorted(upward)}; docs/internals.md names "
        f"{sorted(documented_upward_imports())}")
    assert len(upward) <= 1


def test_the_built_in_plugins_import_the_public_api_and_nothing_below_it():
    public = set(tuned_rl.__all__) | {"hookimpl", "__version__"}
    wrong = []
    for path in sorted(PLUGINS.glob("*.py")):
        for module, names, line in runtime_imports(ast.parse(path.read_text())):
            if module == "tuned_rl":
                wrong += [f"{path.name}:{line}: {n} is not in tuned_rl.__all__" for n in names if n not in public]
            elif module.startswith("tuned_rl."):
                wrong.append(f"{path.name}:{line}: imports {module}")
    assert not wrong, "\n".join(wrong)


def test_the_host_is_told_apart_from_a_tree_once_not_asked_everywhere():
    """A Host's root (tuned_rl/host/roots.py) is chosen when it is made; no code asks "is it live?"."""
    asking = [f"{path.relative_to(ROOT)}:{number}" for path in [*PACKAGE.rglob("*.py"), *PLUGINS.glob("*.py")]
              for number, line in enumerate(path.read_text().splitlines(), 1) if "is_live" in line]
    assert not asking, asking


def test_this_walk_of_the_imports_sees_a_circle_and_an_upward_import():
    """The walk itself, on a small made-up source: a TYPE_CHECKING import is left out, one in a
    function counted."""
    source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tuned_rl.cli import x\n"
              "def f():\n    from tuned_rl.watch import watcher\n")
    assert [m for m, _, _ in runtime_imports(ast.parse(source))] == ["typing", "tuned_rl.watch"]
    order = [["cli"], ["watch"], ["core"]]
    assert layer_of("tuned_rl.core.agent", order) > layer_of("tuned_rl.watch.watcher", order)
