"""The load generator: its arms, levels and orders, and its loops, bounded in count, concurrency and time."""

from __future__ import annotations

import asyncio
import json
import random
import time

import pytest

from specdec.client.client import Record, within
from specdec.client.loadgen import (
    BASELINE,
    Arm,
    BenchConfig,
    Load,
    LoadGenerator,
    blocks,
    cache_salt,
    closed_loop,
    failure_reason,
    interleaved,
    level_summaries,
    open_loop,
    parse_arm,
    parse_counts,
    parse_slo,
    pause,
)


def test_a_request_past_its_deadline_becomes_a_failed_record():
    async def request(seconds):
        await asyncio.sleep(seconds)
        return Record(start=0.0, end=seconds)

    late = asyncio.run(within(request(10.0), 0.05))
    assert late.error == "timeout after 0.05 s" and late.end - late.start < 5
    assert asyncio.run(within(request(0.0), 5)).error is None


def test_slo_parsing_in_milliseconds_by_vllms_names_or_genai_perfs():
    slo = parse_slo(["ttft:500", "tpot:50", "e2el:10000"])
    assert (slo.time_to_first_token, slo.inter_token_latency, slo.request_latency) == (500, 50, 10000)
    assert parse_slo(["time_to_first_token:500", "inter_token_latency:50", "request_latency:10000"]) == slo
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


# --- faults: every failed request counted with its reason, the run going on -------------------------
def test_each_transport_error_has_a_reason_to_count_by():
    import aiohttp
    import grpc
    from tritonclient.utils import InferenceServerException

    unavailable = grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                       details="Socket closed")  # fmt: skip
    cases = {
        unavailable: "gRPC UNAVAILABLE",
        InferenceServerException("failed to connect", status="StatusCode.UNAVAILABLE"): "gRPC UNAVAILABLE",
        InferenceServerException("Stub process is not healthy"): "server error",
        TimeoutError(): "timeout",
        asyncio.TimeoutError(): "timeout",
        aiohttp.ServerDisconnectedError(): "connection lost",
        aiohttp.ClientPayloadError("cut"): "response cut off",
        json.JSONDecodeError("Expecting value", "data: {", 6): "response cut off",
        ConnectionRefusedError(111, "refused"): "cannot connect",
        ConnectionResetError(104, "reset"): "connection lost",
        OSError(113, "No route to host"): "OSError",
        KeyError("text_output"): "unexpected KeyError",
    }
    assert {failure_reason(err): want for err, want in cases.items()} == {want: want for want in cases.values()}
    assert [pause(n) for n in (1, 2, 3, 5, 6, 50)] == [0.25, 0.5, 1.0, 4.0, 4.0, 4.0]


def _answer(start: float, tokens: int) -> Record:
    record = Record(start=start)
    for n in range(1, tokens + 1):
        record.chunks.append((time.perf_counter(), "x"))
        record.take_totals({"num_output_tokens": n}.get)
    record.end = time.perf_counter()
    return record


class _FlakySender:
    """Answers, but for the requests numbered in `faults`, which raise (or answer with) theirs."""

    def __init__(self, faults: dict[int, BaseException | str]):
        self.faults = faults
        self.count = 0
        self.closed = False

    async def __call__(self, prompt, params) -> Record:
        n, self.count = self.count, self.count + 1
        fault = self.faults.get(n)
        if isinstance(fault, BaseException):
            raise fault
        if fault == "hang":
            await asyncio.sleep(60)
        record = _answer(time.perf_counter(), 3)
        record.error = fault  # a string: the server answered with an error
        return record

    async def close(self) -> None:
        self.closed = True


