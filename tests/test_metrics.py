"""The benchmark's arithmetic on recorded timestamps, with answers worked out by hand; the
Prometheus parsing, the load loops' bounds and the workloads."""

from __future__ import annotations

import asyncio
import json
import random
import time

import numpy as np
import pytest

from specdec.client.client import Record, within
from specdec.client.loadgen import (
    BASELINE,
    Arm,
    BenchConfig,
    BenchResult,
    LevelResult,
    Load,
    Sent,
    blocks,
    cache_salt,
    closed_loop,
    interleaved,
    level_summaries,
    open_loop,
    paired_rounds,
    parse_arm,
    parse_counts,
    parse_slo,
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
from specdec.client.server_stats import delta, parse_prometheus, process_name, proposer_counters
from specdec.client.workloads import WorkloadOptions, from_jsonl, load_workload, synthetic, with_typos


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


def test_a_request_past_its_deadline_becomes_a_failed_record():
    async def request(seconds):
        await asyncio.sleep(seconds)
        return Record(start=0.0, end=seconds)

    late = asyncio.run(within(request(10.0), 0.05))
    assert late.error == "timeout after 0.05 s" and late.end - late.start < 5
    assert asyncio.run(within(request(0.0), 5)).error is None


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


def test_slo_parsing_in_milliseconds():
    slo = parse_slo(["ttft:500", "tpot:50", "e2el:10000"])
    assert (slo.ttft, slo.tpot, slo.e2e) == pytest.approx((0.5, 0.05, 10.0))
    with pytest.raises(ValueError, match="goodput"):
        parse_slo(["latency:5"])


def test_arms_and_levels_parse():
    assert parse_arm("baseline") == BASELINE
    assert parse_arm("ngram:5") == Arm("ngram", 5) and parse_arm("ngram:5").name == "ngram:5"
    assert parse_arm("draft_model") == Arm("draft_model", None)
    aa = parse_arm("ngram:0")  # the proposer's path, drafting off: an A/A arm, not the baseline
    assert aa == Arm("ngram", 0) and aa.name == "ngram:0" and not aa.is_baseline
    for bad in ("magic", "ngram:-1", "ngram:x"):
        with pytest.raises(ValueError):
            parse_arm(bad)
    assert parse_counts("1,4") == [1, 4] and parse_counts("1..16") == [1, 2, 4, 8, 16]
    with pytest.raises(ValueError):
        parse_counts("0,2")


def test_interleaving_gives_every_request_number_to_every_arm_in_rotating_order():
    jobs = list(interleaved(num_arms=3, per_arm=4))
    assert jobs[:6] == [(0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (1, 0)]
    for arm in range(3):
        assert [n for n, a in jobs if a == arm] == [0, 1, 2, 3]


def test_blocks_give_each_arm_the_same_request_numbers_in_rotating_order():
    assert list(blocks(num_arms=2, per_arm=5, block_size=2)) == [
        [(0, 0), (1, 0)], [(0, 1), (1, 1)],  # round 0: arm 0 first
        [(2, 1), (3, 1)], [(2, 0), (3, 0)],  # round 1: arm 1 first
        [(4, 0)], [(4, 1)],
    ]  # fmt: skip


def test_cache_salts_keep_arms_and_passes_over_the_prompts_apart():
    ngram = parse_arm("ngram:5")
    salts = {cache_salt("grounded c=1", arm, n, num_prompts=3) for arm in (BASELINE, ngram) for n in range(6)}
    assert len(salts) == 4  # two arms x two passes
    assert cache_salt("grounded c=1", ngram, 0, 3) == cache_salt("grounded c=1", ngram, 2, 3)
    assert cache_salt("grounded c=1", ngram, 0, 3) != cache_salt("grounded c=2", ngram, 0, 3)


def test_baseline_params_turn_speculation_off():
    from specdec.client.workloads import Prompt

    params = BASELINE.params(Prompt("hi", "chat", 8, ignore_eos=True), None, None, None, "salt")
    assert (params.num_draft_tokens, params.draft_method, params.end_id) == (0, "none", -1)
    assert params.tensors()["cache_salt"] == "salt"


# --- the load loops: bounded in count, concurrency and time ---------------------------------------
def test_closed_loop_keeps_concurrency_and_count():
    in_flight, peak, done = 0, 0, []

    async def send(job):
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        done.append(job)

    asyncio.run(closed_loop(interleaved(2, 6), send, concurrency=3, deadline=time.monotonic() + 60))
    assert peak == 3 and len(done) == 12


def test_loops_stop_issuing_at_the_deadline():
    done = []

    async def send(job):
        await asyncio.sleep(0.05)
        done.append(job)

    start = time.monotonic()
    asyncio.run(closed_loop(interleaved(2, 10_000), send, concurrency=2, deadline=start + 0.3))
    assert time.monotonic() - start < 1.0 and 8 <= len(done) <= 16
    done.clear()
    start = time.monotonic()
    asyncio.run(open_loop(interleaved(2, 10_000), send, rate=50.0, deadline=start + 0.5, rng=random.Random(0)))
    assert time.monotonic() - start < 1.5 and 10 <= len(done) <= 50  # about 25 arrivals in 0.5 s


def test_open_loop_does_not_wait_for_answers():
    starts = []

    async def send(job):
        starts.append(time.monotonic())
        await asyncio.sleep(1.0)

    t0 = time.monotonic()
    asyncio.run(open_loop(interleaved(1, 20), send, rate=100.0, deadline=t0 + 30, rng=random.Random(1)))
    assert len(starts) == 20 and starts[-1] - t0 < 0.9  # all sent before the first one answered


# --- server counters and processes ----------------------------------------------------------------
METRICS = """# HELP specdec_draft_tokens_total Draft tokens proposed
# TYPE specdec_draft_tokens_total counter
specdec_draft_tokens_total{model="spec_decode",proposer="ngram"} 30
specdec_accepted_tokens_total{model="spec_decode",proposer="ngram"} 12
specdec_drafts_total{model="spec_decode",proposer="ngram"} 7
specdec_accepted_tokens_per_position_total{model="spec_decode",position="1",proposer="ngram"} 6
specdec_accepted_tokens_per_position_total{model="spec_decode",position="2",proposer="ngram"} 4
specdec_draft_tokens_per_position_total{model="spec_decode",position="1",proposer="ngram"} 7
specdec_draft_tokens_per_position_total{model="spec_decode",position="2",proposer="ngram"} 7
specdec_requests_total{model="spec_decode",proposer="ngram",reason="length"} 2
specdec_requests_total{model="spec_decode",proposer="ngram",reason="eos"} 1
specdec_output_tokens_total{model="spec_decode",proposer="none"} 50
nv_gpu_memory_used_bytes{gpu_uuid="GPU-1"} 1e9
"""


def test_prometheus_counters_parse_and_difference():
    after = parse_prometheus(METRICS)
    before = parse_prometheus(METRICS.replace("} 30", "} 10").replace('reason="eos"} 1', 'reason="eos"} 0'))
    c = proposer_counters(delta(before, after), "ngram")
    assert (c.draft_tokens, c.accepted_tokens, c.drafts, c.requests) == (20, 0, 0, 1)
    full = proposer_counters(after, "ngram")
    assert full.requests == 3 and full.accepted_per_position == [6, 4] and full.drafted_per_position == [7, 7]
    assert proposer_counters(after, "none").output_tokens == 50


def test_server_processes_are_named_by_model():
    stub = ["/x/triton_python_backend_stub", "/repo/model_repository/draft/1/model.py", "shm", "1"]
    assert process_name(stub) == "draft"
    assert process_name(["/opt/tritonserver/bin/tritonserver", "--model-repository=/r"]) == "tritonserver"


# --- workloads ------------------------------------------------------------------------------------
class WordTokenizer:
    def encode(self, text: str) -> list[int]:
        return [len(w) for w in text.split()]

    def decode(self, ids: list[int]) -> str:
        return " ".join("w" * i for i in ids)


def test_builtin_workloads():
    grounded = load_workload("grounded", WorkloadOptions(max_tokens=32))
    assert {p.kind for p in grounded[:4]} == {"summarise", "edit", "qa", "code"}
    assert all(p.max_tokens == 32 and p.apply_chat_template for p in grounded)
    chat = load_workload("chat", WorkloadOptions())
    assert {p.kind for p in chat} == {"chat"}
    mixed = load_workload("mixed", WorkloadOptions())
    assert len(mixed) == len(grounded) + len(chat) and mixed[1].kind == "chat"
    with pytest.raises(ValueError, match="unknown workload"):
        load_workload("nonsense", WorkloadOptions())


def test_synthetic_prompts_have_the_asked_length_and_ignore_the_end_token():
    prompts = synthetic(WorkloadOptions(max_tokens=16, synthetic_input_tokens=40), WordTokenizer(), count=5)
    assert all(len(WordTokenizer().encode(p.text)) == 40 for p in prompts)
    assert all(p.ignore_eos and not p.apply_chat_template and p.max_tokens == 16 for p in prompts)


def test_jsonl_in_genai_perf_format(tmp_path):
    path = tmp_path / "prompts.jsonl"
    lines = [{"text": "Hello"}, {"text_input": "Bye", "max_tokens": 5, "kind": "qa"}]
    path.write_text(json.dumps(lines[0]) + "\n\n" + json.dumps(lines[1]) + "\n")
    prompts = from_jsonl(path, max_tokens=64)
    assert [(p.text, p.max_tokens, p.kind) for p in prompts] == [("Hello", 64, "file"), ("Bye", 5, "qa")]
    path.write_text('{"nope": 1}\n')
    with pytest.raises(ValueError, match=":1: expected"):
        load_workload(str(path), WorkloadOptions())


def test_typos_are_planted_deterministically():
    text = "alpha bravo charlie delta echoes foxtrot golfer hotel"
    assert with_typos(text) == with_typos(text) != text
