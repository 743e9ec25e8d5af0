"""The draft-length controller: the expected tokens of a round, the cost model, and the decisions
it takes at different acceptance rates and loads."""

from __future__ import annotations

import random

import numpy as np
import pytest

from specdec.config import AdaptiveOptions
from specdec.speculation.controller import (
    SHAPE_MIN,
    SHAPE_WINDOW,
    Acceptance,
    Controller,
    ForwardCost,
    Rate,
    token_value,
)

ROWS = [1, 2, 4, 8, 16, 32, 64]


def cpu_like_cost() -> ForwardCost:
    """20 ms to stream the weights, then 1.5 ms per row of compute (this machine's shape)."""
    return ForwardCost(ROWS, [0.020 + 0.0015 * r for r in ROWS])


def measured_cost() -> ForwardCost:
    """The embedded target's start-up calibration on the development machine: flat to 4 rows
    (the weights dominate), then ~3 ms a row (compute)."""
    return ForwardCost(ROWS, [0.0245, 0.0252, 0.0308, 0.0406, 0.0745, 0.1208, 0.2188])


def staircase_cost() -> ForwardCost:
    """The embedded target's forward by row count on the development machine, every count to 17:
    flat to 8 rows, then a step (the matmul took rows in blocks of 8 then)."""
    ms = [17.3, 17.1, 17.0, 17.6, 17.7, 17.9, 18.2, 18.0, 20.0, 20.2, 21.2, 22.3, 23.1, 23.9, 25.0, 26.5, 29.0]
    return ForwardCost(list(range(1, 18)), [t / 1e3 for t in ms])


def controller(cost: ForwardCost | None = None, **options) -> Controller:
    return Controller(AdaptiveOptions(**options), target=cost or cpu_like_cost())


def settle(
    ctl: Controller, keys: list[str], acceptance: float, rounds: int = 60, then: float | None = None
) -> list[int]:
    """Run rounds where a draft's first token is accepted with probability `acceptance` and each
    next one, after an accepted one, with `then` (default: the same), until the first rejection;
    return the draft lengths of the last round."""
    rng = random.Random(0)
    ks = []
    for _ in range(rounds):
        ks = [ctl.choose_k(key, 8) for key in keys]
        for key, k in zip(keys, ks, strict=True):
            accepted = 0
            while accepted < k and rng.random() < (acceptance if accepted == 0 or then is None else then):
                accepted += 1
            ctl.observe(key, k, accepted)
    return ks


def expected_tokens(first: float, then: float, k: int) -> float:
    """Tokens a round of k draft tokens yields by the controller's values: its own plus theirs."""
    return 1.0 + sum(token_value(first, then, j) for j in range(k))


def test_expected_tokens_follows_leviathan_and_two_rates():
    assert expected_tokens(0.0, 0.0, 5) == 1.0
    assert expected_tokens(1.0, 1.0, 5) == 6.0
    assert expected_tokens(0.5, 0.5, 2) == pytest.approx(1.75)  # (1 - a^3) / (1 - a)
    assert expected_tokens(0.4, 0.9, 7) == pytest.approx(1 + 0.4 * (1 - 0.9**7) / 0.1)
    assert expected_tokens(0.9, 0.9, 0) == 1.0


def test_acceptance_separates_first_tokens_from_the_rest():
    ctl = controller()
    ctl.start("a", "ngram", 8)
    for _ in range(200):  # copies: missed at once, or accepted to the end
        ctl.observe("a", 8, 0)
        ctl.observe("a", 8, 8)
    first, then = ctl.rates("a")
    assert first == pytest.approx(0.5, abs=0.05)
    assert then > 0.95


def test_a_request_starts_from_its_proposers_first_token_rate_and_its_own_drafts_take_over():
    ctl = controller()
    ctl.start("a", "ngram", 8)
    for _ in range(100):
        ctl.observe("a", 4, 1)  # first tokens accepted, the next ones never
    ctl.start("b", "ngram", 8)
    first, then = ctl.rates("b")
    assert first > 0.9 and then == first  # nothing of its own yet: Leviathan's single rate
    for _ in range(100):
        ctl.observe("b", 4, 0)
    assert ctl.rates("b")[0] < 0.3 < ctl.rates("a")[0]
    assert ctl.rates("a")[1] < 0.3  # its next tokens never accepted: far below its first tokens


