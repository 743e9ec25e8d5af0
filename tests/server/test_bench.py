"""A short real sweep through `specdec bench` against the real server: a valid report whose
client numbers agree with the server's own counters."""

from __future__ import annotations

import csv
import json

import pytest

from specdec.cli import main

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def sweep(server, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    argv = ["bench", "--url", server.grpc_url, "--metrics-url", server.metrics_url,
            "--server-pid", str(server.process.pid), "--arms", "baseline,ngram:4",
            "--concurrency", "1,2", "--num-requests", "2", "--warmup", "1", "--max-tokens", "24",
            "--workload", "grounded", "--goodput", "ttft:60000", "--output-dir", str(out)]  # fmt: skip
    assert main(argv) == 0
    return out, json.loads((out / "bench.json").read_text())


def test_the_sweep_writes_every_output(sweep):
    out, _ = sweep
    for name in ("bench.json", "summary.csv", "summary.md", "throughput.png", "latency.png", "speedup.png",
                 "acceptance.png", "distributions.png"):  # fmt: skip
        assert (out / name).stat().st_size > 0, name
    assert (out / "throughput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = list(csv.DictReader((out / "summary.csv").open()))
    assert [(r["concurrency"], r["arm"]) for r in rows] == [("1", "baseline"), ("1", "ngram:4"),
                                                           ("2", "baseline"), ("2", "ngram:4")]  # fmt: skip
    assert "| grounded | c=2 | ngram:4 |" in (out / "summary.md").read_text()


def test_every_request_is_recorded_with_its_timestamps(sweep):
    _, report = sweep
    assert [lv["load"]["concurrency"] for lv in report["levels"]] == [1, 2]
    for level in report["levels"]:
        requests = level["requests"]
        assert sorted((r["arm"], r["prompt"]) for r in requests) == [("baseline", 0), ("baseline", 1),
                                                                    ("ngram:4", 0), ("ngram:4", 1)]  # fmt: skip
        for r in requests:
            assert r["error"] is None
            times = [t for t, _ in r["chunks"]]
            assert r["start"] < times[0] and times == sorted(times) and times[-1] <= r["end"]
            assert len(r["totals"]) == len(r["chunks"]) and r["totals"][-1][0] == r["num_output_tokens"]
        for s in level["summary"].values():
            assert s["requests"] == 2 and s["errors"] == 0 and s["output_throughput"] > 0
            assert 0 < s["ttft"]["p50"] <= s["e2e"]["p50"] and s["goodput"] > 0
            assert s["same_text_as_baseline"] == [2, 2]  # greedy: speculation changes no token
        spec = level["summary"]["ngram:4"]
        assert spec["draft_tokens"] > 0 and spec["speedup"] > 0
        # the adaptive controller may draft fewer than 4 tokens, never more
        assert 1 <= len(spec["acceptance_per_position"]) <= 4
    assert report["machine"]["logical_cores"] >= 1


def test_client_counts_match_the_servers_counters(sweep):
    _, report = sweep
    checks = report["counter_check"]
    assert {(c["load"], c["proposer"]) for c in checks} == {("c=1", "none"), ("c=1", "ngram"), ("c=2", "none"),
                                                             ("c=2", "ngram")}  # fmt: skip
    for c in checks:
        for key in ("requests", "output_tokens", "draft_tokens", "accepted_tokens"):
            client, server = c[key]
            assert client == server, (c["load"], c["proposer"], key)
    for level in report["levels"]:
        server = level["server_counters"]["ngram"]
        spec = level["summary"]["ngram:4"]
        client = [
            round(r * d) for r, d in zip(spec["acceptance_per_position"], spec["drafted_per_position"], strict=True)
        ]
        # the server keeps series for positions drafted in earlier levels: they add 0 here
        assert _trimmed(server["accepted_per_position"]) == _trimmed(client)


def _trimmed(values: list[float]) -> list[float]:
    while values and values[-1] == 0:
        values = values[:-1]
    return values


def test_server_memory_is_reported_per_process(sweep):
    _, report = sweep
    peak = report["levels"][0]["memory_peak"]
    assert {"tritonserver", "target", "spec_decode", "total"} <= set(peak)
    assert peak["target"]["pss"] > 100 * 2**20 and peak["total"]["pss"] >= peak["target"]["pss"]
