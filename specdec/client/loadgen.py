"""`specdec bench`: the load generator.

A run is workloads x load levels x arms. An arm is a speculation configuration (proposer and
draft length) or the baseline (`draft_method` none, `num_draft_tokens` 0). Every arm answers the
same prompts, and the arms take turns so that drift of the machine hits all alike:
- interleave "block" (the default): in alternating blocks (2 x C requests of one arm at
  concurrency C, or 4 arrivals in the open loop, then the next arm, the order rotating from round
  to round), so each arm is measured with the server busy with that arm alone: what a deployment
  that turns speculation on (or off) for everyone gets;
- interleave "request": request by request (prompt p goes to every arm, the order of the arms
  rotating from prompt to prompt); the requests in flight mix the arms, so every arm is measured
  under the same mixed load. With the CPU engine this flatters speculation: an engine call returns
  when every row of its batch is done, so a baseline request batched with speculative ones waits
  for their multi-token rounds, and speculation's "speedup" is inflated by the baseline it slows
  (benchmarks/readme.py's sweep and blocks steps run the two modes side by side).

Load: a closed loop (C requests in flight, a new one as soon as one ends) or an open loop
(Poisson arrivals at a rate, whatever is in flight). Every level stops issuing at
`num_requests` per arm or after `duration` seconds, whichever comes first, and every request is
bounded by `request_timeout`, so a level lasts at most duration + request_timeout.

Around each level the server's Prometheus counters are read (their difference is the server's
account of the level) and its memory is sampled while the level runs.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field

from specdec.client.client import Record, RequestParams, TritonClient, http_generate, within
from specdec.client.metrics import SLO, ArmSummary, busy_seconds, summarize
from specdec.client.server_stats import (
    MemorySampler,
    ProcessMemory,
    Samples,
    delta,
    gpu_memory_bytes,
    memory_snapshot,
    peak,
    scrape,
)
from specdec.client.workloads import Prompt, WorkloadOptions
from specdec.progress import progress_bar


@dataclass(frozen=True)
class Arm:
    draft_method: str  # none | ngram | draft_model
    num_draft_tokens: int | None = None  # None: the profile's default

    @property
    def is_baseline(self) -> bool:
        return self.draft_method == "none"

    @property
    def name(self) -> str:
        if self.is_baseline:
            return "baseline"
        return self.draft_method if self.num_draft_tokens is None else f"{self.draft_method}:{self.num_draft_tokens}"

    def params(
        self, prompt: Prompt, temperature: float | None, top_p: float | None, seed: int | None, salt: str
    ) -> RequestParams:
        return RequestParams(
            max_tokens=prompt.max_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            num_draft_tokens=0 if self.is_baseline else self.num_draft_tokens,
            draft_method=self.draft_method,
            end_id=-1 if prompt.ignore_eos else None,
            apply_chat_template=prompt.apply_chat_template,
            cache_salt=salt,
        )


BASELINE = Arm("none", 0)
PROPOSERS = ("ngram", "draft_model")


def parse_arm(text: str) -> Arm:
    """`baseline`, or PROPOSER[:K] with PROPOSER ngram or draft_model. K = 0 runs the proposer's
    path with drafting off: against the baseline, an A/A comparison that sizes the noise."""
    text = text.strip()
    if text in ("baseline", "none"):
        return BASELINE
    method, _, k = text.partition(":")
    if method not in PROPOSERS:
        raise ValueError(f"arm {text!r}: expected baseline or one of {', '.join(PROPOSERS)}, optionally :K")
    if k and not k.isdigit():
        raise ValueError(f"arm {text!r}: the draft length after ':' must be a whole number")
    return Arm(method, int(k) if k else None)


def parse_counts(text: str) -> list[int]:
    """`1,2,4,16`, or `A..B` for the powers of two from A to B (`1..16` = 1,2,4,8,16)."""
    if ".." in text:
        low, high = (int(x) for x in text.split("..", 1))
        if not 1 <= low <= high:
            raise ValueError(f"{text!r}: expected 1 <= A <= B")
        out = []
        while low <= high:
            out.append(low)
            low *= 2
        return out
    values = [int(x) for x in text.split(",") if x.strip()]
    if not values or min(values) < 1:
        raise ValueError(f"{text!r}: expected positive integers")
    return values


def parse_slo(items: Iterable[str]) -> SLO:
    """vllm bench serve's --goodput form: `ttft:MS tpot:MS e2el:MS` (milliseconds)."""
    limits: dict[str, float] = {}
    names = {"ttft": "ttft", "tpot": "tpot", "e2el": "e2e", "e2e": "e2e"}
    for item in items:
        key, _, value = item.partition(":")
        if key not in names or not value:
            raise ValueError(f"goodput {item!r}: expected ttft:MS, tpot:MS or e2el:MS")
        limits[names[key]] = float(value) / 1000
    return SLO(**limits)


