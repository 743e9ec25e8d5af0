"""benchmarks/targets.py: each target judged on the unrounded figure."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from targets import verdict


def test_a_figure_that_rounds_to_its_target_but_falls_short_is_not_met():
    assert f"{2.4987:.2f}" == "2.50"
    assert verdict(2.4987, 2.5) == "**no** (2.499)"
    assert verdict(2.5, 2.5) == "yes (2.500)"


def test_an_upper_bound_is_met_at_or_below_it():
    assert verdict(1.084, 1.2, at_least=False) == "yes (1.084)"
    assert verdict(1.21, 1.2, at_least=False) == "**no** (1.210)"
