"""[numa] and `tuned-rl exec` on temporary trees with two nodes (and one), and exec on this host."""


from __future__ import annotations
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from tuned_rl.host.numa import NumaError, gpu_node, page_shares

MAPS = ("7f0000000000 default anon=300 dirty=300 N0=300 kernelpagesize_kB=4\n"
        "7f0000100000 default file=/usr/lib/libx.so mapped=100 N1=100 kernelpagesize_kB=4\n")


@pytest.fixture
def two_nodes(cgroup_tree_host):
    tree = cgroup_tree_host
    tree.set("/sys/devices/system/cpu/online", "0-3")
    tree.set("/sys/devices/system/node/online", "0-1")
    tree.set("/sys/devices/system/node/node0/cpulist", "0-1")
    tree.set("/sys/devices/system/node/node1/cpulist", "2-3")
    tree.set("/sys/bus/pci/devices/0000:3b:00.0/numa_node", "1")
    tree.set("/sys/bus/pci/devices/0000:af:00.0/numa_node", "-1")
    tree.set("/proc/driver/nvidia/gpus/0000:3b:00.0/information", "Model: A100\nDevice Minor: \t 0\n")
    tree.set("/proc/cpuinfo", "processor\t: 0\nflags\t\t: fpu sse hypervisor\n")
    tree.add_process(100, "model", (101,), affinity="0-3", start_time=100)
    tree.set("/proc/100/numa_maps", MAPS)
    tree.host.path("/etc/systemd/system").mkdir(parents=True)
    return tree


PROFILE = '[target]\nname = "^model$"\n\n[numa]\ngpu = "{gpu}"\n'


def test_page_shares_add_up_every_mapping_by_node(two_nodes):
    assert page_shares(two_nodes.host, 100) == {0: 300, 1: 100}


@pytest.mark.parametrize("gpu", ["0000:3b:00.0", "nvidia0"])
def test_the_gpus_node_is_bound_threads_pinned_and_pages_moved_then_put_back(two_nodes, cli, profile_file, gpu):
    tree = two_nodes
    profile = profile_file(PROFILE.format(gpu=gpu))
    dry = json.loads(cli("apply", profile, "--dry-run", "--json")[1])
    [step] = dry["steps"]
    assert step["step"] == "bind the workload's running processes to node 1" and step["phase"] == "placement"
    assert [(c["target"], c["before"], c["after"]) for c in step["changes"]] == [
        ("pid 100 (model) affinity", "0-3", "2-3"), ("pid 101 (model) affinity", "0-3", "2-3"),
        ("pid 100 (model) numa_pages", "nodes 0-1 (25% of 400 pages on node 1)", "nodes 1")]
    assert "placement before: pid 100 (model) has 25% of its 400 resident pages on node 1" in step["notes"]
    status, out, err = cli("apply", profile, "--json")
    assert status == 0, err
    assert page_shares(tree.host, 100) == {1: 400} and tree.host.process(101).affinity == "2-3"
    pages = json.loads(out)["steps"][0]["changes"][-1]
    assert pages["after"] == "nodes 1 (100% of 400 pages on node 1)"  # where the pages ended up, read back
    current = [c for c in json.loads(cli("status", "--json")[1])["changes"] if c["target"].endswith("numa_pages")]
    assert current[0]["current"] == "nodes 1 (100% of 400 pages on node 1)" and current[0]["state"] == "holds"
    assert cli("rollback")[0] == 0
    assert tree.host.process(100).affinity == "0-3" and tree.host.process(101).affinity == "0-3"
    # Pages were on both nodes before: they stay where the apply put them (docs/profiles.md: what undo can restore).
    assert page_shares(tree.host, 100) == {1: 400}


def test_pages_that_were_on_one_node_go_back_to_it(two_nodes, cli, profile_file):
    tree = two_nodes
    tree.set("/proc/100/numa_maps", "7f0000000000 default anon=300 N0=300 kernelpagesize_kB=4\n")
    assert cli("apply", profile_file(PROFILE.format(gpu="0000:3b:00.0")))[0] == 0
    assert page_shares(tree.host, 100) == {1: 300}
    assert cli("rollback")[0] == 0 and page_shares(tree.host, 100) == {0: 300}


