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

Faults: a request that fails in any way (the server unreachable or gone mid-stream, a timeout, an
error the server answers with) is recorded as failed with its reason (`failure_reason`), and the
run goes on. After a failure the closed loop's worker pauses before its next request (0.25 s,
doubling with each failure in a row up to 4 s), so that a server that is down is not sent the
rest of the level in a burst of instant refusals; a gRPC failure also gives the next requests a
new channel (GrpcSender).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
import traceback
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

import aiohttp
import grpc
from tritonclient.utils import InferenceServerException

from specdec.client.client import Access, Record, RequestParams, TritonClient, http_generate, openai_generate
from specdec.client.metrics import SLO, ArmSummary, benchmark_duration, last_response, summarize
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
from specdec.progress import console, progress_bar


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


SLO_NAMES = {  # --goodput names: vllm bench serve's, and genai-perf's own
    "ttft": "time_to_first_token",
    "tpot": "inter_token_latency",
    "e2el": "request_latency",
    "time_to_first_token": "time_to_first_token",
    "inter_token_latency": "inter_token_latency",
    "request_latency": "request_latency",
}


def parse_slo(items: Iterable[str]) -> SLO:
    """--goodput in milliseconds, in vllm bench serve's form (`ttft:MS tpot:MS e2el:MS`) or
    genai-perf's (`time_to_first_token:MS inter_token_latency:MS request_latency:MS`)."""
    limits: dict[str, float] = {}
    for item in items:
        key, _, value = item.partition(":")
        if key not in SLO_NAMES or not value:
            raise ValueError(f"goodput {item!r}: expected NAME:MS, NAME one of {', '.join(SLO_NAMES)}")
        limits[SLO_NAMES[key]] = float(value)
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
    transport: str = "grpc"  # grpc | http | openai (a key of SENDERS)
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
    reason: str | None = None  # why it failed (failure_reason)
    input_tokens: int | None = None  # the prompt's tokens; None: not known (no tokenizer)

    @property
    def failure(self) -> str | None:
        """Why the request failed; None: it succeeded."""
        return None if self.record.error is None else self.reason or "server error"


@dataclass
class LevelResult:
    workload: str
    load: Load
    started: float  # seconds since the run started
    duration: float
    requests: list[Sent]
    # the server's counters, after - before; None: no metrics endpoint, or the server restarted
    counters: Samples | None
    memory_before: dict[str, ProcessMemory]
    memory_peak: dict[str, ProcessMemory]
    gpu_memory_bytes: float | None
    # block mode: per arm, the sum of its blocks' benchmark_duration (the time it had the server alone)
    arm_seconds: dict[str, float] = field(default_factory=dict)

    def records(self, arm: str) -> list[Record]:
        return [s.record for s in self.requests if s.arm == arm]

    def sent(self, arm: str) -> list[Sent]:
        return [s for s in self.requests if s.arm == arm]


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

    @property
    def failures(self) -> Counter[str]:
        """Failed requests by reason, over every level."""
        return Counter(s.failure for level in self.levels for s in level.requests if s.failure)


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


def arm_duration(level: LevelResult, arm: str, num_arms: int) -> float:
    """An arm's benchmark_duration in a level: genai-perf's (the last response - the first
    request sent) over each stretch in which the arm had the server alone, its blocks (block
    mode) or the level when it is the level's only arm. Arms that share the server request by
    request have no such stretch; each is given its share of the level: closed loop at C, its
    requests' time over the C slots (Little's law: what C users of that arm get at the latencies
    measured under this load), open loop, the level's time over the arms."""
    records = level.records(arm)
    if arm in level.arm_seconds:
        return level.arm_seconds[arm]
    if num_arms == 1:
        return benchmark_duration(records)
    if level.load.concurrency is not None:
        return sum(r.end - r.start for r in records) / level.load.concurrency
    return level.duration / num_arms


