"""The role's module in check mode on a node without tuned-rl: with the package's files unpacked (the
role runs dpkg-deb -x into a temporary directory), the diff is live -> planned values from that
package's own dry run; where the dry run cannot run (a dependency apt would install is missing), the
diff is the profile's text and the message names the Debian package it needs."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ansible")

LIBRARY = Path(__file__).parent.parent / "packaging" / "ansible" / "roles" / "tuned_rl" / "library" / "tuned_rl.py"
PLAN = {"profile": "rt-budget-halved", "steps": [
    {"step": "set kernel.sched_rt_runtime_us = 500000", "outcome": "planned",
     "changes": [{"target": "/proc/sys/kernel/sched_rt_runtime_us", "before": "950000", "after": "500000"}]},
    {"step": "set vm.swappiness = 60", "outcome": "already applied", "changes": []}]}


def load_module_code():
    spec = importlib.util.spec_from_file_location("tuned_rl_ansible_module", LIBRARY)
    code = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(code)
    return code


class Exited(Exception):
    pass


class FakeModule:
    """What the module's code uses of AnsibleModule, in check mode with --diff."""

    check_mode = True
    _diff = True

    def __init__(self, **params):
        self.params = {"executable": "tuned-rl-not-on-this-node", "state_dir": None, "content": None,
                       "unpacked": None, **params}
        self.result = None
        self.commands = []

    def run_command(self, command, environ_update=None, cwd=None):
        self.commands.append((command, environ_update))
        done = subprocess.run(command, capture_output=True, text=True, cwd=cwd,
                              env={"PATH": "/usr/bin:/bin", **(environ_update or {})})
        return done.returncode, done.stdout, done.stderr

    def add_cleanup_file(self, path):
        pass

    def exit_json(self, **result):
        self.result = result
        raise Exited

    def fail_json(self, **result):
        self.result = {"failed": True, **result}
        raise Exited


def unpacked_package(root: Path, body: str) -> Path:
    """A tree shaped like `dpkg-deb -x tuned-rl.deb root`, whose usr/bin/tuned-rl runs ``body``."""
    script = root / "usr" / "bin" / "tuned-rl"
    script.parent.mkdir(parents=True)
    (root / "usr" / "lib" / "python3" / "dist-packages").mkdir(parents=True)
    script.write_text(f"#!{sys.executable}\nimport sys\n{body}\n")
    script.chmod(0o755)
    return root


def test_the_unpacked_packages_dry_run_gives_the_live_and_planned_values(tmp_path):
    code = load_module_code()
    root = unpacked_package(tmp_path / "root", f"print({json.dumps(json.dumps(PLAN))})")
    profile = tmp_path / "profile.toml"
    profile.write_text('[sysctl]\n"kernel.sched_rt_runtime_us" = 500000\n')
    module = FakeModule(unpacked=str(root), state_dir=str(tmp_path / "state"))
    with pytest.raises(Exited):
        code.not_installed(module, str(profile))
    assert module.result["changed"] and "planned by the package's own dry run" in module.result["msg"]
    assert module.result["diff"]["before"] == "/proc/sys/kernel/sched_rt_runtime_us = 950000\n"
    assert module.result["diff"]["after"] == "/proc/sys/kernel/sched_rt_runtime_us = 500000\n"
    (command, environment), = module.commands
    assert command[:2] == [sys.executable, str(root / "usr" / "bin" / "tuned-rl")]  # the package's own interpreter
    assert command[2:] == ["--state-dir", str(tmp_path / "state"), "apply", str(profile), "--dry-run", "--json"]
    assert environment == {"PYTHONPATH": str(root / "usr" / "lib" / "python3" / "dist-packages")}


