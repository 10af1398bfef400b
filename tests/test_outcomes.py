"""Outcomes and states are Enums whose members are the report words: JSON readers (the Ansible
module, scripts) see the words they always did, on every Python tuned-rl supports."""

from __future__ import annotations

import json

from tuned_rl.core.change_rows import ChangeStatus, RestoredChange
from tuned_rl.core.outcomes import Outcome, Restore, State
from tuned_rl.core.report import OUTCOMES
from tuned_rl.core.rollback_report import RollbackReport
from tuned_rl.core.status_report import StatusReport


def test_members_are_their_words_in_json_format_and_comparison():
    assert OUTCOMES == tuple(Outcome) and [o.value for o in Outcome] == [
        "planned", "unchanged", "applied", "kept", "reverted", "failed", "skipped", "inconclusive"]
    assert json.dumps([Outcome.KEPT, Restore.LEFT, State.DRIFTED]) == '["kept", "left", "drifted"]'
    assert f"{Outcome.REVERTED}|{Outcome.KEPT:>6}|" == "reverted|  kept|" and str(State.HOLDS) == "holds"
    assert Outcome.KEPT == "kept" and Restore.GONE == "gone" and State.GONE == "gone"


def test_rollback_and_status_reports_keep_the_json_shape_the_ansible_module_reads():
    rollback = RollbackReport("p", [RestoredChange("sysctl", "s", "/proc/sys/vm/swappiness", "10", "60",
                                                   Restore.RESTORED),
                                    RestoredChange("sysctl", "s", "/proc/sys/vm/x", "5", "5", Restore.LEFT, "theirs")])
    data = json.loads(rollback.to_json())
    assert set(data) == {"profile", "changes", "stale", "refused", "refused_kept_in", "removed"}
    assert data["changes"][0] == {"plugin": "sysctl", "step": "s", "target": "/proc/sys/vm/swappiness",
                                  "before": "10", "after": "60", "outcome": "restored"}
    assert data["changes"][1]["reason"] == "theirs" and not rollback.failed
    assert "rolled back p" in rollback.to_text() and "left" in rollback.to_text()
    status = StatusReport("p", digest="d", changes=[ChangeStatus("sysctl", "s", "/proc/sys/vm/swappiness", "60", "10",
                                                                 "10", State.HOLDS)])
    data = json.loads(status.to_json())
    assert {"profile", "path", "digest", "applied_at", "stale", "changes", "removed", "deferred", "deferred_results",
            "awaiting", "verified", "verified_p999_us", "watched", "watch_plugin_failures"} == set(data)
    assert data["changes"][0]["state"] == "holds" and "reason" not in data["changes"][0]
    assert "/proc/sys/vm/swappiness" in status.to_text() and "holds" in status.to_text()
    assert RollbackReport(None).to_text() == "nothing to roll back"
    assert StatusReport(None).to_text() == "nothing applied"