def test_a_service_gets_a_drop_in_with_the_right_keys_and_loses_it_on_rollback(two_nodes, cli, profile_file):
    tree = two_nodes
    original = tree.snapshot()
    profile = profile_file('[numa]\nnode = 1\nunit = "llm.service"\nrunning = false\n')
    status, out, err = cli("apply", profile, "--json")
    assert status == 0, err
    text = tree.host.path("/etc/systemd/system/llm.service.d/tuned-rl-numa.conf").read_text()
    assert "[Service]\nNUMAPolicy=bind\nNUMAMask=1\nCPUAffinity=2-3\n" in text
    assert tree.get("/run/tuned-rl-actions.log").splitlines() == ["systemctl daemon-reload"]
    assert cli("rollback")[0] == 0
    assert not tree.host.path("/etc/systemd/system/llm.service.d").exists()
    assert tree.get("/run/tuned-rl-actions.log").splitlines() == ["systemctl daemon-reload"] * 2
    after = tree.snapshot()
    after.pop("run/tuned-rl-actions.log")
    assert after == original


def test_restart_true_restarts_the_unit_after_the_drop_in_and_after_its_removal(two_nodes, cli, profile_file):
    tree = two_nodes
    profile = profile_file('[numa]\nnode = 1\nunit = "llm.service"\nrunning = false\nrestart = true\n')
    assert cli("apply", profile)[0] == 0
    assert tree.get("/run/tuned-rl-actions.log").splitlines() == ["systemctl daemon-reload",
                                                                  "systemctl restart -- llm.service"]
    assert cli("rollback")[0] == 0
    assert tree.get("/run/tuned-rl-actions.log").splitlines()[2:] == ["systemctl daemon-reload",
                                                                      "systemctl restart -- llm.service"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_the_drop_in_passes_systemd_analyze_verify(two_nodes, tmp_path):
    from tuned_rl_plugins.numa import drop_in_changes
    [_, drop_in] = drop_in_changes(two_nodes.host, "llm.service", 1, "2-3")
    units = tmp_path / "units"
    (units / "llm.service.d").mkdir(parents=True)
    (units / "llm.service").write_text("[Unit]\nDescription=test\n\n[Service]\nExecStart=/bin/true\n")
    (units / "llm.service.d" / "tuned-rl-numa.conf").write_text(drop_in.after["text"])
    result = subprocess.run(["systemd-analyze", "verify", "--man=no", str(units / "llm.service")],
                            capture_output=True, text=True, env={**os.environ, "SYSTEMD_UNIT_PATH": f"{units}:"})
    assert "NUMA" not in result.stderr and "CPUAffinity" not in result.stderr, result.stderr
    assert result.returncode == 0, result.stderr


def test_on_one_node_the_steps_are_skipped_and_a_vm_is_named(two_nodes, cli, profile_file):
    tree = two_nodes
    tree.set("/sys/devices/system/node/online", "0")
    out = cli("apply", profile_file('[target]\nname = "^model$"\n\n[numa]\nnode = 0\nunit = "llm.service"\n'),
              "--json")[1]
    steps = json.loads(out)["steps"]
    assert [s["outcome"] for s in steps] == ["skipped", "skipped"]
    assert "one NUMA node" in steps[0]["reason"] and "virtual machine" in steps[0]["reason"]


@pytest.mark.parametrize("table, message", [
    ('gpu = "0000:af:00.0"', "firmware does not say"),
    ('gpu = "0000:00:00.0"', "no PCI device"),
    ('gpu = "nvidia3"', "no GPU with that device minor"),
    ('gpu = "card0"', "name a PCI address"),
    ("node = 5", "not an online NUMA node"),
    ('node = 1\ngpu = "nvidia0"', "exactly one of node and gpu"),
    ('node = 1\nunit = "llm"', "not a systemd service name"),
])
def test_a_node_that_cannot_be_used_exits_2_with_why(two_nodes, cli, profile_file, table, message):
    status, _, err = cli("apply", profile_file(f'[target]\nname = "^model$"\n\n[numa]\n{table}\n'))
    assert status == 2 and message in err, err


def test_gpu_names_resolve_through_the_nvidia_driver(two_nodes):
    assert gpu_node(two_nodes.host, "nvidia0") == 1
    with pytest.raises(NumaError, match="-1"):
        gpu_node(two_nodes.host, "0000:af:00.0")


def test_exec_binds_a_command_to_node_0_on_this_host():
    code = ("import re; s = open('/proc/self/status').read(); "
            "print(re.search(r'Cpus_allowed_list:\\s*(\\S+)', s).group(1)); "
            "print(sum('bind:0' in line for line in open('/proc/self/numa_maps')))")
    result = subprocess.run([sys.executable, "-m", "tuned_rl.cli", "exec", "--node", "0", "--", sys.executable, "-c",
                             code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    cpus, bound = result.stdout.split()
    node0 = open("/sys/devices/system/node/node0/cpulist").read().strip()
    assert cpus == node0 and int(bound) > 0  # every mapping made after exec carries the bind policy
    status = subprocess.run([sys.executable, "-m", "tuned_rl.cli", "exec", "--node", "0", "--", "sh", "-c", "exit 7"])
    assert status.returncode == 7  # the command's own exit status
    missing = subprocess.run([sys.executable, "-m", "tuned_rl.cli", "exec", "--node", "0", "--", "no-such-command-x"],
                             capture_output=True, text=True)
    assert missing.returncode == 127 and "command not found" in missing.stderr
    assert re.search("not an online NUMA node", subprocess.run(
        [sys.executable, "-m", "tuned_rl.cli", "exec", "--node", "63", "--", "true"], capture_output=True,
        text=True).stderr)


def test_exec_takes_its_node_from_a_profile_and_refuses_a_gpu_this_host_lacks(tmp_path):
    profile = tmp_path / "node.toml"
    profile.write_text("[numa]\nnode = 0\n")
    result = subprocess.run([sys.executable, "-m", "tuned_rl.cli", "exec", "--profile", str(profile), "--", "sh", "-c",
                             "grep Cpus_allowed_list /proc/self/status"], capture_output=True, text=True, timeout=60)
    node0 = open("/sys/devices/system/node/node0/cpulist").read().strip()
    assert result.returncode == 0 and result.stdout.split()[-1] == node0, result.stderr
    profile.write_text("[sysctl]\n")
    result = subprocess.run([sys.executable, "-m", "tuned_rl.cli", "exec", "--profile", str(profile), "--", "true"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "no [numa] table" in result.stderr
    result = subprocess.run([sys.executable, "-m", "tuned_rl.cli", "exec", "--gpu", "0000:ff:1f.7", "--", "true"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "no PCI device" in result.stderr


def test_another_users_process_named_like_the_workload_is_not_bound(two_nodes, cli, profile_file):
    two_nodes.add_process(500, "model", (501,), uid=65534, affinity="0-3", start_time=900)
    two_nodes.set("/proc/500/numa_maps", MAPS)
    dry = json.loads(cli("apply", profile_file(PROFILE.format(gpu="nvidia0")), "--dry-run", "--json")[1])
    [step] = dry["steps"]
    assert {c["target"].split()[1] for c in step["changes"]} == {"100", "101"}
    assert any(n.startswith("not the target: pid 500 (model)") and "runs as 65534" in n for n in dry["notes"])


ADMINS_IRQBALANCE = "# the admin's own settings\nIRQBALANCE_BANNED_CPULIST=3\n#IRQBALANCE_ARGS=--policyscript=/x\n"


def test_a_reboot_keeps_the_undo_of_files_in_etc_and_rollback_after_it_restores_them(two_nodes, cli, profile_file,
                                                                                      state_dir):
    tree = two_nodes
    tree.set("/proc/irq/default_smp_affinity", "f")
    tree.set("/proc/irq/24/smp_affinity_list", "0-3")
    tree.set("/usr/sbin/irqbalance", "")
    tree.set("/run/tuned-rl-services/irqbalance.service", "active")
    tree.host.path("/etc/default").mkdir(parents=True)
    tree.host.path("/etc/default/irqbalance").write_text(ADMINS_IRQBALANCE)
    os.chmod(tree.host.path("/etc/default/irqbalance"), 0o640)
    profile = profile_file('[irq_isolation]\nlatency_cpus = "2-3"\nirqbalance = "ban"\n\n'
                           '[numa]\nnode = 1\nunit = "llm.service"\nrunning = false\n')
    drop_in = "/etc/systemd/system/llm.service.d/tuned-rl-numa.conf"
    assert cli("apply", profile, "--no-verify")[0] == 0
    assert "IRQBALANCE_BANNED_CPULIST=2-3" in tree.get("/etc/default/irqbalance") and tree.host.exists(drop_in)
    # The reboot: a new boot id, the kernel's run-time state back to its defaults; /etc as it was.
    tree.set("/proc/sys/kernel/random/boot_id", "99999999-new-boot")
    tree.set("/proc/irq/default_smp_affinity", "f")
    tree.set("/proc/irq/24/smp_affinity_list", "0-3")
    status = json.loads(cli("status", "--json")[1])
    states = {c["target"]: c["state"] for c in status["changes"]}
    assert states["/etc/default/irqbalance"] == "holds" and states["/proc/irq/24/smp_affinity_list"] == "stale"
    # The boot-time apply: it rolls back the files first, so the admin's text is what it journals.
    status, out, err = cli("apply", profile, "--no-verify", "--json")
    assert status == 0, err
    assert any("a journal from an earlier boot" in n and "3 change(s) to files" in n for n in json.loads(out)["notes"]), out
    assert "IRQBALANCE_BANNED_CPULIST=2-3" in tree.get("/etc/default/irqbalance")
    assert cli("rollback")[0] == 0
    assert tree.host.path("/etc/default/irqbalance").read_text() == ADMINS_IRQBALANCE  # byte for byte
    assert tree.host.file_mode("/etc/default/irqbalance") == 0o640
    assert not tree.host.exists(drop_in) and not tree.host.exists("/etc/systemd/system/llm.service.d")
    assert tree.get("/proc/irq/24/smp_affinity_list") == "0-3"
    assert list((state_dir / "stale").iterdir())  # the journal as it was before the reboot, kept for reading


def test_rollback_right_after_a_reboot_restores_the_files_and_leaves_run_time_values(two_nodes, cli, profile_file):
    tree = two_nodes
    tree.set("/proc/sys/kernel/sched_rt_runtime_us", "950000")
    profile = profile_file('[rt_runtime]\nglobal_runtime_us = 900000\n\n[numa]\nnode = 1\nunit = "llm.service"\n'
                           'running = false\n')
    assert cli("apply", profile, "--no-verify")[0] == 0
    tree.set("/proc/sys/kernel/random/boot_id", "99999999-new-boot")
    tree.set("/proc/sys/kernel/sched_rt_runtime_us", "940000")  # someone's, after the reboot
    status, out, err = cli("rollback")
    assert status == 0, err
    assert "were not replayed" in out and "2 to files that survive a reboot were rolled back" in out, out
    assert tree.get("/proc/sys/kernel/sched_rt_runtime_us") == "940000"
    assert not tree.host.exists("/etc/systemd/system/llm.service.d")
    assert cli("status")[1].strip() == "nothing applied"


def test_a_node_a_one_node_host_lacks_exits_2_not_skipped(two_nodes, cli, profile_file):
    two_nodes.set("/sys/devices/system/node/online", "0")
    status, _, err = cli("apply", profile_file('[target]\nname = "^model$"\n\n[numa]\nnode = 7\n'))
    assert status == 2 and "node 7 is not an online NUMA node of this host (nodes: 0)" in err, err


SEGMENT_MAPS = ("7f0000000000 default anon=300 N0=300 kernelpagesize_kB=4\n"
                "7f0000200000 default file=/dev/shm/rl-obs dirty=512 N0=384 N1=128 kernelpagesize_kB=4\n")
SHM_PROFILE = '[target]\nname = "^model$"\n\n[numa]\nnode = 1\nrunning = false\nshm = ["/dev/shm/rl-*"]\n'


@pytest.fixture
def segment(two_nodes):
    tree = two_nodes
    tree.set("/dev/shm/rl-obs", "x" * 4096)
    tree.set("/dev/shm/other", "y")
    tree.set("/proc/100/maps", "7f0000200000-7f0000400000 rw-s 00000000 00:1a 12 /dev/shm/rl-obs\n")
    tree.set("/proc/100/numa_maps", SEGMENT_MAPS)
    return tree


def test_a_segment_is_bound_on_a_two_node_tree_with_its_share_shown_and_its_policy_put_back(segment, cli,
                                                                                            profile_file):
    profile = profile_file(SHM_PROFILE)
    dry = json.loads(cli("apply", profile, "--dry-run", "--json")[1])
    [step] = dry["steps"]
    assert step["step"] == "bind shared-memory segments /dev/shm/rl-* to node 1" and step["phase"] == "placement"
    assert [(c["target"], c["before"], c["after"]) for c in step["changes"]] == [
        ("/dev/shm/rl-obs", "default (25% of 512 pages on node 1)", "bind:1")]  # /dev/shm/other: not matched
    assert any(n.startswith("placement before: /dev/shm/rl-obs (4097 bytes, policy default, mapped by pid 100)")  # set() adds a newline
               for n in step["notes"]), step["notes"]
    status, out, err = cli("apply", profile, "--json")
    assert status == 0, err
    assert json.loads(out)["steps"][0]["changes"][0]["after"] == "bind:1 (100% of 512 pages on node 1)"
    assert "7f0000200000 bind:1 file=/dev/shm/rl-obs dirty=512 kernelpagesize_kB=4 N1=512" in segment.get("/proc/100/numa_maps")
    [row] = [c for c in json.loads(cli("status", "--json")[1])["changes"] if c["target"] == "/dev/shm/rl-obs"]
    assert row["state"] == "holds" and row["current"] == "bind:1 (100% of 512 pages on node 1)"
    assert cli("rollback")[0] == 0
    assert segment.host.segment_policy("/dev/shm/rl-obs").policy == "default"
    assert "7f0000200000 default file=/dev/shm/rl-obs" in segment.get("/proc/100/numa_maps")


def test_a_segment_removed_and_made_again_since_the_apply_is_gone_and_left_alone(segment, cli, profile_file):
    assert cli("apply", profile_file(SHM_PROFILE))[0] == 0
    # The old file renamed away, not removed: its inode then cannot be the new file's (a file
    # system may hand a freed inode number straight to the next file: one run failed so).
    segment.host.path("/dev/shm/rl-obs").rename(segment.host.path("/dev/shm/rl-obs.old"))
    segment.set("/dev/shm/rl-obs", "another user's file")  # a new inode under the same name
    status, out, _ = cli("rollback", "--json")
    [row] = [c for c in json.loads(out)["changes"] if c["target"] == "/dev/shm/rl-obs"]
    assert status == 0 and row["outcome"] == "gone" and "another file now" in row["reason"]
    assert segment.host.segment_policy("/dev/shm/rl-obs").policy == "bind:1"  # the new file was not touched


def test_segments_no_one_made_yet_are_skipped_saying_watch_binds_them(two_nodes, cli, profile_file):
    [step] = json.loads(cli("apply", profile_file(SHM_PROFILE), "--json")[1])["steps"]
    assert step["outcome"] == "skipped" and "watch` binds each one a workload process maps" in step["reason"]


def test_a_hostile_segment_name_or_pattern_is_refused_or_left_alone(segment, cli, profile_file):
    segment.set("/dev/shm/rl-a\nN1=999", "x")
    os.symlink("/etc/passwd", segment.host.path("/dev/shm/rl-link"))
    [step] = json.loads(cli("apply", profile_file(SHM_PROFILE), "--dry-run", "--json")[1])["steps"]
    assert [c["target"] for c in step["changes"]] == ["/dev/shm/rl-obs"]  # the link is no segment
    assert any(n.startswith("left alone: '/dev/shm/rl-a\\\\nN1=999'") for n in step["notes"]), step["notes"]
    for pattern in ("/dev/shm/../etc/*", "/etc/passwd", "/dev/shm/a/b", "/dev/shm/a b"):
        status, _, err = cli("apply", profile_file(SHM_PROFILE.replace("/dev/shm/rl-*", pattern)), "--dry-run")
        assert status == 2 and "is not a segment in /dev/shm" in err, (pattern, err)


def test_watch_binds_a_segment_a_workload_process_maps_later(segment, profile_file):
    from tuned_rl.profiles.loader import load_profile
    from tuned_rl_plugins.numa import tuned_rl_plan_process
    profile = load_profile(profile_file(SHM_PROFILE)).tables
    [step] = tuned_rl_plan_process(profile, segment.host, segment.host.process(100))
    assert step.title == "bind the shared-memory segments pid 100 (model) maps to node 1"
    assert [(c.target, c.before["policy"], c.after["policy"]) for c in step.pending_changes] == [
        ("/dev/shm/rl-obs", "default", "bind:1")]
    segment.host.set_segment_policy("/dev/shm/rl-obs", "bind:1", step.changes[0].before["inode"])
    [step] = tuned_rl_plan_process(profile, segment.host, segment.host.process(100))
    assert not step.pending_changes  # bound already: nothing for watch to do


def test_on_one_node_a_segment_is_still_bound_saying_no_page_moves(segment, cli, profile_file):
    segment.set("/sys/devices/system/node/online", "0")
    [step] = json.loads(cli("apply", profile_file(SHM_PROFILE.replace("node = 1", "node = 0")), "--json")[1])["steps"]
    assert step["outcome"] != "skipped" and any("no page moves" in n for n in step["notes"])
    assert segment.host.segment_policy("/dev/shm/rl-obs").policy == "bind:0"


def test_another_users_segment_a_pattern_matches_is_left_alone_unless_owners_names_them(segment, cli, profile_file):
    """/dev/shm is every user's: a user's /dev/shm/rl-evil matched "/dev/shm/rl-*" and was planned.
    Only root's and the [target] users' segments are bound; [numa] owners widens it."""
    import json as json_module
    segment.set("/dev/shm/rl-evil", "z" * 4096)
    segment.set(segment.host.SEGMENT_OWNERS, json_module.dumps({"/dev/shm/rl-evil": 65534}))
    dry = json.loads(cli("apply", profile_file(SHM_PROFILE), "--dry-run", "--json")[1])
    [step] = dry["steps"]
    assert [c["target"] for c in step["changes"]] == ["/dev/shm/rl-obs"]
    assert any(n.startswith("left alone: /dev/shm/rl-evil belongs to") and "[numa] owners" in n for n in step["notes"])
    widened = SHM_PROFILE + 'owners = ["65534"]\n'
    [step] = json.loads(cli("apply", profile_file(widened), "--dry-run", "--json")[1])["steps"]
    assert [c["target"] for c in step["changes"]] == ["/dev/shm/rl-evil", "/dev/shm/rl-obs"]
    status, _, err = cli("apply", profile_file(SHM_PROFILE + 'owners = ["no-such-user-here"]\n'), "--dry-run")
    assert status == 2 and "no account 'no-such-user-here'" in err
