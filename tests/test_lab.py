"""The scenario lab's command line (bench/scenarios/lab.py): what each scenario's --runs hands it."""

from __future__ import annotations
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "bench" / "scenarios"))
from lab import runs_arguments  # noqa: E402  the lab's own parser, as the scenarios use it


def test_runs_without_a_canary_option_leave_the_canary_at_its_defaults():
    # `harmless_step.py --runs 20` failed before its first run ("'': expected PERIODxTHREADS"):
    # argparse passes a string default through the option's type.
    args = runs_arguments(["--runs", "20"], verify=True, canary=True)
    assert (args.runs, args.canary, args.verify) == (20, "", [])


def test_a_canary_option_becomes_the_profiles_target_keys_and_a_bad_one_is_refused():
    args = runs_arguments(["--runs", "3", "--canary", "250x4", "--verify", "harm=4"], verify=True, canary=True)
    assert args.canary == "canary_period_us = 250\ncanary_threads = 4"
    assert args.verify == ["harm = 4.0"]
    with pytest.raises(SystemExit):
        runs_arguments(["--canary", "250"], canary=True)


def test_a_scenario_without_the_options_does_not_take_them():
    assert not hasattr(runs_arguments(["--runs", "2"]), "canary")
    with pytest.raises(SystemExit):
        runs_arguments(["--canary", "250x4"])
