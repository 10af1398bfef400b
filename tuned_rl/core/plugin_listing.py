"""What `tuned-rl plugins` shows: every plugin loaded, the plugin API it is written for, its tables
and their phases, the plugins that failed to load and the deprecated ones, as JSON and a table."""

from __future__ import annotations

from dataclasses import dataclass

from tuned_rl.core.phases import PHASES
from tuned_rl.core.plugin_api import PLUGIN_API_VERSION
from tuned_rl.core.plugin_host import PluginHost
from tuned_rl.rendering import RendersJson, format_table


@dataclass
class PluginListing(RendersJson):
    plugins: PluginHost

    def to_dict(self) -> dict:
        host = self.plugins
        return {"plugin_api": PLUGIN_API_VERSION,
                "plugins": [{"name": name, "api": host.apis.get(name),
                             "tables": [{"name": t.name, "phase": t.phase, "help": t.help} for t in tables]}
                            for name, tables in host.plugin_tables().items()],
                "phases": list(PHASES),
                "failed": [{"name": f.name, "error": f.error} for f in host.failures],
                "deprecated": [{"name": w.name, "warning": w.warning} for w in host.warnings]}

    def to_text(self) -> str:
        host = self.plugins
        deprecated = {w.name for w in host.warnings}
        rows = [(name, host.apis.get(name, ""),
                 ", ".join(f"[{t.name}] ({t.phase or 'after every phase'})" for t in tables),
                 "loaded" + (" (deprecated, see below)" if name in deprecated else ""))
                for name, tables in host.plugin_tables().items()]
        rows += [(f.name, "", "", f"failed: {f.error}") for f in host.failures]
        lines = format_table(("PLUGIN", "API", "TABLES (PHASE)", "STATE"), rows)
        lines.append(f"steps run in phase order: {' -> '.join(PHASES)}; this tuned-rl's plugin API: "
                     f"{PLUGIN_API_VERSION}")
        lines += [f"{w.name}: {w.warning}" for w in host.warnings]
        return "\n".join(lines)