def test_sampled_requests_start_from_the_sampled_requests_drafts():
    """Greedy requests whose drafts are all accepted say nothing of sampled ones, which a draft
    token fits less often: each starts from its own kind's recent rate."""
    ctl = controller()
    ctl.start("greedy", "ngram", 8)
    ctl.start("sampled", "ngram", 8, sampled=True)
    for _ in range(100):
        ctl.observe("greedy", 4, 4)
        ctl.observe("sampled", 4, 0)
    ctl.start("next greedy", "ngram", 8)
    ctl.start("next sampled", "ngram", 8, sampled=True)
    assert ctl.rates("next greedy")[0] > 0.9 and ctl.rates("next sampled")[0] < 0.1
    assert set(ctl.recent) == {"ngram", "ngram sampled"}


def test_one_token_drafts_leave_the_next_tokens_at_the_first_tokens_rate():
    ctl = controller()
    ctl.start("a", "ngram", 8)
    for _ in range(200):
        ctl.observe("a", 1, 1)
    first, then = ctl.rates("a")
    assert first == 0.99 and then > 0.9


def test_forward_cost_interpolates_extrapolates_and_tracks_observations():
    cost = cpu_like_cost()
    assert cost.time(3) == pytest.approx(0.020 + 0.0015 * 3)
    assert cost.time(128) == pytest.approx(0.020 + 0.0015 * 128)
    assert cost.time(11) - cost.time(10) == pytest.approx(0.0015)
    for _ in range(150):
        cost.observe(8, 2 * (0.020 + 0.0015 * 8))  # the machine got twice as slow
    assert cost.time(8) == pytest.approx(2 * (0.020 + 0.0015 * 8), rel=0.01)
    assert cost.time(1) == pytest.approx(2 * (0.020 + 0.0015), rel=0.01)  # every row count with it
    assert cost.time(11) - cost.time(10) == pytest.approx(2 * 0.0015, rel=0.01)
    before = cost.time(4)
    cost.observe(4, 100.0)  # one stalled forward moves the table a little, not 100 s
    assert before < cost.time(4) < 1.1 * before


def test_forward_cost_looks_up_whole_rows_as_it_interpolates_them():
    cost = staircase_cost()
    cost.observe(8, 0.03)
    rows = np.arange(0, 60)  # past the table's 2 x 17: extrapolated
    looked_up = cost.times(rows)
    assert np.array_equal(looked_up, cost.scale * cost._interpolated(rows))
    assert [cost.time(int(r)) for r in rows] == pytest.approx(looked_up, rel=1e-12)
    assert cost.time(9.5) == pytest.approx((cost.time(9) + cost.time(10)) / 2)


def test_slow_forwards_of_few_rows_leave_extra_rows_their_cost(tmp_path):
    """In service a lone call's forward runs beside the server's other work, often three times
    slower than calibrated, while full batches run near their time: an extra row must still cost
    what the calibrated shape says it costs, scaled, not nothing."""
    cost = cpu_like_cost()
    for _ in range(300):
        cost.observe(1, 3 * (0.020 + 0.0015 * 1))
        cost.observe(16, 1.1 * (0.020 + 0.0015 * 16))
    assert cost.time(9) - cost.time(8) > 0.0015  # slower than calibrated, never free
    assert cost.time(16) > cost.time(8) > cost.time(1)
    (tmp_path / "cost.json").write_text(cost.to_json())  # as the engine model publishes it
    reloaded = ForwardCost.load(tmp_path / "cost.json")
    assert reloaded is not None and reloaded.time(5) == pytest.approx(cost.time(5))
    assert cost.shape == {}  # forwards beside other requests' work teach no shape


def served_at_one_user(rows: int) -> float:
    """A served forward: what every row count pays alike (the threads waking after the round
    trip), then rows that cost little until the compute shows."""
    return 0.004 + 0.010 + 0.0002 * rows + 0.0008 * max(rows - 12, 0)


