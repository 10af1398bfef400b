"""The Ansible role and playbook pass ansible-lint's strictest ("production") profile."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ANSIBLE = Path(__file__).parent.parent / "packaging" / "ansible"
LINT = shutil.which("ansible-lint", path=str(Path(sys.executable).parent))


@pytest.mark.skipif(sys.version_info < (3, 10), reason="ansible-lint needs Python 3.10 (the README's .venv has it)")
def test_the_role_and_the_rollout_playbook_are_clean_under_the_production_profile():
    assert LINT, "ansible-lint is one of the test extras: pip install -e '.[test]'"
    result = subprocess.run([LINT, "--offline", "--nocolor", "--profile", "production", "."], cwd=ANSIBLE,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Profile 'production' was required, and it passed" in result.stdout + result.stderr
