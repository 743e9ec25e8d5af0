"""Latency, throughput and acceptance metrics: pure functions over recorded requests.

Names, definitions and units are genai-perf's (perf_analyzer repo, genai-perf/genai_perf/
profile_data_parser/llm_profile_data_parser.py::_parse_requests and metrics/, branch r25.12):
times in milliseconds. A response here is one that carried outputs; the first and second
responses are the first two that carried a token. Per request:
- request_latency: the last response - the request sent.
- time_to_first_token: the first response - the request sent.
- time_to_second_token: the second response - the first (two responses or more).
- inter_token_latency: (request_latency - time_to_first_token) / (output tokens - 1), with two
  responses or more and two output tokens or more (vLLM's TPOT is the same formula).
- output_token_throughput_per_user: 1 / inter_token_latency, tokens/s.
- output_sequence_length: the output tokens the server counted (genai-perf tokenizes the text
  again); input_sequence_length: the prompt text's tokens, without the chat template, as
  genai-perf counts them.
- inter_chunk_latency (ours): the gaps between consecutive responses that carried a token, what
  a reader of the stream waits. A speculative round brings several tokens in one response, so
  with speculation this gap grows while inter_token_latency falls.
Per arm and load level, over its requests that succeeded:
- benchmark_duration (s): the last response of any request - the first request sent (which
  stretches of a level are an arm's: loadgen.arm_duration);
- output_token_throughput: sum(output_sequence_length) / benchmark_duration, tokens/s;
- request_throughput: requests / benchmark_duration; request_goodput: requests meeting every
  SLO / benchmark_duration; request_count: requests.
Statistics of a per-request metric are genai-perf's (metrics/statistics.py): avg, p1 ... p99
(numpy's linear percentiles), min, max, std (population).
Acceptance (ours): accepted / drafted tokens; mean accepted length: accepted / rounds + 1 (tokens
a drafted round yields); per draft position i: accepted at i / drafted at i, from the per-round
differences of the totals each streamed response carries.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from specdec.client.client import Record

MS = 1000.0  # milliseconds a second
PERCENTILES = (1, 5, 10, 25, 50, 75, 90, 95, 99)


@dataclass(frozen=True)
class Stats:
    """genai-perf's statistics of a per-request metric, in its order."""

    avg: float
    p1: float
    p5: float
    p10: float
    p25: float
    p50: float
    p75: float
    p90: float
    p95: float
    p99: float
    min: float
    max: float
    std: float  # population (numpy's default, as genai-perf)
    count: int


def stats(values: Iterable[float]) -> Stats | None:
    arr = np.asarray(list(values), dtype=np.float64)
    if arr.size == 0:
        return None
    percentiles = (float(p) for p in np.percentile(arr, PERCENTILES))
    return Stats(float(arr.mean()), *percentiles, float(arr.min()), float(arr.max()), float(arr.std()), int(arr.size))


@dataclass(frozen=True)
class RequestMetrics:
    request_latency: float  # ms
    time_to_first_token: float | None  # ms; None: no token arrived
    time_to_second_token: float | None  # ms; None: fewer than two responses
    inter_token_latency: float | None  # ms; None: fewer than two responses or two tokens
    output_sequence_length: int
    inter_chunk_latency: list[float]  # ms
    draft_tokens: int
    accepted_tokens: int
    draft_rounds: int
    drafted_at: list[int]  # per draft position (1-based position i at index i-1)
    accepted_at: list[int]

    @property
    def output_token_throughput_per_user(self) -> float | None:
        """Tokens/s one user of the stream gets after its first token."""
        return MS / self.inter_token_latency if self.inter_token_latency else None


def tokens_per_chunk(record: Record) -> list[int]:
    """How many tokens each response brought (differences of its cumulative output tokens)."""
    counts = [t[0] for t in record.totals]
    return [now - before for before, now in zip([0, *counts], counts, strict=False)]


def last_response(record: Record) -> float:
    """When the request's last response arrived (its end, when none did)."""
    return record.chunks[-1][0] if record.chunks else record.end


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
    latency = (last_response(record) - record.start) * MS
    ttft = (arrivals[0] - record.start) * MS if arrivals else None
    several = len(arrivals) > 1
    drafted, accepted = per_position(record)
    return RequestMetrics(
        request_latency=latency,
        time_to_first_token=ttft,
        time_to_second_token=(arrivals[1] - arrivals[0]) * MS if several else None,
        inter_token_latency=(latency - ttft) / (n - 1) if several and n > 1 else None,
        output_sequence_length=n,
        inter_chunk_latency=[(b - a) * MS for a, b in itertools.pairwise(arrivals)],
        draft_tokens=record.total_draft_tokens,
        accepted_tokens=record.total_accepted_draft_tokens,
        draft_rounds=record.total_draft_rounds,
        drafted_at=drafted,
        accepted_at=accepted,
    )