def test_lone_forwards_teach_the_shape_a_start_up_calibration_got_wrong(tmp_path):
    """A start-up calibration beside other processes' loading: 16 rows priced at 2.1x one row,
    where a served forward of 16 rows costs 1.3x. Forwards of the only sequence served correct
    each row count's price, robust to stalls; row counts never seen take their neighbours'."""
    cost = ForwardCost(ROWS, [0.009, 0.0095, 0.011, 0.0125, 0.019, 0.035, 0.066])
    seen = (1, 2, 5, 9, 13, 16)
    for n in range(1, SHAPE_WINDOW + 1):
        for i, rows in enumerate(seen):
            stalled = (n * len(seen) + i) % 8 == 0  # one lone forward in eight runs 5x slow
            cost.observe(rows, served_at_one_user(rows) * (5 if stalled else 1), alone=True)
        if n == SHAPE_MIN - 1:
            assert cost.shape == {}  # too few yet: the calibrated shape, scaled
    truth = np.array([served_at_one_user(r) for r in seen])
    assert cost.times(np.array(seen)) / truth == pytest.approx(np.ones(len(seen)), rel=0.1)
    # what the plan weighs: an extra row's price against a row's, as served
    assert (cost.time(13) - cost.time(9)) / cost.time(1) == pytest.approx(
        (served_at_one_user(13) - served_at_one_user(9)) / served_at_one_user(1), abs=0.02
    )
    assert cost.time(9) < cost.time(11) < cost.time(13)  # never seen: between its neighbours
    assert np.all(np.diff(cost.times(np.arange(1, 65))) >= 0)
    (tmp_path / "cost.json").write_text(cost.to_json())
    reloaded = ForwardCost.load(tmp_path / "cost.json")
    assert reloaded is not None and reloaded.times(np.arange(1, 40)) == pytest.approx(cost.times(np.arange(1, 40)))


def test_an_idle_server_drafts_long_when_drafts_are_accepted():
    ctl = controller()
    ctl.start("a", "ngram", 8)
    assert settle(ctl, ["a"], acceptance=0.9) == [8]


def test_copies_draft_up_to_the_edge_of_the_cost_staircase():
    """Prompt lookup's drafts miss at once or run on: 40% of first tokens, then 90%. At batch 1
    on the CPU's staircase the best length is the last one of the first block of rows (7 drafts +
    1 = 8 rows); one acceptance rate (~0.7 here) would make the 5th-7th draft tokens look
    worthless."""
    cost = staircase_cost()
    ctl = controller(cost)
    ctl.start("a", "ngram", 8)
    assert settle(ctl, ["a"], acceptance=0.4, then=0.9, rounds=200) == [7]


def test_cost_table_dips_are_smoothed_away():
    cost = ForwardCost([1, 2, 3, 4], [0.017, 0.016, 0.018, 0.017])  # noise in a calibration
    assert [cost.time(r) for r in (1, 2, 3, 4)] == [0.017, 0.017, 0.018, 0.018]


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
            tokens = sum(expected_tokens(acceptance, acceptance, k) for k in lengths)
            return tokens / cost.time(sum(k + 1 for k in lengths))

        best = max(throughput([k] * batch) for k in range(9))
        assert throughput(ks) >= 0.9 * best, (batch, ks)
        assert throughput(ks) >= 0.97 * throughput([0] * batch), (batch, ks)


def settled(batch: int) -> tuple[Controller, list[str], list[int]]:
    """A controller after 100 rounds of `batch` requests whose drafts are half accepted; its
    requests and their last draft lengths."""
    ctl = controller(probe_every=1000)
    keys = [f"r{i}" for i in range(batch)]
    for key in keys:
        ctl.start(key, "ngram", 8)
    return ctl, keys, settle(ctl, keys, acceptance=0.5, rounds=100)


def test_drafts_shrink_with_load():
    chosen = {batch: max(settled(batch)[2]) for batch in (1, 32)}
    assert chosen[1] >= 2 and chosen[32] == 0