def level_summaries(level: LevelResult, arms: Iterable[Arm], slo: SLO) -> dict[str, ArmSummary]:
    names = [a.name for a in arms]
    out = {}
    for name in names:
        sent = level.sent(name)
        duration = arm_duration(level, name, len(names))
        out[name] = summarize([s.record for s in sent], duration, slo, [s.input_tokens for s in sent])
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
        arm_units.append((sum(map(count, a)), sum(last_response(r) - r.start for r in a)))
        base_units.append((sum(map(count, b)), sum(last_response(r) - r.start for r in b)))
    return arm_units, base_units


# --- faults ---------------------------------------------------------------------------------------
class Sender(Protocol):
    """Sends one request; raises what its transport raises."""

    async def __call__(self, prompt: Prompt, params: RequestParams) -> Record: ...

    async def close(self) -> None: ...


class GrpcSender:
    """Requests through a TritonClient (gRPC), replaced by a new one after a request failed with
    an exception: a channel whose server went away tries to connect again only on a growing
    backoff (5 s after an outage of 20 s, longer after longer ones), a new channel at once. The
    old client is closed when its last request in flight has ended (closing a channel cancels
    its calls)."""

    def __init__(self, url: str, stream: bool, connect: Callable[[str], TritonClient] = TritonClient,
                 access: Access | None = None):  # fmt: skip
        """access: TLS and headers for the default connect (a TritonClient)."""
        self.url = url
        self.stream = stream
        self.connect = connect if access is None else partial(connect, access=access)
        self.client = connect(url)
        self.in_flight: Counter[TritonClient] = Counter()

    async def __call__(self, prompt: Prompt, params: RequestParams) -> Record:
        client = self.client
        self.in_flight[client] += 1
        try:
            return await client.generate(prompt.text, params, stream=self.stream)
        except Exception:
            if client is self.client:
                self.client = self.connect(self.url)
            raise
        finally:
            self.in_flight[client] -= 1
            if client is not self.client and self.in_flight[client] == 0:
                del self.in_flight[client]
                await _close_quietly(client)

    async def close(self) -> None:
        for client in {self.client, *self.in_flight}:
            await _close_quietly(client)


async def _close_quietly(client: TritonClient) -> None:
    with contextlib.suppress(Exception):  # a channel to a dead server may fail to close: nothing to do
        await client.close()


@dataclass
class HttpSender:
    """Requests over HTTP (generate / generate_stream), a connection each."""

    url: str
    stream: bool
    access: Access = field(default_factory=Access)  # its headers (restricted HTTP APIs)

    async def __call__(self, prompt: Prompt, params: RequestParams) -> Record:
        return await http_generate(self.url, prompt.text, params, stream=self.stream, access=self.access)

    async def close(self) -> None:
        pass


class OpenAISender:
    """Requests through the OpenAI-compatible API (`url`: its host:port), on one connection pool;
    the model is the one the server lists."""

    def __init__(self, url: str, stream: bool, access: Access | None = None):
        """access: unused (the OpenAI frontend holds Triton's TLS and keys itself)."""
        self.base_url = f"http://{url}/v1"
        self.stream = stream
        self.session: aiohttp.ClientSession | None = None
        self.model: str | None = None

    async def __call__(self, prompt: Prompt, params: RequestParams) -> Record:
        if self.session is None:
            self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        if self.model is None:
            async with self.session.get(f"{self.base_url}/models") as resp:
                resp.raise_for_status()
                self.model = (await resp.json())["data"][0]["id"]
        return await openai_generate(self.session, self.base_url, self.model, prompt.text, params, self.stream)

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()


# each called (url, stream, access=...)
SENDERS: dict[str, Callable[..., Sender]] = {"grpc": GrpcSender, "http": HttpSender, "openai": OpenAISender}


