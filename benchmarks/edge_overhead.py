"""What the server's edge costs: the same streamed requests through the edge (the server's gRPC
port) and straight to tritonserver's own endpoint behind it, taking turns block by block.

    .venv/bin/python benchmarks/edge_overhead.py [--blocks 3] [--requests 16] [--concurrency 4]
                                                 [--max-tokens 32]

Starts the embedded profile's server on free ports. Prints, and writes to --out
(benchmarks/results/edge_overhead/edge_overhead.md, with the machine it ran on), per path, the
requests' tokens/s and mean time to first token, and the CPU time the edge process spent per
request and per streamed response (from its own counters, so other load on the machine does not
blur it). Every text through the edge must equal the text straight from tritonserver.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import psutil
from performance import publish

from specdec.build import build
from specdec.client.client import RequestParams, TritonClient
from specdec.client.machine import describe, summary_line
from specdec.config import load_profile
from specdec.triton.serve import Ports, TritonServer

RESULT = Path(__file__).parent / "results" / "edge_overhead" / "edge_overhead.md"
PROMPTS = ["Count from 1 to 40, one number per line.", "Name ten fruits, one per line.",
           "Write the alphabet in capitals, one letter per line.", "List the planets of the solar system."]  # fmt: skip


async def block(url: str, n: int, concurrency: int, max_tokens: int) -> tuple[list, float]:
    """n requests at `concurrency`: their records and the block's wall time."""
    gate = asyncio.Semaphore(concurrency)
    params = RequestParams(max_tokens=max_tokens, temperature=0.0, end_id=-1)
    async with TritonClient(url) as client:

        async def one(i: int):
            async with gate:
                return await client.generate(PROMPTS[i % len(PROMPTS)], params)

        start = time.perf_counter()
        records = await asyncio.gather(*(one(i) for i in range(n)))
    return records, time.perf_counter() - start


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=3)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--out", type=Path, default=RESULT)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    machine = describe()  # its load averages at the start
    profile = load_profile()
    build(profile)
    with TritonServer(profile, ports=Ports.free()) as server:
        assert server.edge is not None and server.internal is not None
        edge = psutil.Process(server.edge.pid)
        paths = {"edge": server.grpc_url, "direct": server.internal.grpc_url}
        asyncio.run(block(server.grpc_url, args.concurrency, args.concurrency, 8))  # warm-up
        results: dict[str, list] = {name: [] for name in paths}
        texts: dict[str, list[str]] = {name: [] for name in paths}
        edge_cpu, responses = 0.0, 0
        for b in range(args.blocks):
            for name in sorted(paths, reverse=b % 2 == 1):  # who goes first alternates
                cpu = edge.cpu_times()
                records, seconds = asyncio.run(block(paths[name], args.requests, args.concurrency, args.max_tokens))
                if any(r.error for r in records):
                    print(f"{name}: {next(r.error for r in records if r.error)}", file=sys.stderr)
                    return 1
                if name == "edge":
                    after = edge.cpu_times()
                    edge_cpu += after.user + after.system - cpu.user - cpu.system
                    responses += sum(len(r.chunks) for r in records)
                tokens = sum(r.num_output_tokens for r in records)
                ttft = statistics.mean(r.chunks[0][0] - r.start for r in records)
                results[name].append((tokens / seconds, ttft))
                texts[name] += [r.text for r in records]
    if texts["edge"] != texts["direct"]:
        print("the edge's texts differ from tritonserver's own", file=sys.stderr)
        return 1
    n = args.blocks * args.requests
    lines = [f"{args.blocks} blocks x {args.requests} requests, {args.concurrency} at a time, "
             f"{args.max_tokens} tokens each", ""]  # fmt: skip
    lines += ["| path | tokens/s, block by block | mean TTFT, ms |", "|---|---|---|"]
    for name, runs in results.items():
        rates, ttfts = zip(*runs, strict=True)
        lines.append(f"| {name} | {' '.join(f'{r:.1f}' for r in rates)} | "
                     f"{' '.join(f'{t * 1000:.0f}' for t in ttfts)} |")  # fmt: skip
    lines += ["", f"Edge CPU: {edge_cpu / n * 1000:.2f} ms a request, {edge_cpu / responses * 1000:.3f} ms a "
              "streamed response.", "", f"Machine: {summary_line(machine)}."]  # fmt: skip
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