def blocks_of_14() -> ForwardCost:
    """A target forward whose matmul takes rows in blocks of 14, and the 15th row
    starts a block (14 rows 14.7 ms, 15 rows 16.8)."""
    rows = list(range(1, 33))
    return ForwardCost(rows, [(10.9 + 0.27 * (r - 1) + 2.1 * ((r - 1) // 14)) / 1e3 for r in rows])


def drafted_with_forwards_of(sequences: int | None, tmp_path) -> int:
    """Draft tokens of the last round of 16 requests at 40% acceptance (then 70%), when the
    target's forwards carry `sequences` of them (None: none observed yet)."""
    cost = blocks_of_14()
    if sequences is not None:
        cost.observe(sequences, cost.time(sequences), sequences=sequences)
        (tmp_path / "cost.json").write_text(cost.to_json())  # as the engine model publishes it
        cost = ForwardCost.load(tmp_path / "cost.json")
    ctl = controller(cost, probe_every=1000)
    keys = [f"r{i}" for i in range(16)]
    for key in keys:
        ctl.start(key, "ngram", 15)
    return sum(settle(ctl, keys, acceptance=0.4, then=0.7, rounds=100))


def test_drafts_are_priced_in_the_forwards_they_join(tmp_path):
    """Under load the requests in flight are out of step: a forward carries the ~12 of 16 that
    are ready. Priced as one forward of all 16 rows, past the block edge, a draft row cost little;
    in the forwards of 12 it joined, it pushed them past the edge (served, chat at 32 users:
    0.95x the baseline's throughput; priced by the share, 1.01x)."""
    assert drafted_with_forwards_of(16, tmp_path) == drafted_with_forwards_of(None, tmp_path) > 0
    assert drafted_with_forwards_of(12, tmp_path) < drafted_with_forwards_of(None, tmp_path)


def test_a_request_without_drafts_probes_now_and_then():
    ctl = controller(probe_every=4)
    ctl.start("a", "ngram", 8)
    settle(ctl, ["a"], acceptance=0.0)
    ctl.recent["ngram"] = Acceptance(first=Rate(30.0, 100.0))  # other requests' prompt lookups do get accepted
    ks = [ctl.choose_k("a", 8) for _ in range(8)]
    assert ks.count(1) == 2 and ks.count(0) == 6


def test_a_draft_model_probe_pays_for_its_draft_forward():
    """A prompt-lookup probe costs a row of the target's forward (1.5 ms), which a proposer
    accepted 10% of the time pays for; a draft model's probe also runs the draft model (4 ms
    more), which 10% does not pay for and 60% does."""
    draft = ForwardCost(list(range(1, 18)), [0.004 + 0.0002 * r for r in range(1, 18)])
    probes = {}
    for proposer, rate in (("ngram", 10.0), ("draft_model", 10.0), ("draft_model", 60.0)):
        ctl = Controller(AdaptiveOptions(probe_every=4), target=cpu_like_cost(), draft=draft)
        ctl.start("a", proposer, 8)
        settle(ctl, ["a"], acceptance=0.0)
        ctl.recent[proposer] = Acceptance(first=Rate(rate, 100.0))
        probes[proposer, rate] = [ctl.choose_k("a", 8) for _ in range(8)].count(1)
    assert probes == {("ngram", 10.0): 2, ("draft_model", 10.0): 0, ("draft_model", 60.0): 2}


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


def test_a_slow_draft_model_drafts_less():
    """A draft model's steps add to the round: the slower they are, the shorter the drafts."""
    chosen = {}
    for step_s in (0.0005, 0.005):
        ctl = controller()
        ctl.draft = ForwardCost(ROWS, [step_s] * len(ROWS))
        ctl.start("a", "draft_model", 8)
        chosen[step_s] = settle(ctl, ["a"], acceptance=0.7, rounds=100)[0]
    assert chosen[0.0005] > chosen[0.005] > 0


def test_a_rounds_overhead_beyond_the_forward_makes_drafts_pay_sooner():
    """Served, a round costs its forward plus the calls and responses around it, whatever its
    draft rows; drafts spread that over more tokens. Eight copying requests on the staircase: one
    more block of rows (9 to 16) does not pay for the forward alone, but does once each round
    also costs 10 ms beyond it."""
    chosen = {}
    for overhead_s in (0.0, 0.010):
        ctl = controller(staircase_cost())
        keys = [f"r{i}" for i in range(8)]
        for key in keys:
            ctl.start(key, "ngram", 8)
        rows = sum(state.k + 1 for state in ctl.requests.values())
        for _ in range(50 * len(keys)):  # every request reports every round
            ctl.observe_round(ctl.target.time(rows) + overhead_s)
        chosen[overhead_s] = sum(settle(ctl, keys, acceptance=0.5, then=0.85, rounds=100))
        assert ctl.overhead_s == pytest.approx(overhead_s, abs=0.002)
    assert chosen[0.0] < chosen[0.010]


def test_a_strong_match_drafts_long_and_a_weak_one_little_under_load():
    """Prompt lookup tells the length of its match before drafting; first tokens after a 1-token
    match are accepted 20% of the time here, after a 4-token match 90% (as on the built-in
    prompts). Eight requests whose matches come at random: counted by match length the drafts
    follow the evidence, and the rounds yield more tokens a second than the same controller
    blind to it."""
    rates = {1: (0.2, 0.7), 4: (0.9, 0.9)}  # evidence -> (first, next) acceptance
    throughput, chosen = {}, {}
    for blind in (True, False):
        ctl = controller(probe_every=1000)
        keys = [f"r{i}" for i in range(8)]
        for key in keys:
            ctl.start(key, "ngram", 8)
        rng = random.Random(0)
        tokens = seconds = 0.0
        by_evidence: dict[int, list[int]] = {1: [], 4: []}
        for _ in range(300):
            evidence = [rng.choice((1, 1, 4)) for _ in keys]
            ks = [ctl.choose_k(key, 8, None if blind else e) for key, e in zip(keys, evidence, strict=True)]
            for key, e, k in zip(keys, evidence, ks, strict=True):
                first, then = rates[e]
                accepted = 0
                while accepted < k and rng.random() < (first if accepted == 0 else then):
                    accepted += 1
                ctl.observe(key, k, accepted)
                by_evidence[e].append(k)
                tokens += accepted + 1
            seconds += ctl.target.time(sum(k + 1 for k in ks))
        throughput[blind] = tokens / seconds
        chosen[blind] = {e: np.mean(ks[-400:]) for e, ks in by_evidence.items()}
    assert chosen[False][4] >= 4 and chosen[False][1] <= 1, chosen
    assert throughput[False] >= 1.05 * throughput[True], throughput


def test_next_tokens_are_counted_by_evidence_too():
    """After a strong match the request's copies ran to the end of their drafts; after a weak one
    only their first tokens were accepted: each evidence gets its own next-token rate, and the
    draft after a weak match stops at its first token."""
    ctl = controller(cpu_like_cost())
    ctl.start("a", "ngram", 8)
    for _ in range(100):
        for evidence, accepted in ((4, 8), (1, 1)):
            ctl.choose_k("a", 8, evidence)  # (the round's evidence, which observe() counts by)
            ctl.observe("a", 8, accepted)
    assert ctl.choose_k("a", 8, evidence=4) == 8 and ctl.rates("a")[1] > 0.9
    assert ctl.choose_k("a", 8, evidence=1) == 1 and ctl.rates("a")[1] < 0.1


def test_nothing_to_draft_is_no_draft():
    ctl = controller()
    ctl.start("a", "ngram", 8)
    settle(ctl, ["a"], acceptance=0.9)
    assert ctl.choose_k("a", 8, evidence=0) == 0
    assert ctl.choose_k("a", 8, evidence=4) == 8


def test_evidence_that_costs_is_asked_for_only_where_its_draft_would_pay():
    """would_draft(): not for a request that may not draft, yes at one request in flight with
    drafts half accepted, no at 32 (where the plan drafts nothing at that rate)."""
    ctl = controller(probe_every=1000)
    ctl.start("off", "ngram", 0)
    assert not ctl.would_draft("off", -1)
    asked = {}
    for batch in (1, 32):
        ctl, keys, _ = settled(batch)
        asked[batch] = ctl.would_draft(keys[0], -1)
    assert asked == {1: True, 32: False}
