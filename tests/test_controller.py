"""The draft-length controller: Leviathan's expectation, the cost model, and the decisions it
takes at different acceptance rates and loads."""

from __future__ import annotations

import random

import pytest

from specdec.config import AdaptiveOptions
from specdec.controller import Controller, ForwardCost, expected_tokens

ROWS = [1, 2, 4, 8, 16, 32, 64]


def cpu_like_cost() -> ForwardCost:
    """20 ms to stream the weights, then 1.5 ms per row of compute (this machine's shape)."""
    return ForwardCost(ROWS, [0.020 + 0.0015 * r for r in ROWS])


def measured_cost() -> ForwardCost:
    """The embedded target's start-up calibration on the development machine: flat to 4 rows
    (the weights dominate), then ~3 ms a row (compute)."""
    return ForwardCost(ROWS, [0.0245, 0.0252, 0.0308, 0.0406, 0.0745, 0.1208, 0.2188])


def controller(cost: ForwardCost | None = None, **options) -> Controller:
    return Controller(AdaptiveOptions(**options), target=cost or cpu_like_cost())


def settle(ctl: Controller, keys: list[str], acceptance: float, rounds: int = 60) -> list[int]:
    """Run rounds where each draft token is accepted with probability `acceptance` (until the
    first rejection); return the draft lengths of the last round."""
    rng = random.Random(0)
    ks = []
    for _ in range(rounds):
        ks = [ctl.choose_k(key, 8) for key in keys]
        for key, k in zip(keys, ks, strict=True):
            accepted = 0
            while accepted < k and rng.random() < acceptance:
                accepted += 1
            ctl.observe(key, k, accepted)
    return ks


def test_expected_tokens_follows_leviathan():
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(1.0, 5) == 6.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)


def test_forward_cost_interpolates_extrapolates_and_tracks_observations():
    cost = cpu_like_cost()
    assert cost.time(3) == pytest.approx(0.020 + 0.0015 * 3)
    assert cost.time(128) == pytest.approx(0.020 + 0.0015 * 128)
    assert cost.marginal(10) == pytest.approx(0.0015)
    for _ in range(150):
        cost.observe(8, 2 * (0.020 + 0.0015 * 8))  # the machine got twice as slow
    assert cost.time(8) == pytest.approx(2 * (0.020 + 0.0015 * 8), rel=0.01)
    assert cost.time(1) == pytest.approx(2 * (0.020 + 0.0015), rel=0.01)  # every row count with it
    assert cost.marginal(10) == pytest.approx(2 * 0.0015, rel=0.01)
    before = cost.time(4)
    cost.observe(4, 100.0)  # one stalled forward moves the table a little, not 100 s
    assert before < cost.time(4) < 1.1 * before


def test_slow_forwards_of_few_rows_leave_extra_rows_their_cost(tmp_path):
    """In service a lone call's forward runs beside the server's other work, often three times
    slower than calibrated, while full batches run near their time: an extra row must still cost
    what the calibrated shape says it costs, scaled, not nothing."""
    cost = cpu_like_cost()
    for _ in range(300):
        cost.observe(1, 3 * (0.020 + 0.0015 * 1))
        cost.observe(16, 1.1 * (0.020 + 0.0015 * 16))
    assert cost.marginal(8) > 0.0015  # slower than calibrated, never free
    assert cost.time(16) > cost.time(8) > cost.time(1)
    (tmp_path / "cost.json").write_text(cost.to_json())  # as the engine model publishes it
    reloaded = ForwardCost.load(tmp_path / "cost.json")
    assert reloaded is not None and reloaded.time(5) == pytest.approx(cost.time(5))


def test_an_idle_server_drafts_long_when_drafts_are_accepted():
    ctl = controller()
    ctl.start("a", "ngram", 8)
    assert settle(ctl, ["a"], acceptance=0.9) == [8]


def test_drafts_that_are_rejected_stop_being_made():
    ctl = controller(probe_every=1000)
    ctl.start("a", "ngram", 8)
    assert settle(ctl, ["a"], acceptance=0.0) == [0]


@pytest.mark.parametrize("shape", [cpu_like_cost, measured_cost])
@pytest.mark.parametrize("acceptance", [0.3, 0.5, 0.7, 0.9])
def test_the_chosen_lengths_come_close_to_the_best_fixed_length_at_every_load(acceptance, shape):
    """Against the cost model, the throughput of the controller's choices is within 10% of the
    best common draft length, and never below plain decoding: drafts shrink as the batch grows
    (every extra row costs compute another request's plain step would have used) and stop when
    they no longer pay."""
    cost = shape()
    for batch in (1, 2, 4, 8, 16, 32):
        ctl = controller(cost)
        keys = [f"r{i}" for i in range(batch)]
        for key in keys:
            ctl.start(key, "ngram", 8)
        ks = settle(ctl, keys, acceptance, rounds=100)

        def throughput(lengths: list[int]) -> float:
            tokens = sum(expected_tokens(acceptance, k) for k in lengths)
            return tokens / cost.time(sum(k + 1 for k in lengths))

        best = max(throughput([k] * batch) for k in range(9))
        assert throughput(ks) >= 0.9 * best, (batch, ks)
        assert throughput(ks) >= 0.97 * throughput([0] * batch), (batch, ks)


def test_drafts_shrink_with_load():
    chosen = {}
    for batch in (1, 32):
        ctl = controller(probe_every=1000)
        keys = [f"r{i}" for i in range(batch)]
        for key in keys:
            ctl.start(key, "ngram", 8)
        chosen[batch] = max(settle(ctl, keys, acceptance=0.5, rounds=100))
    assert chosen[1] >= 2 and chosen[32] == 0


def test_a_request_without_drafts_probes_now_and_then():
    ctl = controller(probe_every=4)
    ctl.start("a", "ngram", 8)
    settle(ctl, ["a"], acceptance=0.0)
    ctl.prior["ngram"] = 0.5  # other requests' prompt lookups do get accepted
    ks = [ctl.choose_k("a", 8) for _ in range(8)]
    assert ks.count(1) == 2 and ks.count(0) == 6


def test_no_probes_where_even_the_proposers_average_would_not_pay():
    ctl = controller(probe_every=2)
    keys = [f"r{i}" for i in range(32)]
    for key in keys:
        ctl.start(key, "ngram", 8)
    settle(ctl, keys, acceptance=0.3, rounds=100)
    assert [ctl.choose_k(key, 8) for key in keys for _ in range(4)] == [0] * 128


def test_disabled_controller_uses_the_requested_length():
    ctl = controller(enabled=False)
    ctl.start("a", "ngram", 5)
    assert settle(ctl, ["a"], acceptance=0.0) == [5]
    assert ctl.choose_k("a", 3) == 3  # never more than the remaining budget


def test_without_a_calibration_the_requested_length_is_used():
    ctl = Controller(AdaptiveOptions())
    ctl.start("a", "draft_model", 4)
    assert ctl.choose_k("a", 8) == 4