@dataclass(frozen=True)
class SLO:
    """Service-level objectives in milliseconds; a request meets them when it succeeded and every
    objective that is set holds."""

    time_to_first_token: float | None = None
    inter_token_latency: float | None = None
    request_latency: float | None = None

    @property
    def is_set(self) -> bool:
        return any(v is not None for v in (self.time_to_first_token, self.inter_token_latency, self.request_latency))

    def met(self, m: RequestMetrics) -> bool:
        checks = (
            (self.time_to_first_token, m.time_to_first_token),
            (self.inter_token_latency, m.inter_token_latency),
            (self.request_latency, m.request_latency),
        )
        return all(limit is None or (value is not None and value <= limit) for limit, value in checks)


@dataclass(frozen=True)
class ArmSummary:
    requests: int  # sent, the failed ones included
    errors: int  # failed
    request_count: int  # succeeded: what every figure below is over
    benchmark_duration: float  # seconds, what the throughputs divide by (see the module doc)
    request_latency: Stats | None  # ms
    time_to_first_token: Stats | None  # ms
    time_to_second_token: Stats | None  # ms
    inter_token_latency: Stats | None  # ms
    output_token_throughput_per_user: Stats | None  # tokens/s
    output_sequence_length: Stats | None  # tokens
    input_sequence_length: Stats | None  # tokens; None: the prompts' lengths are not known
    inter_chunk_latency: Stats | None  # ms, over every gap of every request
    output_tokens: int  # sum of output_sequence_length
    output_token_throughput: float  # tokens/s
    request_throughput: float  # requests/s
    request_goodput: float | None  # requests meeting the SLO / s; None without SLO
    slo_attainment: float | None  # requests meeting the SLO / requests sent
    acceptance_rate: float | None  # None: nothing was drafted
    mean_accepted_length: float | None
    draft_tokens: int
    accepted_tokens: int
    draft_rounds: int
    acceptance_per_position: list[float] = field(default_factory=list)
    drafted_per_position: list[int] = field(default_factory=list)


def benchmark_duration(records: Sequence[Record]) -> float:
    """genai-perf's benchmark_duration of these requests, seconds: the last response of any of
    them - the first one sent, over those that succeeded (as genai-perf's over those with a
    response); 0 without any."""
    ok = [r for r in records if r.error is None]
    if not ok:
        return 0.0
    return max(last_response(r) for r in ok) - min(r.start for r in ok)


def summarize(
    records: Sequence[Record],
    duration: float,
    slo: SLO | None = None,
    input_lengths: Sequence[int | None] | None = None,
) -> ArmSummary:
    """An arm's figures over `duration` seconds (its benchmark_duration); input_lengths[i]: the
    prompt tokens of records[i], None where not known."""
    slo = slo or SLO()
    lengths = list(input_lengths) if input_lengths is not None else [None] * len(records)
    ok = [(r, n) for r, n in zip(records, lengths, strict=True) if r.error is None]
    metrics = [request_metrics(r) for r, _ in ok]
    tokens = sum(m.output_sequence_length for m in metrics)
    drafted = sum(m.draft_tokens for m in metrics)
    accepted = sum(m.accepted_tokens for m in metrics)
    rounds = sum(m.draft_rounds for m in metrics)
    width = max((len(m.drafted_at) for m in metrics), default=0)
    drafted_at = [sum(m.drafted_at[i] for m in metrics if i < len(m.drafted_at)) for i in range(width)]
    accepted_at = [sum(m.accepted_at[i] for m in metrics if i < len(m.accepted_at)) for i in range(width)]
    met = sum(slo.met(m) for m in metrics)

    def rate(count: float) -> float:
        return count / duration if duration > 0 else 0.0

    def present(values: Iterable[float | None]) -> list[float]:
        return [v for v in values if v is not None]

    return ArmSummary(
        requests=len(records),
        errors=len(records) - len(ok),
        request_count=len(ok),
        benchmark_duration=duration,
        request_latency=stats(m.request_latency for m in metrics),
        time_to_first_token=stats(present(m.time_to_first_token for m in metrics)),
        time_to_second_token=stats(present(m.time_to_second_token for m in metrics)),
        inter_token_latency=stats(present(m.inter_token_latency for m in metrics)),
        output_token_throughput_per_user=stats(present(m.output_token_throughput_per_user for m in metrics)),
        output_sequence_length=stats(m.output_sequence_length for m in metrics),
        input_sequence_length=stats(present(n for _, n in ok)),
        inter_chunk_latency=stats(gap for m in metrics for gap in m.inter_chunk_latency),
        output_tokens=tokens,
        output_token_throughput=rate(tokens),
        request_throughput=rate(len(ok)),
        request_goodput=rate(met) if slo.is_set else None,
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
    output tokens for throughput, requests for the speedup of mean request latencies.
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
    """Baseline mean request_latency over the arm's, on the same prompts under the same load."""
    if baseline.request_latency is None or arm.request_latency is None or arm.request_latency.avg <= 0:
        return None
    return baseline.request_latency.avg / arm.request_latency.avg
