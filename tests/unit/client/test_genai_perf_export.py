"""The genai-perf exports, from requests of known timings: every metric's value by genai-perf's
definitions, and the files' layouts to the byte (genai-perf's export_data/ at r25.12)."""

from __future__ import annotations

import json

import pytest

from specdec.client.client import Record
from specdec.client.loadgen import Arm, BenchConfig, BenchResult, LevelResult, Load, Sent
from specdec.client.metrics import SLO
from specdec.client.report import genai_perf_folder, rows, write_genai_perf

STATS = ["avg", "p1", "p5", "p10", "p25", "p50", "p75", "p90", "p95", "p99", "min", "max", "std"]


def answered(start: float, responses: list[tuple[float, int]], end: float) -> Record:
    """A Record sent at `start` whose responses arrived at the given times with that many tokens."""
    r = Record(start=start, end=end)
    total = 0
    for t, tokens in responses:
        total += tokens
        r.chunks.append((t, "x" * tokens))
        r.take_totals({"num_output_tokens": total}.get)
    return r


def result(records: list[Record], lengths: list[int], stream: bool, slo: SLO) -> BenchResult:
    arm = Arm("ngram", 4)
    config = BenchConfig(arms=(arm,), loads=(Load(concurrency=2),), workloads=("chat",), stream=stream, slo=slo,
                         interleave="request")  # fmt: skip
    pairs = enumerate(zip(records, lengths, strict=True))
    sent = [Sent(arm.name, n, n, "chat", r, input_tokens=k) for n, (r, k) in pairs]
    level = LevelResult("chat", Load(concurrency=2), 0.0, 10.0, sent, None, {}, {}, None)
    return BenchResult(config, {"chat": []}, [level], {"url": "127.0.0.1:8001"}, 0.0)


# genai-perf's own worked example (its LLM parser run on these timestamps): request A sent at
# 1.00 s, responses at 1.10, 1.12, 1.15 s bringing 1, 2 and 1 tokens; request B sent at 1.05 s,
# one response at 1.30 s with 3 tokens; the streams close 10 ms after their last responses.
STREAMED = [answered(1.00, [(1.10, 1), (1.12, 2), (1.15, 1)], 1.16), answered(1.05, [(1.30, 3)], 1.31)]


def percentiles(low: float, high: float) -> dict[str, float]:
    """numpy's linear percentiles of two values."""
    return {f"p{p}": low + (high - low) * p / 100 for p in (1, 5, 10, 25, 50, 75, 90, 95, 99)}


def two(low: float, high: float) -> dict[str, float]:
    return {"avg": (low + high) / 2, **percentiles(low, high), "min": low, "max": high, "std": (high - low) / 2}


def one(value: float) -> dict[str, float]:
    return {"avg": value, **{f"p{p}": value for p in (1, 5, 10, 25, 50, 75, 90, 95, 99)}, "min": value,
            "max": value, "std": 0.0}  # fmt: skip


