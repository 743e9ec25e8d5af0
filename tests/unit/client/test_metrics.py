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
    benchmark_duration,
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
    """genai-perf's definitions, in ms: the latency ends at the last response (11.9), not at the
    stream's close (12.0)."""
    m = request_metrics(SPEC)
    assert m.output_sequence_length == 8
    assert m.time_to_first_token == pytest.approx(500)
    assert m.time_to_second_token == pytest.approx(300)
    assert m.request_latency == pytest.approx(1900)
    assert m.inter_token_latency == pytest.approx((1900 - 500) / 7)
    assert m.output_token_throughput_per_user == pytest.approx(7000 / 1400)
    assert m.inter_chunk_latency == pytest.approx([300, 200, 900])  # gaps between token-carrying responses
    assert (m.draft_tokens, m.accepted_tokens, m.draft_rounds) == (8, 4, 3)
    assert m.drafted_at == [3, 3, 2] and m.accepted_at == [2, 2, 0]


def test_chunks_without_tokens_do_not_count_as_arrivals():
    r = record(0.0, [(0.2, 0, 0, 0, 0), (0.5, 2, 0, 0, 0), (0.9, 0, 0, 0, 0), (1.0, 1, 0, 0, 0)], 1.1)
    m = request_metrics(r)
    assert m.time_to_first_token == pytest.approx(500) and m.inter_chunk_latency == pytest.approx([500])
    assert m.request_latency == pytest.approx(1000)
    assert m.inter_token_latency == pytest.approx((1000 - 500) / 2)


def test_one_response_has_no_second_token_nor_inter_token_latency():
    """Unstreamed: one response with every token; genai-perf gives it neither (both need two responses)."""
    m = request_metrics(record(0.0, [(0.8, 5, 0, 0, 0)], 0.9))
    assert (m.time_to_first_token, m.request_latency) == pytest.approx((800, 800))
    assert m.time_to_second_token is None and m.inter_token_latency is None
    assert m.output_token_throughput_per_user is None
    empty = request_metrics(Record(start=1.0, end=1.5))
    assert empty.request_latency == pytest.approx(500) and empty.time_to_first_token is None


def test_a_response_spanning_several_rounds_is_left_out_of_per_position():
    r = record(0.0, [(1.0, 4, 3, 1, 2), (2.0, 2, 2, 1, 1)], 2.0)
    assert per_position(r) == ([1, 1], [1, 0])


def test_stats_are_genai_perfs():
    s = stats(float(x) for x in range(1, 101))
    assert (s.avg, s.p1, s.p50, s.p90, s.p99, s.count) == pytest.approx((50.5, 1.99, 50.5, 90.1, 99.01, 100))
    assert (s.min, s.max) == (1.0, 100.0) and s.std == pytest.approx(np.std(np.arange(1, 101)))  # population
    assert stats([]) is None


def test_summary_known_answer():
    other = record(11.0, [(11.2, 1, 0, 0, 0), (11.6, 3, 4, 2, 1)], 13.0)
    failed = record(12.0, [], 12.5, error="boom")
    duration = benchmark_duration([SPEC, other, failed])
    assert duration == pytest.approx(11.9 - 10.0)  # the last response - the first sent, of those that succeeded
    s = summarize([SPEC, other, failed], duration, SLO(time_to_first_token=400), [30, 20, 10])
    assert (s.requests, s.errors, s.request_count, s.output_tokens) == (3, 1, 2, 12)
    assert s.output_token_throughput == pytest.approx(12 / 1.9)
    assert s.request_throughput == pytest.approx(2 / 1.9)
    assert s.request_goodput == pytest.approx(1 / 1.9)  # only `other` has TTFT <= 400 ms
    assert s.slo_attainment == pytest.approx(1 / 3)
    assert s.acceptance_rate == pytest.approx(6 / 12)
    assert s.mean_accepted_length == pytest.approx(6 / 4 + 1)
    assert s.drafted_per_position == [4, 4, 3, 1]
    assert s.acceptance_per_position == pytest.approx([3 / 4, 3 / 4, 0, 0])
    assert s.time_to_first_token.p50 == pytest.approx(350) and s.inter_chunk_latency.count == 4
    assert s.input_sequence_length.avg == pytest.approx(25)  # the failed request's prompt is left out
    assert s.inter_token_latency.avg == pytest.approx(((1900 - 500) / 7 + (600 - 200) / 3) / 2)


def test_arm_durations_alone_shared_and_in_blocks():
    sent = [Sent("baseline", 0, 0, "chat", record(0.0, [(1.0, 6, 0, 0, 0)], 5.0)),
            Sent("ngram:3", 0, 0, "chat", record(5.0, [(5.5, 6, 0, 0, 0)], 6.0))]  # fmt: skip
    arms = [BASELINE, Arm("ngram", 3)]
    # open loop, the arms sharing the level: the level's time over the arms
    shared = LevelResult("chat", Load(rate=1.0), 0.0, 12.0, sent, None, {}, {}, None)
    assert [s.output_token_throughput for s in level_summaries(shared, arms, SLO()).values()] == [1.0, 1.0]
    # block mode: each arm's blocks' benchmark_duration
    blocks_ = LevelResult("chat", Load(rate=1.0), 0.0, 12.0, sent, None, {}, {}, None, {"baseline": 8, "ngram:3": 2})
    assert [s.output_token_throughput for s in level_summaries(blocks_, arms, SLO()).values()] == [0.75, 3.0]
    # closed loop, shared: the arm's request time over the C slots
    closed = LevelResult("chat", Load(concurrency=2), 0.0, 12.0, sent, None, {}, {}, None)
    assert [s.benchmark_duration for s in level_summaries(closed, arms, SLO()).values()] == [2.5, 0.5]
    # an arm alone in its level: genai-perf's duration, the last response - the first request sent
    alone = LevelResult("chat", Load(concurrency=2), 0.0, 12.0, sent[:1], None, {}, {}, None)
    assert level_summaries(alone, arms[:1], SLO())["baseline"].benchmark_duration == pytest.approx(1.0)


def test_speedup_compares_mean_request_latencies():
    base = summarize([record(0.0, [(1.0, 2, 0, 0, 0), (4.0, 1, 0, 0, 0)], 4.5)], 4.0)
    fast = summarize([record(0.0, [(1.0, 2, 0, 0, 0), (2.0, 1, 0, 0, 0)], 2.5)], 2.0)
    assert speedup(base, fast) == pytest.approx(2.0)
    assert base.acceptance_rate is None and base.mean_accepted_length is None and base.request_goodput is None


def test_paired_rounds_pair_each_rounds_requests_and_drop_incomplete_rounds():
    def sent(arm: str, number: int, tokens: int, seconds: float, error: str | None = None) -> Sent:
        return Sent(arm, number, number % 3, "chat", record(0.0, [(seconds, tokens, 0, 0, 0)], seconds, error))

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
        requests += [Sent("baseline", n, n % 4, "chat", record(0.0, [(base_s, 8, 0, 0, 0)], base_s)),
                     Sent("ngram:3", n, n % 4, "chat", record(0.0, [(arm_s, 8, 4, 2, 1)], arm_s))]  # fmt: skip
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