@dataclass(frozen=True)
class Load:
    concurrency: int | None = None  # closed loop
    rate: float | None = None  # open loop, requests / s over all arms

    @property
    def label(self) -> str:
        return f"c={self.concurrency}" if self.concurrency is not None else f"{self.rate:g} req/s"


@dataclass(frozen=True)
class BenchConfig:
    arms: tuple[Arm, ...]
    loads: tuple[Load, ...]
    workloads: tuple[str, ...] = ("mixed",)
    num_requests: int = 16  # per arm and level
    duration: float = 1800.0  # seconds per level at most
    warmup: int = 2  # per arm, before the first level, not recorded
    request_timeout: float = 300.0
    interleave: str = "block"  # block | request (see the module doc)
    block_size: int | None = None  # requests per block; default 2 x C (closed loop) or 4 (open loop)
    transport: str = "grpc"  # grpc | http
    stream: bool = True
    temperature: float | None = None  # None: greedy
    top_p: float | None = None  # None: the server's default (no cut)
    seed: int = 0
    slo: SLO = field(default_factory=SLO)
    workload_options: WorkloadOptions = field(default_factory=WorkloadOptions)

    def round_size(self, load: Load) -> int:
        """Request numbers per round, the unit in which every arm answers the same prompts: a
        block (block mode) or one request (request mode)."""
        if self.interleave != "block":
            return 1
        return self.block_size or (2 * load.concurrency if load.concurrency is not None else 4)


@dataclass
class Sent:
    """One measured request."""

    arm: str
    number: int  # the request's number within its arm: arms' requests of one number answer one prompt
    prompt: int  # index into the workload's prompts
    kind: str
    record: Record


@dataclass
class LevelResult:
    workload: str
    load: Load
    started: float  # seconds since the run started
    duration: float
    requests: list[Sent]
    counters: Samples | None  # the server's counters, after - before; None: no metrics endpoint
    memory_before: dict[str, ProcessMemory]
    memory_peak: dict[str, ProcessMemory]
    gpu_memory_bytes: float | None
    arm_seconds: dict[str, float] = field(default_factory=dict)  # block mode: wall time each arm ran alone

    def records(self, arm: str) -> list[Record]:
        return [s.record for s in self.requests if s.arm == arm]


@dataclass
class BenchResult:
    config: BenchConfig
    prompts: dict[str, list[Prompt]]
    levels: list[LevelResult]
    server: dict[str, object]  # url, transport, pid, metrics url
    t0: float  # time.perf_counter() when the run started: request times are relative to it

    @property
    def errors(self) -> list[str]:
        return [s.record.error for level in self.levels for s in level.requests if s.record.error]


Job = tuple[int, int]  # (request number n within its arm, arm): n answers prompt n % len(prompts)


def interleaved(num_arms: int, per_arm: int) -> Iterator[Job]:
    """Each request number to every arm in turn, the arm order rotating by one per number so no
    arm is always first."""
    for n in range(per_arm):
        for j in range(num_arms):
            yield n, (j + n) % num_arms


def blocks(num_arms: int, per_arm: int, block_size: int) -> Iterator[list[Job]]:
    """Blocks of one arm's jobs: round r gives every arm (in an order rotated by r) the same
    `block_size` request numbers."""
    for r, first in enumerate(range(0, per_arm, block_size)):
        for j in range(num_arms):
            arm = (j + r) % num_arms
            yield [(n, arm) for n in range(first, min(first + block_size, per_arm))]


def cache_salt(label: str, arm: Arm, n: int, num_prompts: int) -> str:
    """A request's cache salt: its arm's, and its pass over the prompts'. Arms answer the same
    prompts, and a prompt one arm just ran would else be cached whole for the next (and a prompt
    asked again in a later pass): each reuses only the prefixes its own requests of the pass
    share, as different requests do that share a chat template."""
    return f"{label} {arm.name} pass {n // num_prompts}"


