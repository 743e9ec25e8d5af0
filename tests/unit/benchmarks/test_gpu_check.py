"""benchmarks/gpu_check.py, the GPU check, run on the CPU on a tiny model: the same code paths
(random weights made on the spot, a truncated draft, the service in process) and the JSON a GPU
run writes."""

from __future__ import annotations

import json

from gpu_check import DRAFT_LENGTHS, main


def test_the_check_writes_exactness_cost_and_throughput(tmp_path):
    out = tmp_path / "gpu_check.json"
    assert main(["--device", "cpu", "--quick", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    checks = report["exactness"]["checks"]
    assert report["exactness"]["all_exact"] and len(checks) == 2 * len(DRAFT_LENGTHS)
    assert all(c["exact"] and c["draft_tokens"] > 0 for c in checks)  # every length drafted, and was exact
    cost = report["verification_cost"]
    assert cost["rows"] == [1, 2, 4, 8] and cost["relative_to_one_row"][0] == 1.0
    levels = [(t["requests"], t["proposer"]) for t in report["throughput"]]
    assert levels == [(1, "none"), (1, "ngram"), (2, "none"), (2, "ngram")]
    assert all(t["tokens_per_s"] > 0 for t in report["throughput"])
    assert report["device"] == "cpu" and report["model"]["weights"] == "random"
