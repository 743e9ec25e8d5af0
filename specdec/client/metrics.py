"""Latency, throughput and acceptance metrics: pure functions over recorded requests.

Definitions (those of `vllm bench serve` and genai-perf):
- TTFT: send -> first chunk that carries a token.
- ITL (inter-token latency): the gap between consecutive token-carrying chunks of a stream, what a
  reader of the stream waits. A speculative round delivers several tokens in one chunk, so with
  speculation ITL grows while TPOT falls.
- TPOT (time per output token): (end-to-end - TTFT) / (output tokens - 1), per request.
- End-to-end: send -> the stream's end.
- Throughput of an arm: closed loop at concurrency C, C x tokens / sum of the arm's request
  times (Little's law: what C users of that arm get at the latencies measured under this load);
  open loop, the arm's tokens over its share of the level's wall time. Both are the plain
  wall-clock throughput when a level runs a single arm.
- Acceptance rate: accepted / drafted tokens; mean accepted length: accepted / rounds + 1 (tokens
  a drafted round yields); per draft position i: accepted at i / drafted at i, from the
  per-round differences of the totals each streamed response carries.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from specdec.client.client import Record


@dataclass(frozen=True)
class Stats:
    mean: float
    p50: float
    p90: float
    p99: float
    count: int


def stats(values: Iterable[float]) -> Stats | None:
    arr = np.asarray(list(values), dtype=np.float64)
    if arr.size == 0:
        return None
    p50, p90, p99 = np.percentile(arr, [50, 90, 99])
    return Stats(float(arr.mean()), float(p50), float(p90), float(p99), int(arr.size))


@dataclass(frozen=True)
class RequestMetrics:
    output_tokens: int
    e2e: float
    ttft: float | None  # None: no token arrived
    tpot: float | None  # None: fewer than two tokens
    itl: list[float]
    draft_tokens: int
    accepted_tokens: int
    draft_rounds: int
    drafted_at: list[int]  # per draft position (1-based position i at index i-1)
    accepted_at: list[int]


def tokens_per_chunk(record: Record) -> list[int]:
    """How many tokens each response brought (differences of its cumulative output tokens)."""
    counts = [t[0] for t in record.totals]
    return [now - before for before, now in zip([0, *counts], counts, strict=False)]


def per_position(record: Record) -> tuple[list[int], list[int]]:
    """Drafted and accepted tokens by draft position, from the responses that each carried one
    drafted round (streamed responses do); responses that aggregate rounds are left out."""
    drafted: list[int] = []
    accepted: list[int] = []
    before = (0, 0, 0, 0)
    for now in record.totals:
        d_draft, d_accepted, d_rounds = (now[i] - before[i] for i in (1, 2, 3))
        before = now
        if d_rounds != 1:
            continue
        grow = max(0, d_draft - len(drafted))
        drafted += [0] * grow
        accepted += [0] * grow
        for i in range(d_draft):
            drafted[i] += 1
            accepted[i] += i < d_accepted
    return drafted, accepted


def request_metrics(record: Record) -> RequestMetrics:
    arrivals = [t for (t, _), n in zip(record.chunks, tokens_per_chunk(record), strict=False) if n > 0]
    n = record.num_output_tokens
    e2e = record.end - record.start
    ttft = arrivals[0] - record.start if arrivals else None
    drafted, accepted = per_position(record)
    return RequestMetrics(
        output_tokens=n,
        e2e=e2e,
        ttft=ttft,
        tpot=(e2e - ttft) / (n - 1) if ttft is not None and n > 1 else None,
        itl=[b - a for a, b in itertools.pairwise(arrivals)],
        draft_tokens=record.total_draft_tokens,
        accepted_tokens=record.total_accepted_draft_tokens,
        draft_rounds=record.total_draft_rounds,
        drafted_at=drafted,
        accepted_at=accepted,
    )


@dataclass(frozen=True)
class SLO:
    """Service-level objectives in seconds; a request meets them when it succeeded and every
    objective that is set holds."""

    ttft: float | None = None
    tpot: float | None = None
    e2e: float | None = None

    @property
    def is_set(self) -> bool:
        return any(v is not None for v in (self.ttft, self.tpot, self.e2e))

    def met(self, m: RequestMetrics) -> bool:
        checks = ((self.ttft, m.ttft), (self.tpot, m.tpot), (self.e2e, m.e2e))
        return all(limit is None or (value is not None and value <= limit) for limit, value in checks)


@dataclass(frozen=True)
class ArmSummary:
    requests: int
    errors: int
    output_tokens: int
    busy_seconds: float  # the wall time the throughputs divide by (see the module doc)
    ttft: Stats | None
    itl: Stats | None
    tpot: Stats | None
    e2e: Stats | None
    output_throughput: float  # tokens / s
    request_throughput: float  # successful requests / s
    goodput: float | None  # requests meeting the SLO / s; None without SLO
    slo_attainment: float | None
    acceptance_rate: float | None  # None: nothing was drafted
    mean_accepted_length: float | None
    draft_tokens: int
    accepted_tokens: int
    draft_rounds: int
    acceptance_per_position: list[float] = field(default_factory=list)
    drafted_per_position: list[int] = field(default_factory=list)


def busy_seconds(e2e_times: Sequence[float], concurrency: int | None, wall_seconds: float) -> float:
    """The time an arm's throughput divides by: closed loop, its request time spread over the C
    slots (Little's law); open loop, the wall time that was the arm's."""
    if concurrency is not None:
        return sum(e2e_times) / concurrency
    return wall_seconds


def summarize(records: Sequence[Record], busy: float, slo: SLO | None = None) -> ArmSummary:
    slo = slo or SLO()
    ok = [r for r in records if r.error is None]
    metrics = [request_metrics(r) for r in ok]
    tokens = sum(m.output_tokens for m in metrics)
    drafted = sum(m.draft_tokens for m in metrics)
    accepted = sum(m.accepted_tokens for m in metrics)
    rounds = sum(m.draft_rounds for m in metrics)
    width = max((len(m.drafted_at) for m in metrics), default=0)
    drafted_at = [sum(m.drafted_at[i] for m in metrics if i < len(m.drafted_at)) for i in range(width)]
    accepted_at = [sum(m.accepted_at[i] for m in metrics if i < len(m.accepted_at)) for i in range(width)]
    met = sum(slo.met(m) for m in metrics)

    def rate(count: float) -> float:
        return count / busy if busy > 0 else 0.0

    return ArmSummary(
        requests=len(records),
        errors=len(records) - len(ok),
        output_tokens=tokens,
        busy_seconds=busy,
        ttft=stats(m.ttft for m in metrics if m.ttft is not None),
        itl=stats(gap for m in metrics for gap in m.itl),
        tpot=stats(m.tpot for m in metrics if m.tpot is not None),
        e2e=stats(m.e2e for m in metrics),
        output_throughput=rate(tokens),
        request_throughput=rate(len(ok)),
        goodput=rate(met) if slo.is_set else None,
        slo_attainment=met / len(records) if slo.is_set and records else None,
        acceptance_rate=accepted / drafted if drafted else None,
        mean_accepted_length=accepted / rounds + 1 if rounds else None,
        draft_tokens=drafted,
        accepted_tokens=accepted,
        draft_rounds=rounds,
        acceptance_per_position=[a / d for a, d in zip(accepted_at, drafted_at, strict=True)],
        drafted_per_position=drafted_at,
    )


def ratio_interval(
    arm: Sequence[tuple[float, float]],
    baseline: Sequence[tuple[float, float]],
    confidence: float = 0.95,
    resamples: int = 4000,
    seed: int = 0,
    min_units: int = 8,
) -> tuple[float, float] | None:
    """A paired percentile-bootstrap interval for the arm's rate over the baseline's, (sum of
    the arm's amounts / sum of its seconds) / (the baseline's), from units i that both ran alike
    (rounds of the same requests): arm[i] and baseline[i] are (amount, seconds), the amount
    output tokens for throughput, requests for the speedup of mean end-to-end times.
    Resampling whole pairs keeps what a unit's two halves share: its prompts, and the machine's
    speed of the moment. Units of different prompts spread the interval by how differently the
    prompts fare, as another set of prompts would. None with fewer than `min_units`: over a
    handful of units the bootstrap understates the spread."""
    if len(arm) != len(baseline):
        raise ValueError(f"{len(arm)} units of the arm against {len(baseline)} of the baseline")
    if len(arm) < min_units:
        return None
    a, b = np.asarray(arm, dtype=np.float64), np.asarray(baseline, dtype=np.float64)  # (units, 2)
    picks = np.random.default_rng(seed).integers(0, len(a), size=(resamples, len(a)))
    a_sum, b_sum = a[picks].sum(axis=1), b[picks].sum(axis=1)  # (resamples, 2)
    ratios = (a_sum[:, 0] / a_sum[:, 1]) / (b_sum[:, 0] / b_sum[:, 1])
    tail = (1 - confidence) / 2
    low, high = np.quantile(ratios, [tail, 1 - tail])
    return float(low), float(high)


def speedup(baseline: ArmSummary, arm: ArmSummary) -> float | None:
    """Baseline mean end-to-end time over the arm's, on the same prompts under the same load."""
    if baseline.e2e is None or arm.e2e is None or arm.e2e.mean <= 0:
        return None
    return baseline.e2e.mean / arm.e2e.mean