def failure_reason(err: BaseException) -> str:
    """A failed request's reason, short and fixed enough to count requests by."""
    if isinstance(err, TimeoutError):
        return "timeout"
    if isinstance(err, grpc.RpcError) and callable(getattr(err, "code", None)):
        return f"gRPC {err.code().name}"
    if isinstance(err, InferenceServerException):
        status = err.status()  # "StatusCode.UNAVAILABLE", or None for the server's own errors
        return f"gRPC {status.rpartition('.')[2]}" if status else "server error"
    if isinstance(err, aiohttp.ClientConnectorError | ConnectionRefusedError):
        return "cannot connect"
    if isinstance(err, aiohttp.ServerDisconnectedError | ConnectionResetError | BrokenPipeError):
        return "connection lost"
    if isinstance(err, aiohttp.ClientPayloadError | json.JSONDecodeError):
        return "response cut off"
    if isinstance(err, aiohttp.ClientError | OSError):
        return type(err).__name__
    return f"unexpected {type(err).__name__}"


def _message(err: BaseException) -> str:
    details = getattr(err, "details", None)  # gRPC's errors: their str() is a multi-line dump
    return str(details() if isinstance(err, grpc.RpcError) and callable(details) else err)


# reasons that say the server could not be reached: it may have restarted, its counts with it
UNREACHABLE = frozenset({"gRPC UNAVAILABLE", "cannot connect", "connection lost", "response cut off"})


def counters_over(before: Samples | None, after: Samples | None, reasons: Iterable[str | None] = ()) -> Samples | None:
    """The server's counters over a level, after - before; None when either scrape failed, or
    when the server may have restarted during the level: a counter went down, or a request
    failed for want of the server (a restarted server counts again from 0, and may have counted
    past the old one's figures by the level's end)."""
    if before is None or after is None or UNREACHABLE.intersection(reasons):
        return None
    if any(key[0].endswith("_total") and after.get(key, value) < value for key, value in before.items()):
        return None
    return delta(before, after)


PAUSE_FIRST, PAUSE_MAX = 0.25, 4.0  # seconds a closed-loop worker waits after a failure


def pause(failures_in_a_row: int) -> float:
    """Seconds a closed-loop worker waits before its next request, after the n-th failure in a row."""
    return min(PAUSE_MAX, PAUSE_FIRST * 2 ** (failures_in_a_row - 1))


