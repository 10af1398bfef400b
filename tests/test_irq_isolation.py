"""[irq_isolation] on temporary trees: IRQs (some refusing to move), queue masks, irqbalance of both distributions."""


from __future__ import annotations
import errno
import json
import os

import pytest

from helpers import refuse_writes
from tuned_rl.host import Host
from tuned_rl_plugins.irq_isolation import banned_config

PROFILE = '[irq_isolation]\nlatency_cpus = "1"\n'
ACTIONS = "/run/tuned-rl-actions.log"


@pytest.fixture
def irqs(tree):
    tree.set("/proc/irq/default_smp_affinity", "3")
    for irq, cpus in ((24, "0-1"), (25, "1"), (26, "0"), (36, "0-1")):
        tree.set(f"/proc/irq/{irq}/smp_affinity_list", cpus)
    tree.set("/sys/class/net/eth0/queues/rx-0/rps_cpus", "3")
    tree.set("/sys/class/net/eth0/queues/rx-1/rps_cpus", "0")
    tree.set("/sys/class/net/eth0/queues/tx-0/xps_cpus", "2")
    return tree


def test_every_irq_and_queue_reaching_a_latency_cpu_moves_and_comes_back(irqs, cli, profile_file):
    original = irqs.snapshot()
    profile = profile_file(PROFILE)
    dry = json.loads(cli("apply", profile, "--dry-run", "--json")[1])
    [step] = dry["steps"]
    assert step["phase"] == "interrupts" and step["outcome"] == "planned"
    assert [(c["target"], c["before"], c["after"]) for c in step["changes"]] == [
        ("/proc/irq/default_smp_affinity", "3", "1"),
        ("/proc/irq/24/smp_affinity_list", "0-1", "0"),
        ("/proc/irq/25/smp_affinity_list", "1", "0"),
        ("/proc/irq/36/smp_affinity_list", "0-1", "0"),
        ("/sys/class/net/eth0/queues/rx-0/rps_cpus", "3", "1"),
        ("/sys/class/net/eth0/queues/tx-0/xps_cpus", "2", "0"),
    ]
    status, out, err = cli("apply", profile, "--json")
    assert status == 0, err
    assert irqs.get("/proc/irq/25/smp_affinity_list") == "0" and irqs.get("/proc/irq/26/smp_affinity_list") == "0"
    assert irqs.get("/sys/class/net/eth0/queues/rx-0/rps_cpus") == "1"
    assert cli("rollback")[0] == 0 and irqs.snapshot() == original


@pytest.mark.parametrize("code", [errno.EIO, errno.EPERM])  # before and from Linux 6.12
def test_an_irq_the_kernel_will_not_move_is_named_and_does_not_fail_the_step(irqs, cli, profile_file, monkeypatch,
                                                                             code):
    original = irqs.snapshot()
    refuse_writes(monkeypatch, Host, code, lambda target, value: target == "/proc/irq/36/smp_affinity_list")
    status, out, err = cli("apply", profile_file(PROFILE), "--json")
    assert status == 0, err
    step = json.loads(out)["steps"][0]
    assert step["outcome"] == "applied"
    [note] = [n for n in step["notes"] if "/proc/irq/36" in n]
    assert "will not move this interrupt" in note and os.strerror(code) in note
    assert "/proc/irq/36/smp_affinity_list" not in [c["target"] for c in step["changes"]]
    assert irqs.get("/proc/irq/24/smp_affinity_list") == "0" and irqs.get("/proc/irq/36/smp_affinity_list") == "0-1"
    status_rows = json.loads(cli("status", "--json")[1])["changes"]
    assert "/proc/irq/36/smp_affinity_list" not in [r["target"] for r in status_rows]  # left as it was: not ours
    assert {r["state"] for r in status_rows} == {"holds"}
    status, out, _ = cli("rollback", "--json")
    assert status == 0 and irqs.snapshot() == original


def test_another_refusal_fails_the_step_and_undoes_it(irqs, cli, profile_file, monkeypatch):
    original = irqs.snapshot()
    refuse_writes(monkeypatch, Host, errno.EINVAL, lambda target, value: target == "/proc/irq/36/smp_affinity_list")
    status, out, _ = cli("apply", profile_file(PROFILE), "--json")
    step = json.loads(out)["steps"][0]
    assert status == 1 and step["outcome"] == "failed" and "Invalid argument" in step["reason"]
    assert irqs.snapshot() == original


