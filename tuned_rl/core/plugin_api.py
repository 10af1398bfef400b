"""The plugin API's version, and the deprecation path of a plugin written for an older one.

A plugin module says which API it was written for: ``TUNED_RL_PLUGIN_API = "0.2"``. One that says
nothing was written for 0.1, the first release, whose tables had no ``phase``. Such a table still
loads, for this one release, with a warning that names what to add; its steps run after every
phase (0.1 ran steps in the order of the profile's tables). From API 0.2 on a table must declare
its phase, and a plugin that asks for an API newer than this tuned-rl's does not load.
"""

from __future__ import annotations

import re

from tuned_rl.core.phases import PHASES
from tuned_rl.profiles.schema import Table

PLUGIN_API_VERSION = "0.2"
FIRST_API = "0.1"  # what a plugin that declares no version was written for
DEPRECATED_UNTIL = "0.3"  # the tuned-rl release that no longer loads an API 0.1 table without a phase
ATTRIBUTE = "TUNED_RL_PLUGIN_API"


class PluginApiError(ValueError):
    """A plugin that cannot load: an API version this tuned-rl does not have, or a table it cannot run."""


def _parsed(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d{1,4})\.(\d{1,4})", text)
    if match is None:
        raise PluginApiError(f'{ATTRIBUTE} must be "MAJOR.MINOR" (this tuned-rl has "{PLUGIN_API_VERSION}"), '
                             f"not {text!r:.60}")
    return int(match.group(1)), int(match.group(2))


def declared_api(plugin) -> str:
    """The plugin API version the plugin says it was written for (the first one if it says none)."""
    declared = getattr(plugin, ATTRIBUTE, None)
    if declared is None:
        return FIRST_API
    if not isinstance(declared, str):
        raise PluginApiError(f'{ATTRIBUTE} must be a string such as "{PLUGIN_API_VERSION}", not {declared!r:.60}')
    if _parsed(declared) > _parsed(PLUGIN_API_VERSION):
        raise PluginApiError(f"written for plugin API {declared}; this tuned-rl has {PLUGIN_API_VERSION}: "
                             "upgrade tuned-rl")
    if _parsed(declared) < _parsed(FIRST_API):
        raise PluginApiError(f"written for plugin API {declared}, older than any this tuned-rl loads ({FIRST_API})")
    return declared


def table_warnings(tables: list[Table], api: str) -> list[str]:
    """What an API 0.1 plugin's tables lack, said as what to add; raises for a table that cannot run."""
    warnings = []
    for table in tables:
        if table.phase in PHASES:
            continue
        if table.phase is None and _parsed(api) < (0, 2):
            warnings.append(
                f"table [{table.name}] declares no phase (plugin API {api}); it loads until tuned-rl "
                f"{DEPRECATED_UNTIL}, its steps after every phase. Add phase=\"...\" to its Table(...), one of "
                f"{', '.join(PHASES)} (tuned_rl.core.phases says what runs in each), and "
                f'{ATTRIBUTE} = "{PLUGIN_API_VERSION}" to the plugin module')
            continue
        raise PluginApiError(f"table [{table.name}] declares phase {table.phase!r}; "
                             f"one of {', '.join(PHASES)} is needed")
    return warnings
