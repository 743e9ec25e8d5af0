"""Soak: thousands of mixed requests against one server, and every server process's resident
memory over them, which must not grow with the requests.

Greedy, sampled, streamed, cancelled mid-stream and malformed requests, over every proposer and
the baseline, at a fixed concurrency, by four routes: text through the ensemble at the server's
edge over gRPC and over HTTP, the OpenAI-compatible API, and token ids straight to spec_decode
on tritonserver's own endpoint (the load generator's path). Checks that no error other than the
intended refusals occurs, that every request ends within REQUEST_DEADLINE_S (a Python stub that
dies leaves its requests waiting forever), that the KV cache is empty at the end, and that each
process (tritonserver, each model's Python backend stub, the edge, the OpenAI frontend) keeps
its resident memory flat: sampled every --sample-every requests, its least-squares slope over
the samples after warm-up (the first --warmup requests: allocator pools, kernel caches for new
shapes) must stay under --max-slope bytes a request. Before the mix, every KV cache slot is
written as deep as the mix reaches (fill_kv_caches). Exit code 1 when any check fails.

    .venv/bin/python benchmarks/soak.py --requests 2000 --concurrency 8 [--url HOST:PORT]

Writes --output (benchmarks/results/soak/soak.json), with the machine it ran on, and the
memory of each process beside it (soak.png).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil
from performance import update as update_performance
from rich.table import Table

from specdec.client.client import Record, RequestParams, TritonClient, http_generate, openai_generate, within
from specdec.client.machine import describe
from specdec.client.server_stats import find_listening_pid, resident_by_name, scrape, server_processes, total
from specdec.config import load_profile
from specdec.progress import console, progress_bar
from specdec.tokenizer import TextTokenizer
from specdec.triton.internal import InternalAccess, access_path, read_access_file
from specdec.triton.serve import TritonServer, embedded_server

REQUEST_DEADLINE_S = 120  # each takes a few seconds at most here
# What a request may leave behind for good in any one process, in bytes: a request's own state
# kept by mistake (a dict entry, a metric series, a task) is of this order; what this soak found
# before tritonserver's MALLOC_SETTINGS (specdec/triton/serve.py) and fill_kv_caches, several
# times more (its results: benchmarks/results/soak/).
MAX_SLOPE_BYTES = 1024

PROMPTS = [
    "Summarize in one sentence: the river rose after three days of rain and flooded the low fields.",
    "Repeat exactly: The quick brown fox jumps over the lazy dog. The quick brown fox jumps again.",
    "Write a haiku about winter.",
    "List three uses of a paperclip.",
    "def add(a, b):\n    return a + b\n\nRewrite this function with type hints.",
]
ROUTES = ("text", "http", "openai", "ids")  # ensemble over gRPC, over HTTP, the OpenAI API; spec_decode's ids


@dataclass(frozen=True)
class Endpoints:
    """Where the soak sends its requests, and the server's processes whose memory it reads
    (name -> pid; a process's descendants are read too, by their own names)."""

    grpc: str  # the edge's gRPC endpoint
    http: str | None  # the edge's HTTP endpoint (None: no HTTP requests)
    openai: str | None  # the OpenAI-compatible API's base URL, .../v1 (None: no OpenAI requests)
    model: str  # the OpenAI API's model name (the profile's)
    internal: InternalAccess  # tritonserver's own endpoint and this start's key, for spec_decode's ids
    metrics: str
    processes: dict[str, int]


def endpoints_of(server: TritonServer) -> Endpoints:
    """A started server's endpoints and processes."""
    assert server.process is not None and server.internal is not None
    processes = {"tritonserver": server.process.pid}
    if server.edge is not None:
        processes["edge"] = server.edge.pid
    if server.frontend is not None:
        processes["openai"] = server.frontend.pid
    return Endpoints(server.grpc_url, server.http_url, server.openai_url, server.profile.name, server.internal,
                     server.metrics_url, processes)  # fmt: skip


def request_mix(i: int, rng: random.Random, routes: tuple[str, ...] = ROUTES,
                max_tokens: int = 48) -> tuple[str, RequestParams, str, str, bool]:  # fmt: skip
    """The i-th request: its prompt, parameters, kind (what the outcome should be), route and
    whether it streams (a cancelled one does: it is cancelled after its first chunk). Cancelled
    requests go by gRPC and the OpenAI API only: Triton 2.51 does not cancel an HTTP request whose
    client hangs up (it runs to max_tokens; test_reliability.py covers that)."""
    prompt = PROMPTS[i % len(PROMPTS)]
    method = rng.choice(["ngram", "draft_model", "none"])
    params = RequestParams(max_tokens=rng.randint(4, max_tokens), draft_method=method,
                           num_draft_tokens=rng.randint(0, 8))  # fmt: skip
    kind = rng.choices(["greedy", "sampled", "cancelled", "bad"], weights=[5, 3, 1, 1])[0]
    if kind == "sampled":
        params.temperature, params.top_p, params.seed = 0.8, 0.95, rng.randrange(2**32)
    elif kind == "bad":
        params.max_tokens = rng.choice([0, -1, 10**7])
    route = rng.choice([r for r in routes if kind != "cancelled" or r != "http"])
    return prompt, params, kind, route, kind == "cancelled" or rng.random() < 0.5


async def openai_cancelled(session, base_url: str, model: str, prompt: str, params: RequestParams) -> Record:
    """A streamed chat that the client closes after its first chunk: the frontend cancels the
    ensemble request."""
    fields = {k: v for k, v in params.tensors().items() if k != "apply_chat_template"}
    body = {"model": model, "stream": True, "messages": [{"role": "user", "content": prompt}], **fields}
    record = Record(start=time.perf_counter())
    async with session.post(f"{base_url}/chat/completions", json=body) as resp:
        if resp.status != 200:
            record.error = f"HTTP {resp.status}: {(await resp.text()).strip()}"
        else:
            async for line in resp.content:
                if line.startswith(b"data:"):
                    record.chunks.append((time.perf_counter(), line.decode("utf-8")))
                    break
            resp.close()  # the connection, mid-stream
    record.end = time.perf_counter()
    return record


async def fill_kv_caches(direct: TritonClient, metrics_url: str, prompt_ids: list[int], max_tokens: int) -> int:
    """Write every KV cache slot of both engines as deep as the mix will (the longest prompt, the
    most tokens, the longest draft, no end token), all slots at once; the number of requests sent.
    The engines allocate their caches whole, but the pages of a slot become resident only as
    sequences first reach them: without this, resident memory would rise for as long as new
    (slot, depth) pairs come up, up to the size of the caches, which is not a leak but would
    take far longer than the soak to reach."""
    slots = int(max((v for (name, _), v in (scrape(metrics_url) or {}).items()
                     if name == "specdec_kv_slots_capacity"), default=16))  # fmt: skip
    params = RequestParams(max_tokens=max_tokens, end_id=-1, draft_method="draft_model", num_draft_tokens=8)
    records = await asyncio.gather(*(direct.generate_ids(prompt_ids, params) for _ in range(2 * slots)))
    if failed := [r.error for r in records if r.error]:
        raise RuntimeError(f"filling the KV caches failed: {failed[0]}")
    return len(records)


def slope(points: list[tuple[int, float]]) -> float:
    """The least-squares slope of y over x of (x, y) points (0 for fewer than two)."""
    if len({x for x, _ in points}) < 2:
        return 0.0
    xs, ys = np.array([p[0] for p in points], dtype=float), np.array([p[1] for p in points], dtype=float)
    return float(np.polyfit(xs, ys, 1)[0])


def half_slopes(samples: list, first: int, last: int) -> dict[str, tuple[float, float]]:
    """Per process, the resident-memory slopes (bytes a request) over the samples of MemoryLog's
    form from `first` requests to the middle, and from the middle to `last`: a one-time step
    raises one of them, growth that goes on raises both."""
    later = [(n, values) for n, values in samples if first <= n <= last]
    middle = (first + last) // 2
    halves = ([s for s in later if s[0] <= middle], [s for s in later if s[0] >= middle])
    names = set().union(*(values for _, values in later))
    return {name: (slope([(n, v[name][0]) for n, v in halves[0] if name in v]),
                   slope([(n, v[name][0]) for n, v in halves[1] if name in v])) for name in sorted(names)}  # fmt: skip


@dataclass
class MemoryLog:
    """Each process's resident memory (bytes: rss, anon, file, shmem) after a number of requests."""

    processes: dict[str, list[int]]
    samples: list[tuple[int, dict[str, tuple[int, int, int, int]]]] = field(default_factory=list)

    def sample(self, done: int) -> None:
        now = resident_by_name(self.processes)
        self.samples.append((done, {name: (r.rss, r.anon, r.file, r.shmem) for name, r in now.items()}))

    def slopes(self, after: int) -> dict[str, dict[str, float]]:
        """Per process, bytes a request: the least-squares slope over the samples at or after
        `after` requests, of each kind of resident memory."""
        out = {}
        for name in self.processes:
            later = [(n, values[name]) for n, values in self.samples if n >= after and name in values]
            out[name] = {kind: slope([(n, v[i]) for n, v in later]) for i, kind in enumerate(MEMORY_KINDS)}
        return out


MEMORY_KINDS = ("rss", "anon", "file", "shmem")


async def soak(endpoints: Endpoints, tokenizer: TextTokenizer, n: int, concurrency: int, deadline_s: float,
               warmup: int, sample_every: int, max_tokens: int = 48, max_slope: float = MAX_SLOPE_BYTES,
               progress: bool = True) -> dict:  # fmt: skip
    """Send the mix's n requests, `concurrency` at a time; the report, with its verdicts
    (`failures`: empty when every check passed). Memory is sampled every `sample_every`
    requests; the slopes are over the samples from `warmup` requests on."""
    import aiohttp

    rng = random.Random(0)
    routes = tuple(r for r in ROUTES if {"http": endpoints.http, "openai": endpoints.openai}.get(r, True))
    prompt_ids = {p: tokenizer.encode(tokenizer.chat_prompt(p)) for p in PROMPTS}
    mix = [request_mix(i, rng, routes, max_tokens) for i in range(n)]
    outcomes: dict[str, int] = {}
    unexpected: list[str] = []
    memory = MemoryLog(server_processes(endpoints.processes))
    done = 0
    deadline = time.monotonic() + deadline_s
    gate = asyncio.Semaphore(concurrency)
    internal = endpoints.internal
    async with (
        TritonClient(endpoints.grpc) as client,
        TritonClient(internal.grpc_url, internal_key=internal.key) as direct,
        aiohttp.ClientSession() as session,
    ):

        async def send(prompt: str, params: RequestParams, kind: str, route: str, stream: bool) -> Record:
            cancel_after = 1 if kind == "cancelled" else None
            if route == "ids":
                return await direct.generate_ids(prompt_ids[prompt], params, stream, cancel_after=cancel_after)
            if route == "text":
                return await client.generate(prompt, params, stream, cancel_after=cancel_after)
            if route == "http":
                assert endpoints.http is not None
                return await http_generate(endpoints.http, prompt, params, stream)
            assert endpoints.openai is not None
            if kind == "cancelled":
                return await openai_cancelled(session, endpoints.openai, endpoints.model, prompt, params)
            return await openai_generate(session, endpoints.openai, endpoints.model, prompt, params, stream)

        async def one(prompt: str, params: RequestParams, kind: str, route: str, stream: bool) -> None:
            nonlocal done
            async with gate:
                if time.monotonic() > deadline:
                    outcomes["skipped (time bound)"] = outcomes.get("skipped (time bound)", 0) + 1
                    return
                try:
                    error = (await within(send(prompt, params, kind, route, stream), REQUEST_DEADLINE_S)).error
                except aiohttp.ClientError as err:  # the HTTP endpoints' failures to connect or answer
                    error = f"{type(err).__name__}: {err}"
            ok = (error is not None) if kind == "bad" else (error is None)
            key = f"{kind} ({route}): {'as expected' if ok else 'UNEXPECTED'}"
            outcomes[key] = outcomes.get(key, 0) + 1
            if not ok:
                unexpected.append(f"{kind} ({route}) {params}: {error}")
            done += 1
            if done % sample_every == 0:
                memory.sample(done)
            if bar is not None:
                bar.advance(task)

        with progress_bar() if progress else contextlib.nullcontext() as bar:
            task = bar.add_task(f"soak: {n} requests, {concurrency} at a time", total=n) if bar else None
            filled = await fill_kv_caches(direct, endpoints.metrics, max(prompt_ids.values(), key=len), max_tokens)
            memory.sample(0)
            await asyncio.gather(*(one(*request) for request in mix))
    await asyncio.sleep(1.0)
    samples = scrape(endpoints.metrics) or {}
    slopes = memory.slopes(warmup)
    kv_in_use = total(samples, "specdec_kv_slots_in_use")
    failures = [f"{line}" for line in unexpected[:5]]
    if kv_in_use > 0:
        failures.append(f"{kv_in_use:.0f} KV cache slots still in use at the end")
    if done < warmup + 3 * sample_every:
        failures.append(f"only {done} requests done: too few samples after warm-up ({warmup}) for a slope")
    failures += [
        f"{name}: resident memory grows {s['rss']:.0f} bytes a request after warm-up (at most {max_slope:.0f})"
        for name, s in slopes.items()
        if s["rss"] > max_slope
    ]
    return {
        "requests": n,
        "concurrency": concurrency,
        "max_tokens": max_tokens,
        "outcomes": outcomes,
        "unexpected": unexpected[:20],
        "kv_slots_in_use_at_end": kv_in_use,
        "kv_cache_fill_requests": filled,
        "memory": {
            "warmup_requests": warmup,
            "sample_every": sample_every,
            "max_slope_bytes_per_request": max_slope,
            "slopes_bytes_per_request": slopes,
            "kinds": list(MEMORY_KINDS),
            "samples": memory.samples,
        },
        "failures": failures,
    }


def plot(report: dict, path: Path) -> None:
    """Each process's resident memory over the requests, relative to its first sample after
    warm-up, with its least-squares line over the samples from there."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    memory = report["memory"]
    warmup, samples = memory["warmup_requests"], memory["samples"]
    fig, ax = plt.subplots(figsize=(8, 4.2))
    shown = [0.0]  # MiB after warm-up, all processes: the axis spans these (warm-up's climb runs off it)
    for i, (name, s) in enumerate(sorted(memory["slopes_bytes_per_request"].items())):
        points = [(n, values[name][0]) for n, values in samples if name in values]
        base = next((v for n, v in points if n >= warmup), points[0][1])
        xs = [n for n, _ in points]
        ax.plot(xs, [(v - base) / 2**20 for _, v in points], lw=1, color=f"C{i}",
                label=f"{name}: {s['rss']:+.0f} B/request")  # fmt: skip
        later = [(n, v) for n, v in points if n >= warmup]
        shown += [(v - base) / 2**20 for _, v in later]
        if len(later) > 1:
            gradient, intercept = np.polyfit([n for n, _ in later], [v - base for _, v in later], 1)
            ends = [later[0][0], later[-1][0]]
            ax.plot(ends, [(intercept + gradient * n) / 2**20 for n in ends], ls="--", lw=0.8, color=f"C{i}")
    pad = max(0.5, 0.2 * (max(shown) - min(shown)))
    ax.set_ylim(min(shown) - pad, max(shown) + pad)
    ax.axvspan(0, warmup, color="0.9", label="warm-up")
    ax.set(xlabel="requests done", ylabel="resident memory, MiB over the end of warm-up",
           title=f"soak: {report['requests']} requests, {report['concurrency']} at a time; "
                 f"slopes after warm-up (bound {memory['max_slope_bytes_per_request']:.0f} B/request)")  # fmt: skip
    ax.title.set_fontsize(9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _endpoints_at(url: str, profile, metrics_url: str | None, openai_url: str | None) -> Endpoints:
    """A running server's endpoints (--url), its processes found from the ports it listens on."""
    port = int(url.rsplit(":", 1)[1])
    internal = read_access_file(access_path(profile.build_path(), port))
    if internal is None:
        raise SystemExit(
            f"no access file for the server on port {port} in {profile.build_path()}: the "
            "soak sends token ids to spec_decode, an internal model (run it as the server's user)"
        )
    processes = {}
    if (triton := find_listening_pid(port)) is not None:
        processes["tritonserver"] = triton
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid != triton:
            processes["edge"] = conn.pid  # the edge itself, in front of tritonserver
    if openai_url and (pid := find_listening_pid(int(openai_url.split("/")[2].rsplit(":", 1)[1]))) is not None:
        processes["openai"] = pid
    return Endpoints(url, None, openai_url, profile.name, internal, metrics_url or "", processes)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=48, help="the most tokens a request asks for")
    ap.add_argument("--warmup", type=int, default=400, help="requests before the memory slopes are measured")
    ap.add_argument("--sample-every", type=int, default=20, help="requests between memory samples")
    ap.add_argument("--max-slope", type=float, default=MAX_SLOPE_BYTES, help="bytes a request, any process")
    ap.add_argument("--max-seconds", type=float, default=3600)
    ap.add_argument("--url", help="gRPC address of a running server; default: start the embedded one")
    ap.add_argument("--metrics-url", help="with --url: its metrics endpoint")
    ap.add_argument("--openai-url", help="with --url: its OpenAI-compatible API, http://HOST:PORT/v1")
    ap.add_argument("--output", type=Path, default=Path("benchmarks/results/soak/soak.json"))
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    profile = load_profile()
    machine = describe()  # its load averages at the start
    with embedded_server(profile, args.url) as (grpc_url, _, server):
        tokenizer = TextTokenizer(profile.model_dir("target"))  # converted by now
        if server is not None:
            endpoints = endpoints_of(server)
        else:
            endpoints = _endpoints_at(grpc_url, profile, args.metrics_url, args.openai_url)
        result = asyncio.run(soak(endpoints, tokenizer, args.requests, args.concurrency, args.max_seconds,
                                  args.warmup, args.sample_every, args.max_tokens, args.max_slope))  # fmt: skip
    result = {"machine": machine, **result}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1))
    plot(result, args.output.with_suffix(".png"))
    table = Table(title=f"soak: {result['requests']} requests, concurrency {result['concurrency']}")
    table.add_column("outcome")
    table.add_column("count", justify="right")
    for outcome, count in sorted(result["outcomes"].items()):
        table.add_row(outcome, str(count))
    console.print(table)
    console.print(memory_table(result))
    console.print(f"KV slots in use at the end: {result['kv_slots_in_use_at_end']:.0f}")
    for line in result["failures"]:
        console.print(f"[red]{line}[/]")
    update_performance(args.output.parent)  # docs/performance.md, where this run is the tree's
    return 1 if result["failures"] else 0


def slopes_line(slopes: dict[str, dict[str, float]]) -> str:
    """Each process's resident-memory slope, bytes a request, on one line."""
    return ", ".join(f"{name} {s['rss']:+.0f}" for name, s in sorted(slopes.items()))


def memory_table(report: dict) -> Table:
    """Per process: resident memory at the end of warm-up and at the end, and the slopes."""
    memory = report["memory"]
    warmup, samples = memory["warmup_requests"], memory["samples"]
    after = [(n, values) for n, values in samples if n >= warmup]
    table = Table(title=f"resident memory after warm-up ({warmup} requests), bytes a request by least squares")
    for column in ("process", "MiB at warm-up", "MiB at the end", "rss", "anon", "file", "shmem"):
        table.add_column(column, justify="left" if column == "process" else "right")
    for name, s in sorted(memory["slopes_bytes_per_request"].items()):
        first, last = (after[0][1].get(name), after[-1][1].get(name)) if after else (None, None)
        mib = [f"{v[0] / 2**20:.1f}" if v else "-" for v in (first, last)]
        table.add_row(name, *mib, *(f"{s[k]:+.0f}" for k in MEMORY_KINDS))
    return table


if __name__ == "__main__":
    sys.exit(main())
