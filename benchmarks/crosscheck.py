"""The load generator's latencies against an independent client: curl.

    .venv/bin/python benchmarks/crosscheck.py [--out benchmarks/results/crosscheck] [--requests 4]

Starts the embedded server, runs `specdec bench` at concurrency 1 (gRPC), then sends the same
prompts with the same settings through curl (HTTP generate_stream, SSE), one at a time, taking
curl's own clock: time_starttransfer (the first streamed event, so TTFT) and time_total (end to
end). Writes crosscheck.md and the bench's own report (crosscheck-bench/) into --out.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from performance import update as update_performance

from specdec.build import build
from specdec.cli import main as specdec
from specdec.config import load_profile
from specdec.triton.serve import Ports, TritonServer

ARMS = {"baseline": {"num_draft_tokens": 0, "draft_method": "none"}, "ngram:5": {"num_draft_tokens": 5,
                                                                               "draft_method": "ngram"}}  # fmt: skip


def curl(http_url: str, body: dict) -> tuple[float, float, str]:
    """(time to the first byte, total time, streamed text) of one generate_stream request."""
    out = subprocess.run(
        ["curl", "-sN", "-o", "-", "-w", "\n%{time_starttransfer} %{time_total}",
         f"http://{http_url}/v2/models/ensemble/generate_stream", "-d", json.dumps(body)],
        capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    *events, timing = out.stdout.rstrip("\n").split("\n")
    first, total = (float(x) for x in timing.split())
    text = "".join(json.loads(e[5:]).get("text_output", "") for e in events if e.startswith("data:"))
    return first, total, text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "crosscheck")
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=96)
    args = ap.parse_args()
    if shutil.which("curl") is None:
        print("curl is not installed", file=sys.stderr)
        return 2
    profile = load_profile()
    build(profile)
    bench_dir = args.out / "crosscheck-bench"
    with TritonServer(profile, ports=Ports.free()) as server:
        argv = ["bench", "--url", server.grpc_url, "--metrics-url", server.metrics_url,
                "--server-pid", str(server.process.pid), "--arms", ",".join(ARMS), "--workload", "grounded",
                "--concurrency", "1", "--num-requests", str(args.requests), "--warmup", "1",
                "--max-tokens", str(args.max_tokens), "--no-plots", "--output-dir", str(bench_dir)]  # fmt: skip
        status = specdec(argv)
        if status != 0:
            return status
        report = json.loads((bench_dir / "bench.json").read_text())
        prompts = report["prompts"]["grounded"]
        level = report["levels"][0]
        lines = [
            "| arm | TTFT mean s: bench (gRPC) / curl (HTTP) | end-to-end mean s: bench / curl | same text |",
            "|---|---|---|---|",
        ]
        for arm, settings in ARMS.items():
            mine = sorted((r for r in level["requests"] if r["arm"] == arm), key=lambda r: r["prompt"])
            timings = [
                curl(server.http_url, {"text_input": prompts[r["prompt"]]["text"], "max_tokens": args.max_tokens,
                                       "stream": True, "cache_salt": f"curl {arm}", **settings})
                for r in mine
            ]  # fmt: skip
            summary = level["summary"][arm]
            bench_ttft = summary["time_to_first_token"]["avg"] / 1000  # ms in the report, s here
            bench_e2e = summary["request_latency"]["avg"] / 1000
            same = sum("".join(c[1] for c in r["chunks"]) == t[2] for r, t in zip(mine, timings, strict=True))
            lines.append(
                f"| {arm} | {bench_ttft:.3f} / {statistics.mean(t[0] for t in timings):.3f} "
                f"| {bench_e2e:.3f} / {statistics.mean(t[1] for t in timings):.3f} | {same}/{len(mine)} |"
            )
    table = "\n".join(lines) + "\n"
    (args.out / "crosscheck.md").write_text(
        f"{args.requests} grounded prompts per arm, {args.max_tokens} tokens at most, one request at a time; "
        f"the bench's requests first, then curl's.\n\n{table}"
    )
    print(table)
    update_performance(args.out)  # docs/performance.md, where this run is the tree's
    return 0


if __name__ == "__main__":
    sys.exit(main())
