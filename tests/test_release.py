"""One version everywhere a release names it, and a changelog entry for it."""

from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path

import tuned_rl

ROOT = Path(__file__).parent.parent


def test_the_version_is_the_same_in_pyproject_the_package_the_debian_changelog_and_changelog_md():
    pyproject = re.search(r'^version = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    debian = re.match(r"tuned-rl \(([^)]+)\)", (ROOT / "debian" / "changelog").read_text()).group(1)
    changelog = re.search(r"^## (\S+)", (ROOT / "CHANGELOG.md").read_text(), re.M).group(1)
    assert pyproject == tuned_rl.__version__ == debian == changelog == version("tuned-rl"), \
        (pyproject, tuned_rl.__version__, debian, changelog, version("tuned-rl"))


def test_the_changelog_says_what_the_plugin_api_deprecates_and_until_when():
    from tuned_rl.core.plugin_api import DEPRECATED_UNTIL, PLUGIN_API_VERSION
    text = (ROOT / "CHANGELOG.md").read_text()
    release = text.split("\n## ", 2)[1]
    assert f"### Plugin API ({PLUGIN_API_VERSION})" in release and "### Deprecated" in release
    assert f"In {DEPRECATED_UNTIL} such a plugin no longer loads" in " ".join(release.split())