DEBIAN = """\
# irqbalance is a daemon process that distributes interrupts across
# CPUs on SMP systems.
#ENABLED=1
#IRQBALANCE_ONESHOT=auto
IRQBALANCE_BANNED_CPUS="f0"
IRQBALANCE_BANNED_CPULIST=3
#IRQBALANCE_ARGS=
"""


def with_irqbalance(tree, config: str | None, text: str | None, active: bool = True):
    tree.set("/usr/sbin/irqbalance", "")
    tree.set("/run/tuned-rl-services/irqbalance.service", "active" if active else "inactive")  # systemd, in a tree
    if config and text is not None:
        tree.host.path(config).parent.mkdir(parents=True, exist_ok=True)
        tree.host.path(config).write_text(text)
        os.chmod(tree.host.path(config), 0o640)


def test_debian_irqbalance_bans_the_latency_cpus_restarts_and_is_restored_byte_for_byte(irqs, cli, profile_file):
    with_irqbalance(irqs, "/etc/default/irqbalance", DEBIAN)
    irqs.set("/sys/devices/system/cpu/isolated", "")
    original = irqs.snapshot()
    assert cli("apply", profile_file(PROFILE))[0] == 0
    text = irqs.host.path("/etc/default/irqbalance").read_text()
    assert "\nIRQBALANCE_BANNED_CPULIST=1\n" in text and '\n# IRQBALANCE_BANNED_CPUS="f0"' in text
    assert text.count("IRQBALANCE_BANNED_CPULIST=") == 1 and "#IRQBALANCE_ARGS=\n" in text
    assert irqs.get(ACTIONS).splitlines() == ["systemctl try-restart -- irqbalance.service"]
    assert cli("rollback")[0] == 0
    assert irqs.host.path("/etc/default/irqbalance").read_text() == DEBIAN
    assert irqs.host.file_mode("/etc/default/irqbalance") == 0o640
    assert irqs.get(ACTIONS).splitlines()[-1] == "systemctl try-restart -- irqbalance.service"
    after = irqs.snapshot()
    del after[ACTIONS.lstrip("/")]
    assert after == original


def test_rhel_irqbalance_settings_get_the_line_appended_and_kernel_isolated_cpus_kept_banned(irqs, cli,
                                                                                           profile_file):
    irqs.set("/sys/devices/system/cpu/online", "0-3")
    irqs.set("/sys/devices/system/cpu/isolated", "3")  # irqbalance's own ban, replaced by the list: keep it
    with_irqbalance(irqs, "/etc/sysconfig/irqbalance", "IRQBALANCE_ARGS=\n")
    assert cli("apply", profile_file(PROFILE))[0] == 0
    assert irqs.host.path("/etc/sysconfig/irqbalance").read_text().endswith("\nIRQBALANCE_BANNED_CPULIST=1,3\n")
    assert cli("rollback")[0] == 0
    assert irqs.host.path("/etc/sysconfig/irqbalance").read_text() == "IRQBALANCE_ARGS=\n"


def test_irqbalance_without_settings_gets_a_file_that_rollback_deletes(irqs, cli, profile_file):
    with_irqbalance(irqs, None, None)
    irqs.host.path("/etc/default").mkdir(parents=True)
    assert cli("apply", profile_file(PROFILE))[0] == 0
    assert "IRQBALANCE_BANNED_CPULIST=1" in irqs.host.path("/etc/default/irqbalance").read_text()
    assert cli("rollback")[0] == 0 and not irqs.host.path("/etc/default/irqbalance").exists()


def test_stop_stops_the_service_and_rollback_starts_it_again(irqs, cli, profile_file):
    with_irqbalance(irqs, "/etc/default/irqbalance", DEBIAN)
    status, out, err = cli("apply", profile_file(PROFILE + 'irqbalance = "stop"\n'), "--json")
    assert status == 0, err
    assert json.loads(out)["steps"][0]["changes"][0] == {"target": "service irqbalance.service", "before": "active",
                                                         "after": "inactive"}
    assert irqs.get("/run/tuned-rl-services/irqbalance.service") == "inactive"
    assert irqs.host.path("/etc/default/irqbalance").read_text() == DEBIAN  # untouched
    assert cli("rollback")[0] == 0 and irqs.get("/run/tuned-rl-services/irqbalance.service") == "active"


