"""The Ansible role against this host (localhost): check mode, live diff, apply, a second run that
changes nothing, and state=absent restoring the value."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROLES = Path(__file__).parent.parent.parent / "packaging" / "ansible" / "roles"
SYSCTL = Path("/proc/sys/kernel/printk_ratelimit")
PLAYBOOK = ansible = shutil.which("ansible-playbook", path=str(Path(sys.executable).parent)) or shutil.which(
    "ansible-playbook")
pytestmark = pytest.mark.skipif(os.geteuid() != 0 or ansible is None, reason="needs root and ansible-core")


NONE = f"""tuned_rl_install: none
    tuned_rl_executable: {Path(sys.executable).parent / "tuned-rl"}"""


def play(tmp_path, *options, state="present", install=NONE) -> dict:
    playbook = tmp_path / "play.yml"
    playbook.write_text(f"""\
- name: The tuned_rl role on this host
  hosts: localhost
  connection: local
  gather_facts: false
  vars:
    {install}
    tuned_rl_profile_path: {tmp_path / "profile.toml"}
    tuned_rl_state_dir: {tmp_path / "state"}
    tuned_rl_state: {state}
    tuned_rl_defaults_file: {tmp_path / "default"}
    tuned_rl_metrics_address: "127.0.0.1:9464"
    tuned_rl_alarm_ms: 5
    tuned_rl_profile_content: |
      [profile]
      name = "ansible-test"
      [sysctl]
      "kernel.printk_ratelimit" = {tmp_path.joinpath("target").read_text().strip()}
  roles:
    - tuned_rl
  post_tasks:
    - name: Keep the module's result for the test
      check_mode: false
      ansible.builtin.copy:
        content: "{{{{ tuned_rl_result | to_json }}}}"
        dest: {tmp_path / "result.json"}
        mode: "0600"
      changed_when: false
""")
    env = {**os.environ, "ANSIBLE_ROLES_PATH": str(ROLES), "ANSIBLE_LOCALHOST_WARNING": "false",
           "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false", "ANSIBLE_PYTHON_INTERPRETER": sys.executable,
           "ANSIBLE_NOCOLOR": "1"}
    result = subprocess.run([ansible, "-i", "localhost,", str(playbook), *options], capture_output=True, text=True,
                            env=env, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    recap = re.search(r"localhost\s+:\s+ok=\d+\s+changed=(\d+)\s+unreachable=\d+\s+failed=(\d+)", result.stdout)
    return {"changed": int(recap.group(1)), "failed": int(recap.group(2)),
            "module": json.loads((tmp_path / "result.json").read_text()), "output": result.stdout}


def test_check_diff_apply_idempotence_and_absent(tmp_path):
    original = SYSCTL.read_text().strip()
    tmp_path.joinpath("target").write_text(str(int(original) + 1))
    try:
        check = play(tmp_path, "--check", "--diff")
        assert check["module"]["changed"] and SYSCTL.read_text().strip() == original  # check mode changes nothing
        diff = check["output"]  # Ansible prints the module's diff
        assert f"-/proc/sys/kernel/printk_ratelimit = {original}" in diff  # the live value
        assert f"+/proc/sys/kernel/printk_ratelimit = {int(original) + 1}" in diff
        assert not tmp_path.joinpath("default").exists()  # check mode wrote no settings either
        applied = play(tmp_path)
        assert applied["module"]["changed"] and SYSCTL.read_text().strip() == str(int(original) + 1)
        # the unit's watch is told to serve metrics and alarm at 5 ms (the role's defaults: no endpoint)
        assert tmp_path.joinpath("default").read_text() == \
            'TUNED_RL_WATCH_OPTIONS="--alarm-ms 5.0 --metrics-address 127.0.0.1:9464"\n'
        assert [s["outcome"] for s in applied["module"]["steps"]] == ["applied"]
        again = play(tmp_path)
        assert again["changed"] == 0 and not again["module"]["changed"]
        absent = play(tmp_path, state="absent")
        assert absent["module"]["changed"] and SYSCTL.read_text().strip() == original
    finally:
        subprocess.run([str(Path(sys.executable).parent / "tuned-rl"), "--state-dir", str(tmp_path / "state"),
                        "rollback"], capture_output=True)
        SYSCTL.write_text(original)


def test_the_pip_path_checked_on_a_node_without_tuned_rl_then_installed_applied_and_absent(tmp_path):
    # A first --check --diff before a roll-out, on a node where tuned-rl is not installed yet (here: the
    # role's virtual environment does not exist): it reports what it would install and that the profile
    # would be applied, changed, and fails nothing. Then the role's pip path for real: a virtual
    # environment installed from this checkout, the profile applied from it, and state=absent.
    original = SYSCTL.read_text().strip()
    tmp_path.joinpath("target").write_text(str(int(original) + 1))
    venv = tmp_path / "venv"
    install = f"""tuned_rl_install: pip
    tuned_rl_pip_source: {ROLES.parent.parent.parent}
    tuned_rl_venv: {venv}"""
    try:
        check = play(tmp_path, "--check", "--diff", install=install)
        assert check["failed"] == 0 and check["changed"] >= 2, check["output"]  # the pip install and the apply
        assert check["module"]["changed"] and "not installed yet" in check["module"]["msg"]
        assert '+"kernel.printk_ratelimit" = ' + str(int(original) + 1) in check["output"]  # the profile, in the diff
        assert not venv.exists() and SYSCTL.read_text().strip() == original  # nothing installed or changed
        applied = play(tmp_path, install=install)
        assert (venv / "bin" / "tuned-rl").exists() and applied["module"]["changed"]
        assert [s["outcome"] for s in applied["module"]["steps"]] == ["applied"]
        assert SYSCTL.read_text().strip() == str(int(original) + 1)
        absent = play(tmp_path, state="absent", install=install)
        assert absent["module"]["changed"] and SYSCTL.read_text().strip() == original
    finally:
        if (venv / "bin" / "tuned-rl").exists():
            subprocess.run([str(venv / "bin" / "tuned-rl"), "--state-dir", str(tmp_path / "state"), "rollback"],
                           capture_output=True)
        SYSCTL.write_text(original)
