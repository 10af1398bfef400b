"""A plugin in its own installed distribution is loaded through the entry point like the built-ins."""


from __future__ import annotations
import json
import re
import subprocess
import sys
import textwrap

import pytest

import tuned_rl

from helpers import run_cli


def guide_example() -> str:
    """The complete example plugin from the plugin-author guide in tuned_rl's docstring."""
    code = tuned_rl.__doc__.split("a complete plugin for a ``[swappiness]`` table::", 1)[1]
    code = code.split("Every hook is documented", 1)[0]
    return textwrap.dedent(code)


def build_distribution(tmp_path, name: str, modules: dict[str, str], entry_points: dict[str, str]):
    """pip-install a distribution with ``modules`` into its own folder; returns that folder."""
    source = tmp_path / f"{name}-src"
    source.mkdir()
    for module, code in modules.items():
        (source / f"{module}.py").write_text(code)
    points = "\n".join(f'{k} = "{v}"' for k, v in entry_points.items())
    (source / "pyproject.toml").write_text(textwrap.dedent(f"""\
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "{name}"
        version = "1.0"
        [tool.setuptools]
        py-modules = {json.dumps(list(modules))}
        [project.entry-points.tuned_rl]
        """) + points + "\n")
    target = tmp_path / f"{name}-site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    "--no-build-isolation", "--target", str(target), str(source)], check=True)
    return target


@pytest.fixture(scope="module")
def third_party(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("dists")
    good = build_distribution(tmp_path, "tuned-rl-swappiness", {"trl_swappiness": guide_example()},
                              {"swappiness": "trl_swappiness"})
    broken = build_distribution(tmp_path, "tuned-rl-broken", {"trl_broken": "import no_such_module\n"},
                                {"broken": "trl_broken"})
    old = build_distribution(tmp_path, "tuned-rl-dirty", {"trl_dirty": written_for_0_1()}, {"dirty": "trl_dirty"})
    return {"PYTHONPATH": f"{good}:{broken}:{old}"}


def written_for_0_1() -> str:
    """The guide's example as a plugin for tuned-rl 0.1 was written: no plugin API named, no phase."""
    code = guide_example().replace("swappiness", "dirty_ratio").replace("vm.dirty_ratio\"", "vm.dirty_ratio (%)\"")
    code = re.sub(r"^TUNED_RL_PLUGIN_API = .*\n", "", code, flags=re.M)
    code = code.replace(',\n                  phase="kernel")', ")")
    assert "TUNED_RL_PLUGIN_API" not in code and "phase=" not in code, code
    return code


def test_the_guides_example_is_a_working_plugin():
    assert "@hookimpl" in guide_example() and "def tuned_rl_plan" in guide_example()


def test_plugins_lists_the_third_party_plugin_and_the_broken_one(third_party, tmp_path):
    status, out, err = run_cli("plugins", "--json", root=None, state_dir=tmp_path / "s", env=third_party)
    listing = json.loads(out)
    tables = {p["name"]: [(t["name"], t["phase"]) for t in p["tables"]] for p in listing["plugins"]}
    assert tables["swappiness"] == [("swappiness", "kernel")] and tables["rt_runtime"] == [("rt_runtime", "kernel")]
    assert listing["failed"][0]["name"] == "broken" and "no_such_module" in listing["failed"][0]["error"]
    assert "plugin broken failed to load: ModuleNotFoundError" in err
    human = run_cli("plugins", root=None, state_dir=tmp_path / "s", env=third_party)[1]
    assert re.search(r"swappiness\s+0\.2\s+\[swappiness\] \(kernel\)\s+loaded", human)


def test_a_plugin_written_for_0_1_loads_with_a_warning_and_its_step_applies_after_every_phase(
        third_party, tree, profile_file, state_dir):
    status, out, err = run_cli("plugins", "--json", root=None, state_dir=state_dir, env=third_party)
    listing = json.loads(out)
    assert listing["plugin_api"] == tuned_rl.PLUGIN_API_VERSION
    assert {p["name"]: p["api"] for p in listing["plugins"]}["dirty"] == "0.1"
    [deprecated] = listing["deprecated"]
    assert deprecated["name"] == "dirty" and "table [dirty_ratio] declares no phase" in deprecated["warning"]
    assert 'tuned-rl: plugin dirty: deprecated: table [dirty_ratio] declares no phase (plugin API 0.1)' in err
    assert 'Add phase="..." to its Table(...)' in err
    human = run_cli("plugins", root=None, state_dir=state_dir, env=third_party)[1]
    assert re.search(r"dirty\s+0\.1\s+\[dirty_ratio\] \(after every phase\)\s+loaded \(deprecated", human)
    tree.set("/proc/sys/vm/dirty_ratio", "20")
    path = profile_file("[dirty_ratio]\nvalue = 10\n[swappiness]\nvalue = 10\n")
    status, out, err = run_cli("apply", path, "--json", root=tree.root, state_dir=state_dir, env=third_party)
    assert status == 0, err
    steps = json.loads(out)["steps"]
    assert [(s["plugin"], s["outcome"]) for s in steps] == [("swappiness", "applied"), ("dirty", "applied")]
    assert tree.get("/proc/sys/vm/dirty_ratio") == "10"
    assert run_cli("rollback", root=tree.root, state_dir=state_dir, env=third_party)[0] == 0
    assert tree.get("/proc/sys/vm/dirty_ratio") == "20"


def test_third_party_table_is_validated_applied_and_rolled_back(third_party, tree, profile_file, state_dir):
    run = lambda *args: run_cli(*args, root=tree.root, state_dir=state_dir, env=third_party)  # noqa: E731
    status, _, err = run("apply", profile_file("[swappiness]\nvalue = 500\n"))
    assert status == 2 and "swappiness.value: 500 is above the maximum 200" in err
    original = tree.snapshot()
    path = profile_file("[swappiness]\nvalue = 10\n[rt_runtime]\nglobal_runtime_us = 900000\n")
    status, out, err = run("apply", path, "--json")
    assert status == 0, err
    steps = json.loads(out)["steps"]
    assert [(s["plugin"], s["outcome"]) for s in steps] == [("swappiness", "applied"), ("rt_runtime", "applied")]
    assert tree.get("/proc/sys/vm/swappiness") == "10"
    assert run("rollback")[0] == 0
    assert tree.snapshot() == original
