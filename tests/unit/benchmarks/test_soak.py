"""The memory verdicts of benchmarks/soak.py on made-up samples: what a leak and a one-time step
look like to them."""

from __future__ import annotations

import pytest
from soak import half_slopes, slope


def samples(resident) -> list:
    """MemoryLog's samples, every 8 requests from 0 to 240, of one process whose resident bytes
    after n requests are resident(n)."""
    return [(n, {"draft": (resident(n), 0, 0, 0)}) for n in range(0, 241, 8)]


def test_a_leak_grows_in_both_halves_and_a_step_in_one():
    leak = half_slopes(samples(lambda n: 100_000_000 + 16_384 * n), 80, 240)["draft"]
    assert leak == pytest.approx((16_384, 16_384))
    step = half_slopes(samples(lambda n: 100_000_000 + (1_300_000 if n > 120 else 0)), 80, 240)["draft"]
    assert max(step) > 8192 and abs(min(step)) < 1  # the whole window's slope would fail it
    assert slope([(n, v["draft"][0]) for n, v in samples(lambda n: 100_000_000 + (1_300_000 if n > 120 else 0))
                  if n >= 80]) > 8192  # fmt: skip
    late = half_slopes(samples(lambda n: 100_000_000 + (1_300_000 if n > 200 else 0)), 80, 240)["draft"]
    assert abs(min(late)) < 1