async def closed_loop(
    jobs: Iterable[Job], send: Callable[[Job], Awaitable[None]], concurrency: int, deadline: float
) -> None:
    """`concurrency` workers, each sending its next job as soon as its last one ended."""
    queue = iter(jobs)  # shared: each worker takes the next job

    async def worker() -> None:
        for job in queue:
            if time.monotonic() >= deadline:
                return
            await send(job)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def open_loop(
    jobs: Iterable[Job], send: Callable[[Job], Awaitable[None]], rate: float, deadline: float, rng: random.Random
) -> None:
    """Jobs sent at Poisson arrivals (exponential gaps of mean 1/rate), whatever is in flight."""
    tasks = []
    next_at = time.monotonic()
    for job in jobs:
        if next_at >= deadline:
            break
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        tasks.append(asyncio.create_task(send(job)))
        next_at += rng.expovariate(rate)
    await asyncio.gather(*tasks)


SendRequest = Callable[[Prompt, RequestParams], Awaitable[Record]]


def level_summaries(level: LevelResult, arms: Iterable[Arm], slo: SLO) -> dict[str, ArmSummary]:
    names = [a.name for a in arms]
    out = {}
    for name in names:
        records = level.records(name)
        wall = level.arm_seconds.get(name, level.duration / len(names))
        out[name] = summarize(records, busy_seconds([r.end - r.start for r in records], level.load.concurrency, wall),
                              slo)  # fmt: skip
    return out


# what paired_rounds counts of a round's requests
def output_tokens(record: Record) -> float:
    return record.num_output_tokens


def one_request(_: Record) -> float:
    return 1.0


