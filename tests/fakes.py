"""Test stand-ins for what a host does beyond its files: commands and systemd, kept in the tree.

``TreeHost`` is a Host whose root is a temporary tree and whose commands (``systemctl
daemon-reload``) are logged to ``<root>/run/tuned-rl-actions.log`` instead of run, with each
systemd unit's state a file ``<root>/run/tuned-rl-services/UNIT`` ("active" or "inactive"; the
folder's presence says systemd is the init system). The production Host refuses commands and
service calls below a moved root; tests/tuned_rl_on_a_tree.py runs the CLI with this one.
"""

from __future__ import annotations

from tuned_rl.host import Host

ACTION_LOG = "/run/tuned-rl-actions.log"
SERVICE_STATES = "/run/tuned-rl-services"


class TreeHost(Host):
    """A Host on a test tree, its commands logged and its services' states files of the tree."""

    def _run_command(self, argv: list[str]) -> None:
        log = self.path(ACTION_LOG)
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a") as handle:
            handle.write(" ".join(argv) + "\n")

    def has_systemd(self) -> bool:
        return self.exists(SERVICE_STATES)

    def service_active(self, unit: str) -> bool:
        path = self.path(f"{SERVICE_STATES}/{unit}")
        return path.exists() and path.read_text().strip() == "active"

    def set_service_active(self, unit: str, active: bool) -> None:
        path = self.path(f"{SERVICE_STATES}/{unit}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("active\n" if active else "inactive\n")
