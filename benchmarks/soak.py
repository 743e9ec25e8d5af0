"""Soak: thousands of mixed requests against one server, bounded in count and time.

Greedy, sampled, streamed, cancelled mid-stream and malformed requests, over both proposers,
at a fixed concurrency; half as text through the ensemble, half as token ids straight to
spec_decode asking for some of its outputs (the load generator's path). Checks that no error
other than the intended refusals occurs, that every request ends within REQUEST_DEADLINE_S (a
Python stub that dies leaves its requests waiting forever), that the KV cache is empty at the
end, and reports the server's resident memory after warm-up and at every tenth of the run (it
should stay flat).

    .venv/bin/python benchmarks/soak.py --requests 2000 --concurrency 8 [--url HOST:PORT]

Writes --output (benchmarks/results/soak/soak.json), with the machine it ran on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

from performance import update as update_performance
from rich.table import Table

from specdec.client.client import RequestParams, TritonClient, within
from specdec.client.machine import describe
from specdec.client.server_stats import find_listening_pid, memory_snapshot, scrape, total
from specdec.config import load_profile
from specdec.progress import console, progress_bar
from specdec.tokenizer import TextTokenizer
from specdec.triton.serve import embedded_server

REQUEST_DEADLINE_S = 120  # each takes a few seconds at most here

PROMPTS = [
    "Summarize in one sentence: the river rose after three days of rain and flooded the low fields.",
    "Repeat exactly: The quick brown fox jumps over the lazy dog. The quick brown fox jumps again.",
    "Write a haiku about winter.",
    "List three uses of a paperclip.",
    "def add(a, b):\n    return a + b\n\nRewrite this function with type hints.",
]


def request_mix(i: int, rng: random.Random) -> tuple[str, RequestParams, str, str]:
    """The i-th request: its prompt, parameters, kind (what the outcome should be) and route
    (text through the ensemble, or token ids to spec_decode)."""
    prompt = PROMPTS[i % len(PROMPTS)]
    method = rng.choice(["ngram", "draft_model", "none"])
    params = RequestParams(max_tokens=rng.randint(4, 48), draft_method=method, num_draft_tokens=rng.randint(0, 8))
    kind = rng.choices(["greedy", "sampled", "cancelled", "bad"], weights=[5, 3, 1, 1])[0]
    if kind == "sampled":
        params.temperature, params.top_p, params.seed = 0.8, 0.95, rng.randrange(2**32)
    elif kind == "bad":
        params.max_tokens = rng.choice([0, -1, 10**7])
    return prompt, params, kind, rng.choice(["text", "ids"])


def resident_mib(pid: int | None) -> float:
    return sum(m.rss for m in memory_snapshot(pid).values()) / 2**20 if pid else float("nan")


async def soak(
    url: str, metrics_url: str, pid: int | None, tokenizer: TextTokenizer, n: int, concurrency: int, deadline_s: float
) -> dict:
    rng = random.Random(0)
    prompt_ids = {p: tokenizer.encode(tokenizer.chat_prompt(p)) for p in PROMPTS}
    mix = [request_mix(i, rng) for i in range(n)]
    outcomes: dict[str, int] = {}
    unexpected: list[str] = []
    memory: list[tuple[int, float]] = []
    done = 0
    deadline = time.monotonic() + deadline_s
    gate = asyncio.Semaphore(concurrency)
    async with TritonClient(url) as client:

        async def one(prompt: str, params: RequestParams, kind: str, route: str) -> None:
            nonlocal done
            async with gate:
                if time.monotonic() > deadline:
                    outcomes["skipped (time bound)"] = outcomes.get("skipped (time bound)", 0) + 1
                    return
                cancel_after = 1 if kind == "cancelled" else None
                if route == "ids":
                    request = client.generate_ids(prompt_ids[prompt], params, cancel_after=cancel_after)
                else:
                    request = client.generate(prompt, params, cancel_after=cancel_after)
                error = (await within(request, REQUEST_DEADLINE_S)).error
            ok = (error is not None) if kind == "bad" else (error is None)
            key = f"{kind} ({route}): {'as expected' if ok else 'UNEXPECTED'}"
            outcomes[key] = outcomes.get(key, 0) + 1
            if not ok:
                unexpected.append(f"{kind} ({route}) {params}: {error}")
            done += 1
            if done % max(n // 10, 1) == 0:
                memory.append((done, resident_mib(pid)))
            progress.advance(task)

        with progress_bar() as progress:
            task = progress.add_task(f"soak: {n} requests, {concurrency} at a time", total=n)
            warm = [one(*request) for request in mix[: n // 10]]
            await asyncio.gather(*warm)
            memory.insert(0, (0, resident_mib(pid)))  # after warm-up
            await asyncio.gather(*(one(*request) for request in mix[n // 10 :]))
    await asyncio.sleep(1.0)
    samples = scrape(metrics_url) or {}
    return {
        "requests": n,
        "concurrency": concurrency,
        "outcomes": outcomes,
        "unexpected": unexpected[:20],
        "resident_mib": memory,
        "kv_slots_in_use_at_end": total(samples, "specdec_kv_slots_in_use"),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-seconds", type=float, default=1800)
    ap.add_argument("--url", help="gRPC address of a running server; default: start the embedded one")
    ap.add_argument("--metrics-url", help="with --url: its metrics endpoint")
    ap.add_argument("--output", type=Path, default=Path("benchmarks/results/soak/soak.json"))
    args = ap.parse_args(argv)
    profile = load_profile()
    machine = describe()  # its load averages at the start
    with embedded_server(profile, args.url) as (grpc_url, _, server):
        tokenizer = TextTokenizer(profile.model_dir("target"))  # converted by now
        metrics_url = server.metrics_url if server else args.metrics_url
        pid = server.process.pid if server else find_listening_pid(int(grpc_url.rsplit(":", 1)[1]))
        result = asyncio.run(
            soak(grpc_url, metrics_url, pid, tokenizer, args.requests, args.concurrency, args.max_seconds)
        )
    result = {"machine": machine, **result}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2))
    table = Table(title=f"soak: {result['requests']} requests, concurrency {result['concurrency']}")
    table.add_column("outcome")
    table.add_column("count", justify="right")
    for outcome, count in sorted(result["outcomes"].items()):
        table.add_row(outcome, str(count))
    console.print(table)
    memory = ", ".join(f"{n}: {m:.0f}" for n, m in result["resident_mib"])
    console.print(f"resident memory (MiB) after n requests: {memory}")
    console.print(f"KV slots in use at the end: {result['kv_slots_in_use_at_end']:.0f}")
    bad = bool(result["unexpected"]) or result["kv_slots_in_use_at_end"] > 0
    for line in result["unexpected"]:
        console.print(f"[red]{line}[/]")
    update_performance(args.output.parent)  # docs/performance.md, where this run is the tree's
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