def test_a_dependency_the_node_lacks_is_named_and_the_diff_is_the_profile(tmp_path):
    code = load_module_code()
    root = unpacked_package(tmp_path / "root", "raise ModuleNotFoundError(\"No module named 'psutil'\")")
    profile = tmp_path / "profile.toml"
    profile.write_text('[sysctl]\n"kernel.sched_rt_runtime_us" = 500000\n')
    module = FakeModule(unpacked=str(root))
    with pytest.raises(Exited):
        code.not_installed(module, str(profile))
    assert module.result["changed"] and "failed" not in module.result
    assert "needs python3-psutil" in module.result["msg"]
    assert module.result["diff"]["after"] == profile.read_text()
    # The diff says why it is the profile's text (--diff prints no msg of a changed task).
    header = module.result["diff"]["before_header"]
    assert header.startswith("tuned-rl not installed; its plan needs python3-psutil") and "lacks" in header, header


def test_unpacked_dependencies_libraries_are_on_the_dry_runs_library_path(tmp_path):
    code = load_module_code()
    root = unpacked_package(tmp_path / "root", "import os; print(os.environ.get('LD_LIBRARY_PATH', ''))")
    blas = root / "usr" / "lib" / "x86_64-linux-gnu" / "blas"  # libblas3's, which its postinst links
    blas.mkdir(parents=True)
    (blas / "libblas.so.3").write_text("")
    python_own = root / "usr" / "lib" / "python3" / "dist-packages" / "numpy" / "core"
    python_own.mkdir(parents=True)
    (python_own / "_multiarray_umath.cpython-311-x86_64-linux-gnu.so").write_text("")
    assert code.shared_library_directories(str(root)) == [str(blas)]
    module = FakeModule(unpacked=str(root), content='[sysctl]\n"vm.swappiness" = 10\n')
    with pytest.raises(Exited):
        code.not_installed(module, "/nonexistent/profile.toml")
    (_, environment), = module.commands
    assert environment["LD_LIBRARY_PATH"] == str(blas)


def test_every_dependency_the_node_lacks_is_named_at_once(tmp_path):
    code = load_module_code()
    # The package's interpreter finds neither pluggy nor numpy (a path where they are not), its dry run
    # stopping at the first.
    bare = tmp_path / "bare-python"
    bare.write_text(f"#!/bin/sh\nexec {sys.executable} -S -I \"$@\"\n")
    bare.chmod(0o755)
    root = tmp_path / "root"
    script = root / "usr" / "bin" / "tuned-rl"
    script.parent.mkdir(parents=True)
    (root / "usr" / "lib" / "python3" / "dist-packages").mkdir(parents=True)
    script.write_text(f"#!{bare}\nimport pluggy\n")
    script.chmod(0o755)
    module = FakeModule(unpacked=str(root), content='[sysctl]\n"vm.swappiness" = 10\n')
    with pytest.raises(Exited):
        code.not_installed(module, "/nonexistent/profile.toml")
    message = module.result["msg"]
    assert "needs python3-pluggy, " in message and "python3-numpy" in message and "python3-psutil" in message, message


def test_a_directory_that_is_not_an_unpacked_package_is_said_and_the_diff_is_the_profile(tmp_path):
    code = load_module_code()
    module = FakeModule(unpacked=str(tmp_path), content='[sysctl]\n"vm.swappiness" = 10\n')
    with pytest.raises(Exited):
        code.not_installed(module, str(tmp_path / "not-yet" / "profile.toml"))
    assert "holds no unpacked tuned-rl package" in module.result["msg"]
    assert module.result["diff"]["after"] == '[sysctl]\n"vm.swappiness" = 10\n'


def test_a_package_script_without_an_interpreter_line_is_said_not_run(tmp_path):
    code = load_module_code()
    root = unpacked_package(tmp_path / "root", "print('never run')")
    script = root / "usr" / "bin" / "tuned-rl"
    script.write_text("#! \nprint('never run')\n")
    module = FakeModule(unpacked=str(root), content='[sysctl]\n"vm.swappiness" = 10\n')
    with pytest.raises(Exited):
        code.not_installed(module, str(tmp_path / "not-yet" / "profile.toml"))
    assert not module.commands and "interpreter (none named)" in module.result["msg"]
    assert module.result["diff"]["after"] == '[sysctl]\n"vm.swappiness" = 10\n'
