"""The host's noise remembered across applies: recalled only where it was learned the same way,
never trusted beyond its checks, bounded on disk, and never the ground of a revert."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest

from tuned_rl.core.noise_memory import MAX_ENTRIES, NOISE_FILE, RECALLED_DF_CAP, NoiseMemory
from tuned_rl.core.verify import Verifier
from tuned_rl.host import Host
from tuned_rl.measure.settings import VERIFY_TABLE, VerifySettings
from tuned_rl.measure.switchback import NO_PRIOR, NoisePrior
from tuned_rl.measure.targets import Target

from test_verify import StateProbe, run_step

LEARNED = NoisePrior(tail=(0.2, 20), broad=(0.1, 18))


@pytest.fixture
def private_dir(tmp_path):
    path = tmp_path / "state"
    os.mkdir(path, 0o700)
    return path


def memory(state_dir, key="canary", boot="boot-1", hours=24.0, now=1_000_000.0):
    """The memory of target ``key`` as seen at ``now`` (seconds)."""
    remembered = NoiseMemory.for_target(state_dir, {"canary": key}, "p999", 0.5, boot, hours)
    return dataclasses.replace(remembered, clock=lambda: now)


def test_a_prior_is_recalled_where_it_was_learned_the_same_way_its_freedom_capped(private_dir):
    assert memory(private_dir).remember(1, LEARNED)
    recalled = memory(private_dir, now=1_000_000.0 + 3600).recall(1)
    assert recalled.tail == (0.2, RECALLED_DF_CAP) and recalled.broad == (0.1, RECALLED_DF_CAP)
    assert recalled.df == RECALLED_DF_CAP < LEARNED.df
    assert oct(os.stat(private_dir / NOISE_FILE).st_mode & 0o777) == "0o600"


@pytest.mark.parametrize("elsewhere", ["other blocks", "other boot", "other target", "too old", "from the future"])
def test_a_prior_learned_otherwise_is_not_recalled(private_dir, elsewhere):
    memory(private_dir).remember(1, LEARNED)
    recall = {"other blocks": lambda: memory(private_dir).recall(2),
              "other boot": lambda: memory(private_dir, boot="boot-2").recall(1),
              "other target": lambda: memory(private_dir, key="workload").recall(1),
              "too old": lambda: memory(private_dir, now=1_000_000.0 + 25 * 3600).recall(1),
              "from the future": lambda: memory(private_dir, now=1_000_000.0 - 60).recall(1)}[elsewhere]
    assert recall() is NO_PRIOR


def test_the_window_length_and_the_metric_are_part_of_the_target_key(private_dir):
    keys = {NoiseMemory.for_target(private_dir, {"canary": "c"}, metric, seconds, "b", 24).target_key
            for metric in ("p999", "p99") for seconds in (0.5, 1.0)}
    assert len(keys) == 4


def test_hours_zero_turns_the_memory_off_and_the_table_accepts_it():
    assert NoiseMemory.for_target("/nonexistent", {}, "p999", 0.5, "b", 0) is None
    assert VERIFY_TABLE.check({"noise_memory_hours": 0}) == [] and VERIFY_TABLE.check({"noise_memory_hours": -1})
    assert VerifySettings.from_table({"noise_memory_hours": 2}).noise_memory_hours == 2


@pytest.mark.parametrize("text", [
    "not json", "[]", '{"version": 2, "entries": {}}', '{"version": 1, "entries": []}',
    '{"version": 1, "entries": {"K": {"boot_id": "boot-1", "windows_per_block": 1, "learned_at": 1000000, '
    '"tail": [0.2, true], "broad": [0.1, 18]}}}',
    '{"version": 1, "entries": {"K": {"boot_id": "boot-1", "windows_per_block": 1, "learned_at": 1000000, '
    '"tail": [-0.2, 20], "broad": [0.1, 18]}}}',
    '{"version": 1, "entries": {"K": {"boot_id": "boot-1", "windows_per_block": 1, "learned_at": 1000000, '
    '"tail": [NaN, 20], "broad": [0.1, 18]}}}',
    '{"version": 1, "entries": {"K": {"boot_id": "boot-1", "windows_per_block": 1, "learned_at": "yesterday", '
    '"tail": [0.2, 20], "broad": [0.1, 18]}}}',
    '{"version": 1, "entries": {"K": {"boot_id": "boot-1", "windows_per_block": 1, "learned_at": 1000000, '
    '"tail": [0.2, 0], "broad": [0.1, 18]}}}',
    '{"version": 1, "entries": {"K": {"boot_id": "boot-1", "windows_per_block": 1, "learned_at": 1000000, '
    '"tail": [0.2, 20], "broad": [0.1, 18]}}, "padding": "' + "x" * 70_000 + '"}',
])
def test_a_file_that_is_not_as_written_recalls_nothing_and_is_replaced_whole(private_dir, text):
    remembered = memory(private_dir)
    (private_dir / NOISE_FILE).write_text(text.replace('"K"', json.dumps(remembered.target_key)))
    assert remembered.recall(1) is NO_PRIOR
    assert remembered.remember(1, LEARNED) and remembered.recall(1).tail == (0.2, RECALLED_DF_CAP)


def test_a_link_in_its_place_is_not_followed(private_dir, tmp_path):
    elsewhere = tmp_path / "elsewhere.json"
    memory(private_dir).remember(1, LEARNED)
    os.replace(private_dir / NOISE_FILE, elsewhere)
    (private_dir / NOISE_FILE).symlink_to(elsewhere)
    assert memory(private_dir).recall(1) is NO_PRIOR


def test_a_state_directory_someone_else_can_write_recalls_nothing(private_dir):
    memory(private_dir).remember(1, LEARNED)
    os.chmod(private_dir, 0o777)
    try:
        assert memory(private_dir).recall(1) is NO_PRIOR and not memory(private_dir).remember(1, LEARNED)
    finally:
        os.chmod(private_dir, 0o700)


def test_without_a_state_directory_nothing_is_written_nor_created(tmp_path):
    missing = tmp_path / "state"
    assert not memory(missing).remember(1, LEARNED) and not missing.exists()


def test_the_file_holds_the_newest_targets_only(private_dir):
    for i in range(MAX_ENTRIES + 10):
        memory(private_dir, key=f"target-{i}", now=1_000_000.0 + i).remember(1, LEARNED)
    entries = json.loads((private_dir / NOISE_FILE).read_text())["entries"]
    assert len(entries) == MAX_ENTRIES
    assert memory(private_dir, key=f"target-{MAX_ENTRIES + 9}", now=1_000_100.0).recall(1) is not NO_PRIOR
    assert memory(private_dir, key="target-0", now=1_000_100.0).recall(1) is NO_PRIOR


def remembering_verifier(state_dir, seed):
    verifier = Verifier(Host("/nonexistent"), Target("canary"), None,
                        VerifySettings(window_seconds=0.001, settle_seconds=0, run_seconds=0.002),
                        memory=memory(state_dir))
    verifier._probe = StateProbe(lambda: 1.0)
    verifier._probe.rng = np.random.default_rng(seed)
    verifier._order = np.random.default_rng(seed)
    return verifier


def test_a_later_applys_first_step_borrows_the_noise_and_a_harmful_step_is_still_reverted(private_dir):
    first_apply = remembering_verifier(private_dir, 1)
    kept, _ = run_step(first_apply, harm=1.0)
    assert kept.outcome == "kept" and kept.verdict.noise_prior_df == 0  # a first step on a new node: nothing to borrow
    assert (private_dir / NOISE_FILE).exists()

    later = remembering_verifier(private_dir, 2)
    kept, _ = run_step(later, harm=1.0)
    assert kept.outcome == "kept" and kept.verdict.noise_prior_df > 0, kept.verdict.reason

    later = remembering_verifier(private_dir, 3)
    reverted, state = run_step(later, harm=3.0)
    assert reverted.outcome == "reverted" and not state["applied"]