def test_a_run_counts_its_failures_by_reason_and_goes_on(monkeypatch, tmp_path):
    import grpc

    from specdec.client import loadgen
    from specdec.client.report import write_report
    from specdec.client.workloads import Prompt

    monkeypatch.setattr(loadgen, "PAUSE_FIRST", 0.001)
    unavailable = grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                       details="failed to connect to all addresses")  # fmt: skip
    # request 0 is the warm-up's; then a server gone for three requests, one that never ends,
    # one the server refuses, and one unforeseen error
    faults = {3: unavailable, 4: unavailable, 5: ConnectionResetError(104, "reset"), 7: "hang",
              9: "overloaded: 2 requests in flight", 11: KeyError("text_output")}  # fmt: skip
    sender = _FlakySender(faults)
    config = BenchConfig(arms=(BASELINE,), loads=(Load(concurrency=2),), workloads=("chat",), num_requests=14,
                         warmup=1, request_timeout=0.3)  # fmt: skip
    prompts = {"chat": [Prompt("hi", "chat", 3), Prompt("hello", "chat", 3)]}
    result = asyncio.run(LoadGenerator(config, prompts, "nowhere:1", input_lengths={"chat": [1, 2]},
                                       sender=sender).run())  # fmt: skip
    assert sender.closed
    (level,) = result.levels
    assert len(level.requests) == 14
    assert result.failures == {"gRPC UNAVAILABLE": 2, "connection lost": 1, "timeout": 1, "server error": 1,
                               "unexpected KeyError": 1}  # fmt: skip
    failed = {s.failure: s.record.error for s in level.requests if s.failure}
    assert failed["gRPC UNAVAILABLE"] == "AioRpcError: failed to connect to all addresses"
    assert failed["timeout"] == "timeout after 0.3 s" and failed["server error"].startswith("overloaded")
    summary = level_summaries(level, config.arms, config.slo)["baseline"]
    assert (summary.requests, summary.errors, summary.request_count, summary.output_tokens) == (14, 6, 8, 24)
    lengths = [s.input_tokens for s in level.requests if not s.failure]
    assert summary.input_sequence_length.avg == pytest.approx(sum(lengths) / 8) and set(lengths) == {1, 2}

    machine = {"cpu": "test", "logical_cores": 2, "memory_gib": 4}
    paths = write_report(result, tmp_path, machine, plots=False)
    report = json.loads(paths["json"].read_text())
    assert report["failures"] == {"requests": 14, "failed": 6, "by_reason": dict(result.failures.most_common())}
    assert next(iter(report["failures"]["by_reason"])) == "gRPC UNAVAILABLE"  # the most frequent first
    assert report["levels"][0]["summary"]["baseline"]["failures"]["gRPC UNAVAILABLE"] == 2
    reasons = [r["reason"] for r in report["levels"][0]["requests"]]
    assert reasons.count(None) == 8 and reasons.count("timeout") == 1
    text = paths["markdown"].read_text()
    assert "**6 of 14 requests failed** (gRPC UNAVAILABLE 2, connection lost 1, timeout 1, server error 1, " in text
    assert "| chat | c=2 | baseline | gRPC UNAVAILABLE | 2 | AioRpcError: failed to connect to all addresses |" in text
    assert "| chat | c=2 | baseline | 14 (6) |" in text


def test_the_grpc_sender_takes_a_new_channel_after_a_failure_and_closes_the_old_when_idle():
    from specdec.client.loadgen import GrpcSender
    from specdec.client.workloads import Prompt

    made = []

    class FakeClient:
        def __init__(self, url):
            self.closed, self.fail, self.gate = False, False, asyncio.Event()
            made.append(self)

        async def generate(self, text, params, stream):
            await self.gate.wait()
            if self.fail:
                raise ConnectionResetError(104, "reset")
            return _answer(time.perf_counter(), 1)

        async def close(self):
            self.closed = True

    async def main():
        sender = GrpcSender("somewhere:1", True, connect=FakeClient)
        first = sender.client
        prompt = Prompt("hi", "chat", 1)
        # two requests in flight on the first channel; one fails: the next request gets a new channel
        a = asyncio.create_task(sender(prompt, None))
        b = asyncio.create_task(sender(prompt, None))
        await asyncio.sleep(0)
        first.fail = True
        first.gate.set()
        results = await asyncio.gather(a, b, return_exceptions=True)
        assert all(isinstance(r, ConnectionResetError) for r in results)
        assert sender.client is not first and first.closed  # both its requests have ended
        sender.client.gate.set()
        assert (await sender(prompt, None)).error is None
        assert len(made) == 2  # one failure, one new channel, however many requests saw it
        await sender.close()
        assert sender.client.closed

    asyncio.run(main())
