"""The benchmark's arithmetic on recorded timestamps, with answers worked out by hand."""

from __future__ import annotations

import random

import numpy as np
import pytest

from specdec.client.client import Record
from specdec.client.loadgen import (
    BASELINE,
    Arm,
    BenchConfig,
    BenchResult,
    LevelResult,
    Load,
    Sent,
    level_summaries,
    paired_rounds,
)
from specdec.client.metrics import (
    SLO,
    busy_seconds,
    per_position,
    ratio_interval,
    request_metrics,
    speedup,
    stats,
    summarize,
)
from specdec.client.report import csv_row, rows


def record(start: float, chunks: list[tuple[float, int, int, int, int]], end: float, error: str | None = None):
    """A Record from (arrival, tokens in the chunk, drafted, accepted, drafted rounds) per chunk."""
    r = Record(start=start, end=end, error=error)
    out = draft = acc = rounds = 0
    for t, n, d, a, k in chunks:
        out, draft, acc, rounds = out + n, draft + d, acc + a, rounds + k
        r.chunks.append((t, "x" * n))
        r.take_totals({"num_output_tokens": out, "total_draft_tokens": draft,
                       "total_accepted_draft_tokens": acc, "total_draft_rounds": rounds}.get)  # fmt: skip
    return r


# Sent at 10.0; chunks: 1 token at 10.5 (prefill, no draft), then rounds drafting 3 (2 accepted:
# 3 tokens), 3 (0 accepted: 1 token), 2 (2 accepted: 3 tokens); the stream ends at 12.0.
SPEC = record(10.0, [(10.5, 1, 0, 0, 0), (10.8, 3, 3, 2, 1), (11.0, 1, 3, 0, 1), (11.9, 3, 2, 2, 1)], 12.0)


def test_request_metrics_known_answer():
    m = request_metrics(SPEC)
    assert m.output_tokens == 8
    assert m.ttft == pytest.approx(0.5)
    assert m.e2e == pytest.approx(2.0)
    assert m.tpot == pytest.approx((2.0 - 0.5) / 7)
    assert m.itl == pytest.approx([0.3, 0.2, 0.9])  # gaps between token-carrying chunks
    assert (m.draft_tokens, m.accepted_tokens, m.draft_rounds) == (8, 4, 3)
    assert m.drafted_at == [3, 3, 2] and m.accepted_at == [2, 2, 0]


def test_chunks_without_tokens_do_not_count_as_arrivals():
    r = record(0.0, [(0.2, 0, 0, 0, 0), (0.5, 2, 0, 0, 0), (0.9, 0, 0, 0, 0), (1.0, 1, 0, 0, 0)], 1.1)
    m = request_metrics(r)
    assert m.ttft == pytest.approx(0.5) and m.itl == pytest.approx([0.5])
    assert m.tpot == pytest.approx((1.1 - 0.5) / 2)


def test_a_response_spanning_several_rounds_is_left_out_of_per_position():
    r = record(0.0, [(1.0, 4, 3, 1, 2), (2.0, 2, 2, 1, 1)], 2.0)
    assert per_position(r) == ([1, 1], [1, 0])


def test_stats_percentiles():
    s = stats(float(x) for x in range(1, 101))
    assert (s.mean, s.p50, s.p90, s.p99, s.count) == pytest.approx((50.5, 50.5, 90.1, 99.01, 100))
    assert stats([]) is None


def test_summary_closed_loop_known_answer():
    other = record(11.0, [(11.2, 1, 0, 0, 0), (11.6, 3, 4, 2, 1)], 13.0)
    failed = record(12.0, [], 12.5, error="boom")
    busy = busy_seconds([2.0, 2.0, 0.5], concurrency=2, wall_seconds=99.0)
    assert busy == pytest.approx(2.25)  # Little's law: 4.5 s of requests over 2 slots
    s = summarize([SPEC, other, failed], busy, SLO(ttft=0.4))
    assert (s.requests, s.errors, s.output_tokens) == (3, 1, 12)
    assert s.output_throughput == pytest.approx(12 / 2.25)
    assert s.request_throughput == pytest.approx(2 / 2.25)
    assert s.goodput == pytest.approx(1 / 2.25)  # only `other` has TTFT <= 0.4 s
    assert s.slo_attainment == pytest.approx(1 / 3)
    assert s.acceptance_rate == pytest.approx(6 / 12)
    assert s.mean_accepted_length == pytest.approx(6 / 4 + 1)
    assert s.drafted_per_position == [4, 4, 3, 1]
    assert s.acceptance_per_position == pytest.approx([3 / 4, 3 / 4, 0, 0])
    assert s.ttft.p50 == pytest.approx(0.35) and s.itl.count == 4


def test_open_loop_throughput_divides_by_the_arms_wall_time():
    sent = [Sent("baseline", 0, 0, "chat", record(0.0, [(1.0, 6, 0, 0, 0)], 5.0)),
            Sent("ngram:3", 0, 0, "chat", record(5.0, [(5.5, 6, 0, 0, 0)], 6.0))]  # fmt: skip
    shared = LevelResult("chat", Load(rate=1.0), 0.0, 12.0, sent, None, {}, {}, None)
    arms = [BASELINE, Arm("ngram", 3)]
    assert [s.output_throughput for s in level_summaries(shared, arms, SLO()).values()] == [1.0, 1.0]
    blocks_ = LevelResult("chat", Load(rate=1.0), 0.0, 12.0, sent, None, {}, {}, None, {"baseline": 8, "ngram:3": 2})
    assert [s.output_throughput for s in level_summaries(blocks_, arms, SLO()).values()] == [0.75, 3.0]