def paired_rounds(
    level: LevelResult, arm: str, baseline: str, round_size: int, count: Callable[[Record], float] = output_tokens
) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """(what its requests count, their seconds) of `arm` and of `baseline` in each round
    (`round_size` request numbers) that both ran in full without an error: the paired units of
    metrics.ratio_interval. Counting output tokens, the ratio is closed-loop throughput's (tokens
    over request seconds); counting requests, it is the speedup's (mean end-to-end times)."""
    rounds: dict[int, dict[str, list[Record]]] = {}
    for s in level.requests:
        if s.arm in (arm, baseline):
            rounds.setdefault(s.number // round_size, {}).setdefault(s.arm, []).append(s.record)
    arm_units, base_units = [], []
    for by_arm in rounds.values():
        a, b = by_arm.get(arm, []), by_arm.get(baseline, [])
        if not a or len(a) != len(b) or any(r.error for r in a + b):
            continue
        arm_units.append((sum(map(count, a)), sum(r.end - r.start for r in a)))
        base_units.append((sum(map(count, b)), sum(r.end - r.start for r in b)))
    return arm_units, base_units


class LoadGenerator:
    """Runs a BenchConfig against a server."""

    def __init__(
        self,
        config: BenchConfig,
        prompts: dict[str, list[Prompt]],
        url: str,
        metrics_url: str | None = None,
        server_pid: int | None = None,
    ):
        self.config = config
        self.prompts = prompts
        self.url = url
        self.metrics_url = metrics_url
        self.server_pid = server_pid
        self.started = time.perf_counter()

    async def run(self) -> BenchResult:
        cfg = self.config
        client = TritonClient(self.url) if cfg.transport == "grpc" else None

        async def send(prompt: Prompt, params: RequestParams) -> Record:
            if client is not None:
                return await client.generate(prompt.text, params, stream=cfg.stream)
            return await http_generate(self.url, prompt.text, params, stream=cfg.stream)

        levels = []
        try:
            with progress_bar() as progress:
                await self._warm_up(send, progress)
                for workload in cfg.workloads:
                    for load in cfg.loads:
                        levels.append(await self._level(send, workload, load, progress))
        finally:
            if client is not None:
                await client.close()
        server = {"url": self.url, "transport": cfg.transport, "pid": self.server_pid, "metrics_url": self.metrics_url}
        return BenchResult(cfg, self.prompts, levels, server, self.started)

    async def _timed(self, send: SendRequest, prompt: Prompt, params: RequestParams) -> Record:
        return await within(send(prompt, params), self.config.request_timeout)

    def _seed(self, prompt: int) -> int | None:
        """Sampling: the same prompt gets the same seed in every arm; greedy needs none."""
        return None if self.config.temperature is None else self.config.seed + prompt

    async def _warm_up(self, send: SendRequest, progress) -> None:
        cfg = self.config
        if cfg.warmup <= 0:
            return
        prompts = self.prompts[cfg.workloads[0]]
        total = cfg.warmup * len(cfg.arms)
        task = progress.add_task("warm-up", total=total)

        async def one(job: Job) -> None:
            n, arm = job[0], cfg.arms[job[1]]
            p = n % len(prompts)
            salt = cache_salt("warm-up", arm, n, len(prompts))
            await self._timed(send, prompts[p], arm.params(prompts[p], cfg.temperature, cfg.top_p, self._seed(p), salt))
            progress.advance(task)

        concurrency = max((load.concurrency or 1) for load in cfg.loads)
        deadline = time.monotonic() + cfg.duration
        await closed_loop(interleaved(len(cfg.arms), cfg.warmup), one, concurrency, deadline)

    async def _level(self, send: SendRequest, workload: str, load: Load, progress) -> LevelResult:
        cfg = self.config
        prompts = self.prompts[workload]
        arms = cfg.arms
        sent: list[Sent] = []
        label = f"{workload} {load.label}"
        task = progress.add_task(label, total=cfg.num_requests * len(arms))
        level_start = time.perf_counter()

        async def one(job: Job) -> None:
            n, arm = job[0], arms[job[1]]
            p = n % len(prompts)
            prompt, salt = prompts[p], cache_salt(label, arm, n, len(prompts))
            record = await self._timed(
                send, prompt, arm.params(prompt, cfg.temperature, cfg.top_p, self._seed(p), salt)
            )
            sent.append(Sent(arm.name, n, p, prompt.kind, record))
            progress.update(task, advance=1, description=f"{label}  {self._live(sent, load, level_start)}")

        before = scrape(self.metrics_url) if self.metrics_url else None
        memory_before = memory_snapshot(self.server_pid) if self.server_pid else {}
        sampler = MemorySampler(self.server_pid)
        stop = asyncio.Event()
        sampling = asyncio.create_task(sampler.run(stop))
        deadline = time.monotonic() + cfg.duration
        rng = random.Random(cfg.seed)
        arm_seconds: dict[str, float] = {}

        async def run(jobs: Iterable[Job]) -> None:
            if load.concurrency is not None:
                await closed_loop(jobs, one, load.concurrency, deadline)
            else:
                await open_loop(jobs, one, load.rate, deadline, rng)

        try:
            if cfg.interleave == "block":
                for block in blocks(len(arms), cfg.num_requests, cfg.round_size(load)):
                    if time.monotonic() >= deadline:
                        break
                    start = time.perf_counter()
                    await run(block)
                    name = arms[block[0][1]].name
                    arm_seconds[name] = arm_seconds.get(name, 0.0) + time.perf_counter() - start
            else:
                await run(interleaved(len(arms), cfg.num_requests))
        finally:
            stop.set()
            await sampling
        duration = time.perf_counter() - level_start
        after = scrape(self.metrics_url) if self.metrics_url else None
        return LevelResult(
            workload=workload,
            load=load,
            started=level_start - self.started,
            duration=duration,
            requests=sent,
            counters=delta(before, after) if before is not None and after is not None else None,
            memory_before=memory_before,
            memory_peak=peak(sampler.snapshots),
            gpu_memory_bytes=gpu_memory_bytes(after) if after is not None else None,
            arm_seconds=arm_seconds,
        )

    def _live(self, sent: list[Sent], load: Load, level_start: float) -> str:
        """Output tokens/s so far per arm, for the progress line."""
        elapsed = time.perf_counter() - level_start
        level = LevelResult("", load, 0.0, elapsed, sent, None, {}, {}, None)
        summaries = level_summaries(level, self.config.arms, SLO())
        return "  ".join(f"{name} {s.output_throughput:.1f} tok/s" for name, s in summaries.items() if s.requests)


def run_bench(
    config: BenchConfig,
    prompts: dict[str, list[Prompt]],
    url: str,
    metrics_url: str | None = None,
    server_pid: int | None = None,
) -> BenchResult:
    return asyncio.run(LoadGenerator(config, prompts, url, metrics_url, server_pid).run())