class LoadGenerator:
    """Runs a BenchConfig against a server."""

    def __init__(
        self,
        config: BenchConfig,
        prompts: dict[str, list[Prompt]],
        url: str,
        metrics_url: str | None = None,
        server_pid: int | None = None,
        input_lengths: dict[str, list[int]] | None = None,
        sender: Sender | None = None,
        access: Access | None = None,
    ):
        """input_lengths: per workload, each prompt's tokens (input_sequence_length); sender: how
        requests go out (default: the config's transport to `url`, with `access`: TLS, headers)."""
        self.access = access or Access()
        self.config = config
        self.prompts = prompts
        self.url = url
        self.metrics_url = metrics_url
        self.server_pid = server_pid
        self.input_lengths = input_lengths or {}
        self.sender = sender
        self.started = time.perf_counter()
        self.failures_in_a_row = 0
        self.unexpected_shown = False

    async def run(self) -> BenchResult:
        cfg = self.config
        if self.sender is None:
            self.sender = SENDERS[cfg.transport](self.url, cfg.stream, access=self.access)
        levels = []
        try:
            with progress_bar() as progress:
                await self._warm_up(progress)
                for workload in cfg.workloads:
                    for load in cfg.loads:
                        levels.append(await self._level(workload, load, progress))
        finally:
            await self.sender.close()
        server = {"url": self.url, "transport": cfg.transport, "pid": self.server_pid, "metrics_url": self.metrics_url}
        return BenchResult(cfg, self.prompts, levels, server, self.started)

    async def _attempt(self, prompt: Prompt, params: RequestParams) -> tuple[Record, str | None]:
        """One request, bounded by request_timeout: its record and, when it failed, the reason.
        Whatever its transport raises is a failed request, never the run's end."""
        timeout = self.config.request_timeout
        start = time.perf_counter()
        try:
            record = await asyncio.wait_for(self.sender(prompt, params), timeout)
        except Exception as err:  # every failure is counted, none ends the run
            end = time.perf_counter()
            reason = failure_reason(err)
            if reason == "timeout" and end - start >= timeout:
                detail = f"timeout after {timeout:g} s"
            else:
                detail = f"{type(err).__name__}: {_message(err)}".rstrip(": ")
            if reason.startswith("unexpected") and not self.unexpected_shown:
                self.unexpected_shown = True  # not a transport's error: show where it came from, once
                console.print("".join(traceback.format_exception(err)), markup=False, highlight=False)
            return Record(start=start, end=end, error=detail), reason
        return record, None if record.error is None else "server error"

    async def _send(self, prompt: Prompt, params: RequestParams, closed_loop: bool) -> tuple[Record, str | None]:
        """_attempt, then after a failure in the closed loop the worker's pause (see the module doc)."""
        record, reason = await self._attempt(prompt, params)
        if reason is None:
            self.failures_in_a_row = 0
        else:
            self.failures_in_a_row += 1
            if closed_loop:
                await asyncio.sleep(pause(self.failures_in_a_row))
        return record, reason

    def _seed(self, prompt: int) -> int | None:
        """Sampling: the same prompt gets the same seed in every arm; greedy needs none."""
        return None if self.config.temperature is None else self.config.seed + prompt

    async def _warm_up(self, progress) -> None:
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
            params = arm.params(prompts[p], cfg.temperature, cfg.top_p, self._seed(p), salt)
            await self._send(prompts[p], params, closed_loop=True)
            progress.advance(task)

        concurrency = max((load.concurrency or 1) for load in cfg.loads)
        deadline = time.monotonic() + cfg.duration
        await closed_loop(interleaved(len(cfg.arms), cfg.warmup), one, concurrency, deadline)

    async def _level(self, workload: str, load: Load, progress) -> LevelResult:
        cfg = self.config
        prompts = self.prompts[workload]
        lengths = self.input_lengths.get(workload)
        arms = cfg.arms
        sent: list[Sent] = []
        label = f"{workload} {load.label}"
        task = progress.add_task(label, total=cfg.num_requests * len(arms))
        level_start = time.perf_counter()

        async def one(job: Job) -> None:
            n, arm = job[0], arms[job[1]]
            p = n % len(prompts)
            prompt, salt = prompts[p], cache_salt(label, arm, n, len(prompts))
            params = arm.params(prompt, cfg.temperature, cfg.top_p, self._seed(p), salt)
            record, reason = await self._send(prompt, params, closed_loop=load.concurrency is not None)
            sent.append(Sent(arm.name, n, p, prompt.kind, record, reason, lengths[p] if lengths else None))
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
                    first = len(sent)
                    await run(block)
                    name = arms[block[0][1]].name
                    span = benchmark_duration([s.record for s in sent[first:]])
                    arm_seconds[name] = arm_seconds.get(name, 0.0) + span
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
            counters=counters_over(before, after, (s.failure for s in sent)),
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
        failed = sum(s.failure is not None for s in sent)
        live = "  ".join(f"{name} {s.output_token_throughput:.1f} tok/s" for name, s in summaries.items() if s.requests)
        return live + (f"  {failed} failed" if failed else "")


def run_bench(
    config: BenchConfig,
    prompts: dict[str, list[Prompt]],
    url: str,
    metrics_url: str | None = None,
    server_pid: int | None = None,
    input_lengths: dict[str, list[int]] | None = None,
    access: Access | None = None,
) -> BenchResult:
    generator = LoadGenerator(config, prompts, url, metrics_url, server_pid, input_lengths, access=access)
    return asyncio.run(generator.run())
