"""The load generator: its arms, levels and orders, and its loops, bounded in count, concurrency and time."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from specdec.client.client import Record, within
from specdec.client.loadgen import (
    BASELINE,
    Arm,
    blocks,
    cache_salt,
    closed_loop,
    interleaved,
    open_loop,
    parse_arm,
    parse_counts,
    parse_slo,
)


def test_a_request_past_its_deadline_becomes_a_failed_record():
    async def request(seconds):
        await asyncio.sleep(seconds)
        return Record(start=0.0, end=seconds)

    late = asyncio.run(within(request(10.0), 0.05))
    assert late.error == "timeout after 0.05 s" and late.end - late.start < 5
    assert asyncio.run(within(request(0.0), 5)).error is None


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