def test_a_stopped_irqbalance_is_left_stopped(irqs, cli, profile_file):
    with_irqbalance(irqs, "/etc/default/irqbalance", DEBIAN, active=False)
    step = json.loads(cli("apply", profile_file(PROFILE + 'irqbalance = "stop"\n'), "--json")[1])["steps"][0]
    assert "service irqbalance.service" not in [c["target"] for c in step["changes"]]


def test_no_irqbalance_means_no_irqbalance_change(irqs, cli, profile_file):
    step = json.loads(cli("apply", profile_file(PROFILE), "--dry-run", "--json")[1])["steps"][0]
    assert not any("irqbalance" in c["target"] for c in step["changes"])


def test_banned_config_replaces_the_list_in_place_and_keeps_every_other_line():
    text = "A=1\nIRQBALANCE_BANNED_CPULIST=0\nB=2\nIRQBALANCE_BANNED_CPULIST=5\n"
    assert banned_config(text, {1, 2}) == "A=1\nIRQBALANCE_BANNED_CPULIST=1-2\nB=2\n"
    assert banned_config('IRQBALANCE_BANNED_CPUS=""\n', {1}).startswith('IRQBALANCE_BANNED_CPUS=""\n')  # empty: inert
    assert banned_config("", {1}).endswith("IRQBALANCE_BANNED_CPULIST=1\n")


@pytest.mark.parametrize("table, message", [
    ('latency_cpus = "0-1"', "leaves no housekeeping CPU"),
    ('latency_cpus = "1"\nhousekeeping_cpus = "1"', "both latency and housekeeping"),
    ('latency_cpus = "1"\nirqbalance = "kill"', "must be one of"),
])
def test_a_bad_table_exits_2(irqs, cli, profile_file, table, message):
    status, _, err = cli("apply", profile_file(f"[irq_isolation]\n{table}\n"))
    assert status == 2 and message in err, err


def test_a_user_process_named_irqbalance_is_not_irqbalance(irqs, cli, profile_file):
    # Root must not create /etc/default/irqbalance and try-restart a service for a user's process.
    irqs.add_process(800, "irqbalance", uid=65534, start_time=800)
    os.symlink("/usr/sbin/irqbalance", irqs.host.path("/proc/800/exe"))
    irqs.add_process(801, "irqbalance", uid=0, start_time=801)
    os.symlink("/home/u/irqbalance", irqs.host.path("/proc/801/exe"))
    irqs.host.path("/etc/default").mkdir(parents=True)
    assert cli("apply", profile_file(PROFILE))[0] == 0
    assert not irqs.host.exists("/etc/default/irqbalance") and not irqs.host.exists(ACTIONS)
    assert cli("rollback")[0] == 0


def test_root_running_irqbalances_executable_is_irqbalance(irqs, cli, profile_file):
    irqs.add_process(802, "irqbalance", uid=0, start_time=802)
    os.symlink("/usr/sbin/irqbalance", irqs.host.path("/proc/802/exe"))
    irqs.host.path("/etc/default").mkdir(parents=True)
    assert cli("apply", profile_file(PROFILE))[0] == 0
    assert "IRQBALANCE_BANNED_CPULIST=1" in irqs.get("/etc/default/irqbalance")
    assert cli("rollback")[0] == 0 and not irqs.host.exists("/etc/default/irqbalance")


def test_a_reverted_step_restarts_irqbalance_once_for_the_apply_and_once_for_the_revert(irqs, profile_file,
                                                                                       state_dir):
    from tuned_rl.core.agent import Agent
    from tuned_rl.core.journal import Journal
    from tuned_rl.core.plugin_host import load_plugins
    from tuned_rl.profiles.loader import load_profile
    from test_verify import FakeVerifier
    with_irqbalance(irqs, "/etc/default/irqbalance", DEBIAN)
    original = irqs.host.path("/etc/default/irqbalance").read_text()
    step = load_plugins().plan(load_profile(profile_file(PROFILE)), irqs.host)[0]
    report = Agent(load_plugins(), irqs.host, Journal(state_dir)).writer.apply(0, step, "l", FakeVerifier(keep=False), "")
    assert report.outcome == "reverted"
    assert irqs.get(ACTIONS).splitlines() == ["systemctl try-restart -- irqbalance.service"] * 2
    assert irqs.host.path("/etc/default/irqbalance").read_text() == original and Journal(state_dir).records() == []
