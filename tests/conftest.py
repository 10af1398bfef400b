"""Fixtures shared by the unit and kernel tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import tuned_rl.cli
from tuned_rl.cli import main

from fakes import TreeHost
from helpers import CgroupTreeHost, HostTree


@pytest.fixture
def tree(tmp_path) -> HostTree:
    return HostTree(tmp_path / "host")


@pytest.fixture
def cgroup_tree_host(tree, monkeypatch) -> HostTree:
    """The tree, its cgroup files acting as the kernel's (CgroupTreeHost), for the tests and the cli alike."""
    monkeypatch.setattr("tuned_rl.cli.Host", CgroupTreeHost)
    tree.host = CgroupTreeHost(tree.root)
    return tree


@pytest.fixture
def state_dir(tmp_path) -> Path:
    return tmp_path / "state"


@pytest.fixture
def profile_file(tmp_path):
    """Write a profile: profile_file(text, name="p.toml") -> path."""
    def write(text: str, name: str = "p.toml") -> Path:
        path = tmp_path / "profiles" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path
    return write


@pytest.fixture
def cli(tree, state_dir, monkeypatch, capsys):
    """Run tuned-rl in this process against the temporary tree: cli(*args) -> (status, out, err)."""
    monkeypatch.setenv("TUNED_RL_HOST_ROOT", str(tree.root))
    monkeypatch.setenv("TUNED_RL_STATE_DIR", str(state_dir))
    if not issubclass(tuned_rl.cli.Host, TreeHost):  # unless a fixture chose a richer stand-in (CgroupTreeHost)
        monkeypatch.setattr(tuned_rl.cli, "Host", TreeHost)  # commands and systemd stay in the tree (tests/fakes.py)

    def run(*args: str):
        status = main([str(a) for a in args])
        captured = capsys.readouterr()
        return status, captured.out, captured.err
    return run


@pytest.fixture
def sleeper():
    """A real process that sleeps, for process-kind undo records (killed afterwards)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield child
    child.kill()
    child.wait()
