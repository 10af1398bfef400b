"""A Host is its root: the live host's or a tree's, chosen once when it is made, and what differs
between the two (commands, pids, accounts, links in a changed path) follows from that choice."""

from __future__ import annotations

import os

import pytest

from tuned_rl import family, in_family, runs_tuned_rl
from tuned_rl.measure.tuned_rl_processes import runs_tuned_rl_as_root
from tuned_rl.host import Host
from tuned_rl.host.roots import LiveRoot, TreeRoot
from tuned_rl.measure.probes.tracefs import TRACING, remove_leftover_instances


def test_the_root_is_chosen_once_when_the_host_is_made(tree):
    live = Host()
    assert isinstance(live.root_access, LiveRoot) and live.moved_root is None and live.own_pid() == os.getpid()
    assert isinstance(tree.host.root_access, TreeRoot) and tree.host.moved_root == tree.host.root
    assert tree.host.own_pid() is None  # a tree's pids are no task of this kernel


def test_a_tree_runs_no_command_follows_no_link_and_asks_no_name_service(tree, tmp_path):
    with pytest.raises(OSError, match="only on the live host"):  # tree.host logs them: a stand-in for tests
        Host(tree.host.root).run_action("systemd-daemon-reload")
    (tmp_path / "outside").mkdir()
    (tree.host.root / "etc").symlink_to(tmp_path / "outside")
    with pytest.raises(OSError, match="symbolic link"):
        tree.host.replace_file("/etc/planted.conf", b"x\n", 0o644)
    assert not (tmp_path / "outside" / "planted.conf").exists()
    assert tree.host.user_name(0) == "0" and tree.host.user_id("root") is None  # no /etc/passwd in this tree


def test_tuned_rl_s_family_is_by_pid_on_the_live_host_and_empty_on_a_tree(tree):
    tree.add_process(os.getpid(), "python3", cmdline="python3 -m tuned_rl.cli apply x.toml")
    assert family(tree.host, tree.host.processes()) == set()
    assert not in_family(tree.host, tree.host.process(os.getpid()))
    live = Host()
    assert in_family(live, live.process(os.getpid())) and in_family(live, live.process(os.getppid()))


def test_a_command_line_says_tuned_rl_by_its_first_words_and_only_root_s_keeps_a_trace_instance(tree):
    assert runs_tuned_rl("tuned-rl watch profile.toml") and runs_tuned_rl("/usr/bin/python3 -m tuned_rl.cli apply")
    assert not runs_tuned_rl("python3 serve.py --log /tmp/tuned-rl.log") and not runs_tuned_rl("sleep tuned_rl")
    tree.add_process(4101, "tuned-rl", cmdline="/usr/bin/python3 /usr/bin/tuned-rl watch p.toml", uid=0)
    tree.add_process(4102, "tuned-rl", cmdline="tuned-rl watch p.toml", uid=1000)  # a user's look-alike
    tree.add_process(4103, "sleep", cmdline="sleep 1000 tuned_rl", uid=0)  # says tuned_rl, runs sleep
    assert runs_tuned_rl_as_root(tree.host.process(4101)) and not runs_tuned_rl_as_root(tree.host.process(4102))
    for pid in (4101, 4102, 4103, 4104):  # 4104: gone
        tree.host.path(f"{TRACING}/instances/tuned-rl-{pid}").mkdir(parents=True)
    removed = remove_leftover_instances(tree.host)
    assert removed == [f"{TRACING}/instances/tuned-rl-{pid}" for pid in (4102, 4103, 4104)]
    assert tree.host.is_dir(f"{TRACING}/instances/tuned-rl-4101")
