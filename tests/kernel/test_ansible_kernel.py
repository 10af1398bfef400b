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


def play(tmp_path, *options, state="present") -> dict:
    playbook = tmp_path / "play.yml"
    playbook.write_text(f"""\
- hosts: localhost
  connection: local
  gather_facts: false
  vars:
    tuned_rl_install: none
    tuned_rl_executable: {Path(sys.executable).parent / "tuned-rl"}
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
    recap = re.search(r"localhost\s+:\s+ok=\d+\s+changed=(\d+)", result.stdout)
    return {"changed": int(recap.group(1)), "module": json.loads((tmp_path / "result.json").read_text()),
            "output": result.stdout}


def test_check_diff_apply_idempotence_and_absent(tmp_path):
    original = SYSCTL.read_text().strip()
    tmp_path.joinpath("target").write_text(str(int(original) + 1))
    try:
        check = play(tmp_path, "--check")
        assert check["module"]["changed"] and SYSCTL.read_text().strip() == original  # check mode changes nothing
        diff = play(tmp_path, "--check", "--diff")["output"]  # Ansible prints the module's diff
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