def test_every_metric_by_genai_perfs_definitions(tmp_path):
    run = result(STREAMED, [5, 7], stream=True, slo=SLO(request_latency=200))
    (json_path, csv_path) = write_genai_perf(run, rows(run), tmp_path)
    assert json_path == tmp_path / "chat" / "concurrency2" / "ngram-4" / "profile_export_genai_perf.json"
    assert csv_path == json_path.with_suffix(".csv")
    export = json.loads(json_path.read_text())
    assert list(export) == ["request_throughput", "request_latency", "request_goodput", "request_count",
                            "time_to_first_token", "time_to_second_token", "inter_token_latency",
                            "output_token_throughput", "output_token_throughput_per_user", "output_sequence_length",
                            "input_sequence_length", "input_config"]  # fmt: skip
    duration = 1.30 - 1.00  # benchmark_duration: the last response of any request - the first sent
    expected = {
        "request_throughput": ("requests/sec", {"avg": 2 / duration}),
        "request_latency": ("ms", two(150, 250)),  # last response - sent: 1.15 - 1.00, 1.30 - 1.05
        "request_goodput": ("requests/sec", {"avg": 1 / duration}),  # A alone is within 200 ms
        "request_count": ("count", {"avg": 2.0}),
        "time_to_first_token": ("ms", two(100, 250)),
        "time_to_second_token": ("ms", one(20)),  # A's 1.12 - 1.10; B has one response
        "inter_token_latency": ("ms", one((150 - 100) / (4 - 1))),  # A's; B has one response
        "output_token_throughput": ("tokens/sec", {"avg": 7 / duration}),
        "output_token_throughput_per_user": ("tokens/sec/user", one(3 / 0.050)),
        "output_sequence_length": ("tokens", two(3, 4)),
        "input_sequence_length": ("tokens", two(5, 7)),
    }
    for name, (unit, values) in expected.items():
        stats = export[name]
        assert list(stats) == ["unit", *values], name  # the unit, then genai-perf's statistics in its order
        assert list(values) in (["avg"], STATS), name
        assert stats["unit"] == unit, name
        assert {k: stats[k] for k in values} == pytest.approx(values), name
    config = export["input_config"]
    assert (config["workload"], config["arm"], config["stimulus"]) == ("chat", "ngram:4", {"concurrency": 2})
    assert config["bench"]["stream"] is True and config["bench"]["slo"]["request_latency"] == 200

    assert csv_path.read_bytes().decode() == "\r\n".join([
        "Metric,avg,min,max,p99,p95,p90,p75,p50,p25,p10,p5,p1",
        "Time To First Token (ms),175.00,100.00,250.00,248.50,242.50,235.00,212.50,175.00,137.50,115.00,107.50,101.50",
        "Time To Second Token (ms)," + ",".join(["20.00"] * 12),
        "Request Latency (ms),200.00,150.00,250.00,249.00,245.00,240.00,225.00,200.00,175.00,160.00,155.00,151.00",
        "Inter Token Latency (ms)," + ",".join(["16.67"] * 12),
        "Output Token Throughput Per User (tokens/sec/user)," + ",".join(["60.00"] * 12),
        "Output Sequence Length (tokens),3.50,3.00,4.00,3.99,3.95,3.90,3.75,3.50,3.25,3.10,3.05,3.01",
        "Input Sequence Length (tokens),6.00,5.00,7.00,6.98,6.90,6.80,6.50,6.00,5.50,5.20,5.10,5.02",
        "",
        "Metric,Value",
        "Output Token Throughput (tokens/sec),23.33",
        "Request Throughput (per sec),6.67",
        "Request Goodput (per sec),3.33",
        "Request Count (count),2.00",
        "",
    ])  # fmt: skip


def test_unstreamed_the_streaming_rows_go_and_large_numbers_get_thousands_separators(tmp_path):
    """One response a request: no second token, no inter-token latency (the JSON leaves out a
    metric without data), the CSV leaves out the streaming rows; a failed request counts nowhere
    but in the report's failures; no SLO, no goodput; no tokenizer, "N/A"."""
    records = [answered(0.0, [(0.5, 1500)], 0.5), answered(0.25, [(1.0, 1500)], 1.0),
               Record(start=0.3, end=2.0, error="timeout after 1.7 s")]  # fmt: skip
    run = result(records, [None, None, None], stream=False, slo=SLO())
    json_path, csv_path = write_genai_perf(run, rows(run), tmp_path)
    export = json.loads(json_path.read_text())
    assert list(export) == ["request_throughput", "request_latency", "request_count", "time_to_first_token",
                            "output_token_throughput", "output_sequence_length", "input_config"]  # fmt: skip
    assert export["output_token_throughput"]["avg"] == pytest.approx(3000 / 1.0)  # the failed one has no response
    assert csv_path.read_bytes().decode() == "\r\n".join([
        "Metric,avg,min,max,p99,p95,p90,p75,p50,p25,p10,p5,p1",
        "Request Latency (ms),625.00,500.00,750.00,747.50,737.50,725.00,687.50,625.00,562.50,525.00,512.50,502.50",
        'Output Sequence Length (tokens),"1,500.00","1,500.00","1,500.00","1,500.00","1,500.00","1,500.00",'
        '"1,500.00","1,500.00","1,500.00","1,500.00","1,500.00","1,500.00"',
        "Input Sequence Length (tokens)," + ",".join(["N/A"] * 12),
        "",
        "Metric,Value",
        'Output Token Throughput (tokens/sec),"3,000.00"',
        "Request Throughput (per sec),2.00",
        "Request Count (count),2.00",
        "",
    ])  # fmt: skip


def test_export_folders_name_the_level_as_genai_perf_names_its_stimulus():
    assert str(genai_perf_folder("grounded", Load(concurrency=8), "baseline")) == "grounded/concurrency8/baseline"
    assert str(genai_perf_folder("a/b/prompts.jsonl", Load(rate=0.5), "draft_model:3")) == (
        "prompts/request_rate0.5/draft_model-3"
    )
