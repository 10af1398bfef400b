"""The man page, tuned-rl(8), against the command line's parser: every command, option and exit status."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import manpage  # noqa: E402

from tuned_rl import cli  # noqa: E402

PAGE = ROOT / "docs" / "tuned-rl.8"


def test_the_page_is_what_the_parser_writes():
    # Fails when an option, a command or a help text changed without the page: regenerate with
    # .venv/bin/python tools/manpage.py > docs/tuned-rl.8
    assert PAGE.read_text() == manpage.render(manpage.parser_without_environment(), version("tuned-rl"))


def test_every_command_and_option_of_the_parser_is_in_the_page():
    page = PAGE.read_text()
    parser = manpage.parser_without_environment()
    sections = re.split(r"^\.SS ", page.split(".SH COMMANDS", 1)[1].split(".SH EXIT STATUS")[0], flags=re.M)
    by_command = {section.split("\n", 1)[0].replace("\\-", "-"): section for section in sections[1:]}
    assert set(by_command) == set(manpage.commands(parser))
    for name, (sub, _) in manpage.commands(parser).items():
        for action in sub._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert f"\\fB{option.replace('-', chr(92) + '-')}\\fR" in by_command[name], (name, option)


def test_every_exit_status_is_in_the_page():
    statuses = page_section("EXIT STATUS")
    for status in (cli.EXIT_OK, cli.EXIT_FAILED, cli.EXIT_BAD_INPUT, cli.EXIT_BROKEN_PIPE, 126, 127):
        assert f".TP\n\\fB{status}\\fR\n" in statuses


@pytest.mark.skipif(shutil.which("man") is None, reason="man-db is not installed")
def test_man_renders_it_without_a_warning():
    result = subprocess.run(["man", "--warnings", "-l", str(PAGE)], capture_output=True, text=True,
                            env={"LC_ALL": "C.UTF-8", "MANWIDTH": "80", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert "EXIT STATUS" in result.stdout and "--dry-run" in result.stdout


def page_section(title: str) -> str:
    return PAGE.read_text().split(f".SH {title}\n", 1)[1].split("\n.SH ", 1)[0]