def test_speedup_compares_mean_end_to_end_times():
    base = summarize([record(0.0, [(1.0, 2, 0, 0, 0)], 4.0)], 4.0)
    fast = summarize([record(0.0, [(1.0, 2, 0, 0, 0)], 2.0)], 2.0)
    assert speedup(base, fast) == pytest.approx(2.0)
    assert base.acceptance_rate is None and base.mean_accepted_length is None and base.goodput is None


def test_paired_rounds_pair_each_rounds_requests_and_drop_incomplete_rounds():
    def sent(arm: str, number: int, tokens: int, seconds: float, error: str | None = None) -> Sent:
        return Sent(arm, number, number % 3, "chat", record(0.0, [(0.1, tokens, 0, 0, 0)], seconds, error))

    requests = [sent("baseline", 0, 10, 2.0), sent("ngram:3", 0, 10, 1.0), sent("baseline", 1, 5, 1.0),
                sent("ngram:3", 1, 5, 0.5), sent("ngram:0", 1, 5, 9.0),  # another arm: not in the pairs
                sent("baseline", 2, 8, 1.0), sent("ngram:3", 2, 8, 1.0, error="timeout"),  # round 1: an error
                sent("baseline", 4, 7, 1.5)]  # round 2: the arm never ran it  # fmt: skip
    level = LevelResult("chat", Load(concurrency=2), 0.0, 10.0, requests, None, {}, {}, None)
    arm, base = paired_rounds(level, "ngram:3", "baseline", round_size=2)
    assert (arm, base) == ([(15, 1.5)], [(15, 3.0)])  # round 0 only: requests 0 and 1 of each arm


def test_ratio_interval_holds_an_exact_ratio_and_widens_with_noise():
    base = [(100.0, 4.0 + i % 3) for i in range(10)]
    exact = [(2 * tokens, seconds) for tokens, seconds in base]  # every round twice the throughput
    assert ratio_interval(exact, base) == pytest.approx((2.0, 2.0))
    assert ratio_interval(exact[:7], base[:7]) is None  # too few rounds to say
    with pytest.raises(ValueError, match="units"):
        ratio_interval(exact, base[:9])
    rng = random.Random(3)
    noisy = [(tokens, seconds * rng.uniform(0.8, 1.2)) for tokens, seconds in base]
    low, high = ratio_interval(noisy, base)
    point = (sum(t for t, _ in noisy) / sum(s for _, s in noisy)) / (sum(t for t, _ in base) / sum(s for _, s in base))
    assert low < point < high and 0.01 < high - low < 0.5


def test_the_reports_speedup_carries_its_interval_over_the_levels_rounds():
    """Closed loop at C = 1, rounds of 2 requests a arm: 8 rounds, in which the arm's requests take
    half the baseline's time but for one slow round."""
    requests = []
    for n in range(16):
        base_s = 2.0 + n % 3
        arm_s = base_s / 2 if n // 2 != 5 else base_s
        requests += [Sent("baseline", n, n % 4, "chat", record(0.0, [(0.1, 8, 0, 0, 0)], base_s)),
                     Sent("ngram:3", n, n % 4, "chat", record(0.0, [(0.1, 8, 4, 2, 1)], arm_s))]  # fmt: skip
    config = BenchConfig(arms=(BASELINE, Arm("ngram", 3)), loads=(Load(concurrency=1),), workloads=("chat",))
    level = LevelResult("chat", Load(concurrency=1), 0.0, 60.0, requests, None, {}, {}, None)
    base_row, arm_row = rows(BenchResult(config, {"chat": []}, [level], {}, 0.0))
    assert base_row.speedup is None and base_row.speedup_interval is None and base_row.speedup_text == "-"
    low, high = arm_row.speedup_interval
    assert 1.0 < low < arm_row.speedup < high <= 2.0
    assert arm_row.speedup_text == f"{arm_row.speedup:.2f}x ({low:.2f}-{high:.2f})"
    assert csv_row(arm_row)["speedup_low"] == low


def test_ratio_interval_covers_the_true_ratio_about_as_often_as_it_claims():
    """Experiments of 26 rounds whose arm is truly 2.5x the baseline, each round's time scaled by
    a speed of the machine that both halves share and by noise of each half's own: the 95%
    interval should hold 2.5 in about 95% of them (a percentile bootstrap over 26 units runs a
    little under; 200 experiments put the count within +-4 points of its rate with 95% odds).
    Resampling the two arms apart, which loses what a round shares, holds it in all 200: too wide."""
    rng = np.random.default_rng(7)
    held = 0
    for _ in range(200):
        tokens = rng.integers(40, 129, size=26).astype(float)
        speed = rng.lognormal(0.0, 0.3, size=26)  # a round's machine speed, shared by its two halves
        base_s = tokens * 0.05 * speed * rng.lognormal(0.0, 0.15, size=26)
        arm_s = tokens * 0.02 * speed * rng.lognormal(0.0, 0.15, size=26)
        low, high = ratio_interval(list(zip(tokens, arm_s, strict=True)), list(zip(tokens, base_s, strict=True)),
                                   resamples=1000)  # fmt: skip
        held += low <= 2.5 <= high
    assert 0.86 <= held / 200 <= 0.99
