"""A short real sweep through `specdec bench` against the real server: a valid report whose
client numbers agree with the server's own counters; and a bench whose server dies under it and
comes back."""

from __future__ import annotations

import csv
import json
import os
import signal
import threading

import pytest
from support.servers import variant_server, wait_for

from specdec.cli import main
from specdec.client.server_stats import scrape, total
from specdec.triton.serve import triton_process

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
    for level in ("concurrency1", "concurrency2"):
        for arm in ("baseline", "ngram-4"):
            export = json.loads((out / "grounded" / level / arm / "profile_export_genai_perf.json").read_text())
            assert export["request_count"] == {"unit": "count", "avg": 2.0}
            assert export["input_sequence_length"]["min"] > 10  # the prompts' tokens, counted by the tokenizer
            assert export["input_config"]["arm"] == arm.replace("-", ":")
            table = (out / "grounded" / level / arm / "profile_export_genai_perf.csv").read_text()
            assert table.startswith("Metric,avg,min,max,p99,p95,p90,p75,p50,p25,p10,p5,p1\n")
            assert "Request Goodput (per sec)," in table


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
            assert s["requests"] == 2 and s["errors"] == 0 and s["output_token_throughput"] > 0
            assert 0 < s["time_to_first_token"]["p50"] <= s["request_latency"]["p50"] and s["request_goodput"] > 0
            assert s["inter_token_latency"]["avg"] > 0 and s["failures"] == {}
            assert s["same_text_as_baseline"] == [2, 2]  # greedy: speculation changes no token
        spec = level["summary"]["ngram:4"]
        assert spec["draft_tokens"] > 0 and spec["speedup"] > 0
        # the adaptive controller may draft fewer than 4 tokens, never more
        assert 1 <= len(spec["acceptance_per_position"]) <= 4
    assert report["machine"]["logical_cores"] >= 1
    assert report["failures"] == {"requests": 8, "failed": 0, "by_reason": {}}


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


# --- faults ----------------------------------------------------------------------------------------
# Enough requests to outlast a restart ten times slower than this test server's: while the server
# is down a request fails every 2 s (two workers, each pausing 4 s after a failure), so 100
# requests last 200 s of it.
REQUESTS = 100


def test_the_bench_survives_its_server_dying_and_coming_back(embedded_profile, smollm_dir, tmp_path):
    """tritonserver killed in the middle of a level and started again: the bench counts the
    requests that failed meanwhile, with their reason, goes on with the new server and writes
    its report."""
    out = tmp_path / "bench"
    with variant_server(embedded_profile, smollm_dir, "bench-faults") as srv:
        argv = ["bench", "--url", srv.grpc_url, "--metrics-url", srv.metrics_url, "--arms", "ngram:4",
                "--concurrency", "2", "--num-requests", str(REQUESTS), "--warmup", "1", "--max-tokens", "8",
                "--workload", "chat", "--request-timeout", "60", "--no-plots", "--output-dir", str(out)]  # fmt: skip
        status: list[int] = []
        bench = threading.Thread(target=lambda: status.append(main(argv)))
        bench.start()
        try:
            assert wait_for(lambda: answered(srv) >= 8, timeout=300), "the bench never got going"
            os.kill(triton_process(srv.process.pid), signal.SIGKILL)
            srv.restart()  # its stubs and shared memory cleared, a new tritonserver on the same ports
        finally:
            bench.join(timeout=600)
    assert not bench.is_alive() and status == [0]

    report = json.loads((out / "bench.json").read_text())
    failures = report["failures"]
    assert failures["requests"] == REQUESTS and 1 <= failures["failed"] < REQUESTS
    # the requests in flight lose their stream, the next ones find no server: gRPC's UNAVAILABLE
    assert set(failures["by_reason"]) <= {"gRPC UNAVAILABLE", "gRPC CANCELLED", "gRPC INTERNAL", "gRPC UNKNOWN"}
    (level,) = report["levels"]
    assert level["summary"]["ngram:4"]["failures"] == failures["by_reason"]
    assert level["server_counters"] is None  # the server restarted: its counts began again
    requests = sorted(level["requests"], key=lambda r: r["start"])
    last_failure = max(i for i, r in enumerate(requests) if r["error"])
    after = requests[last_failure + 1 :]
    assert len(after) >= 5 and all(r["error"] is None and r["num_output_tokens"] > 0 for r in after)
    assert sum(r["error"] is None for r in requests[:last_failure]) >= 5  # before the kill
    summary = (out / "summary.md").read_text()
    assert f"**{failures['failed']} of {REQUESTS} requests failed** (gRPC " in summary
    assert "No server counters for chat c=2" in summary
    export = json.loads((out / "chat" / "concurrency2" / "ngram-4" / "profile_export_genai_perf.json").read_text())
    assert export["request_count"]["avg"] == REQUESTS - failures["failed"]


def answered(server) -> float:
    """Requests the server has finished (0 while its metrics do not answer)."""
    samples = scrape(server.metrics_url, timeout=2)
    return total(samples, "specdec_requests_total") if samples else 0.0
