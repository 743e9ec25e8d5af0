"""A benchmark run's report: JSON (every request's timestamps and the aggregates), CSV summary,
Markdown tables (terminal and README), PNG plots, and per workload, level and arm the same
figures in genai-perf's export layouts (profile_export_genai_perf.json and .csv).

The summary rows are one per workload, load level and arm. Beside the client's numbers stand the
server's own (its Prometheus counters over the same level) and its memory, so that the two
accounts can be checked against each other and the memory cost of speculation is in view.
Failed requests are counted by reason; every other figure is over the requests that succeeded.
"""

from __future__ import annotations

import csv
import json
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich import box
from rich.table import Table

from specdec.client.loadgen import (
    BASELINE,
    BenchResult,
    LevelResult,
    Load,
    Sent,
    level_summaries,
    one_request,
    paired_rounds,
)
from specdec.client.machine import summary_line
from specdec.client.metrics import ArmSummary, Stats, ratio_interval, request_metrics, speedup, summarize
from specdec.client.server_stats import proposer_counters

MIB = 2**20


@dataclass(frozen=True)
class Row:
    workload: str
    load: Load
    arm: str
    summary: ArmSummary
    speedup: float | None  # baseline mean end-to-end / this arm's; None for the baseline itself
    same_text: tuple[int, int]  # (outputs equal to the baseline's for the same prompt, outputs compared)
    # the speedup's 95% interval, a paired bootstrap over the level's rounds; None: under 8 rounds
    speedup_interval: tuple[float, float] | None = None
    failures: dict[str, int] = field(default_factory=dict)  # failed requests by reason

    @property
    def speedup_text(self) -> str:
        if self.speedup is None:
            return "-"
        bounds = f" ({self.speedup_interval[0]:.2f}-{self.speedup_interval[1]:.2f})" if self.speedup_interval else ""
        return f"{self.speedup:.2f}x{bounds}"


def same_text_as_baseline(level: LevelResult, arm: str) -> tuple[int, int]:
    baseline = {s.prompt: s.record.text for s in level.requests if s.arm == BASELINE.name and s.record.error is None}
    pairs = [
        (s.record.text, baseline[s.prompt])
        for s in level.requests
        if s.arm == arm and s.record.error is None and s.prompt in baseline
    ]
    return sum(a == b for a, b in pairs), len(pairs)


def rows(result: BenchResult) -> list[Row]:
    cfg = result.config
    out = []
    for level in result.levels:
        summaries = level_summaries(level, cfg.arms, cfg.slo)
        base = summaries.get(BASELINE.name)
        for arm in cfg.arms:
            s = summaries[arm.name]
            gain, bounds = None, None
            if base is not None and not arm.is_baseline:
                gain = speedup(base, s)
                units = paired_rounds(level, arm.name, BASELINE.name, cfg.round_size(level.load), count=one_request)
                bounds = ratio_interval(*units)
            same = same_text_as_baseline(level, arm.name)
            failures = failure_counts(level.sent(arm.name))
            out.append(Row(level.workload, level.load, arm.name, s, gain, same, bounds, failures))
    return out


def failure_counts(sent: Iterable[Sent]) -> dict[str, int]:
    """Failed requests by reason, the most frequent first."""
    return dict(Counter(s.failure for s in sent if s.failure).most_common())


def proposer_of(arm_name: str) -> str:
    return "none" if arm_name == BASELINE.name else arm_name.split(":")[0]


def counter_check(result: BenchResult) -> list[dict[str, object]]:
    """Per level and proposer: what the client counted beside what the server's counters say."""
    out = []
    for level in result.levels:
        if level.counters is None:
            continue
        by_proposer: dict[str, list] = defaultdict(list)
        for sent in level.requests:
            by_proposer[proposer_of(sent.arm)].append(sent.record)
        for proposer, records in sorted(by_proposer.items()):
            server = proposer_counters(level.counters, proposer)
            ok = [r for r in records if r.error is None]
            out.append(
                {
                    "workload": level.workload,
                    "load": level.load.label,
                    "proposer": proposer,
                    "requests": (len(records), server.requests),
                    "output_tokens": (sum(r.num_output_tokens for r in ok), server.output_tokens),
                    "draft_tokens": (sum(r.total_draft_tokens for r in ok), server.draft_tokens),
                    "accepted_tokens": (sum(r.total_accepted_draft_tokens for r in ok), server.accepted_tokens),
                    "server_acceptance_per_position": [
                        a / d if d else 0.0
                        for a, d in zip(server.accepted_per_position, server.drafted_per_position, strict=False)
                    ],
                }
            )
    return out


def by_task(result: BenchResult) -> list[dict[str, object]]:
    """Acceptance and speedup per task kind (summarise, chat, ...), pooled over a workload's levels."""
    cfg = result.config
    out = []
    for workload in cfg.workloads:
        levels = [lv for lv in result.levels if lv.workload == workload]
        kinds = sorted({s.kind for lv in levels for s in lv.requests})
        for kind in kinds:
            summaries = {}
            for arm in cfg.arms:
                records = [s.record for lv in levels for s in lv.requests if s.arm == arm.name and s.kind == kind]
                summaries[arm.name] = summarize(records, 0.0)
            base = summaries.get(BASELINE.name)
            for arm in cfg.arms:
                if arm.is_baseline:
                    continue
                s = summaries[arm.name]
                out.append(
                    {
                        "workload": workload,
                        "kind": kind,
                        "arm": arm.name,
                        "requests": s.requests,
                        "acceptance_rate": s.acceptance_rate,
                        "mean_accepted_length": s.mean_accepted_length,
                        "speedup": speedup(base, s) if base is not None else None,
                    }
                )
    return out


# --- JSON -----------------------------------------------------------------------------------------
def to_json(result: BenchResult, machine: dict[str, object]) -> dict[str, object]:
    cfg = result.config
    table = rows(result)

    def request(sent, t0: float) -> dict[str, object]:
        r = sent.record
        return {
            "arm": sent.arm,
            "prompt": sent.prompt,
            "kind": sent.kind,
            "start": r.start - t0,
            "end": r.end - t0,
            "error": r.error,
            "reason": sent.failure,
            "input_tokens": sent.input_tokens,
            "chunks": [[t - t0, text] for t, text in r.chunks],
            "totals": r.totals,  # per chunk: output tokens, draft tokens, accepted, drafted rounds
            "num_output_tokens": r.num_output_tokens,
            "total_draft_tokens": r.total_draft_tokens,
            "total_accepted_draft_tokens": r.total_accepted_draft_tokens,
            "total_draft_rounds": r.total_draft_rounds,
        }

    levels = []
    for level in result.levels:
        levels.append(
            {
                "workload": level.workload,
                "load": asdict(level.load) | {"label": level.load.label},
                "started": level.started,
                "duration": level.duration,
                "summary": {
                    row.arm: asdict(row.summary)
                    | {
                        "speedup": row.speedup,
                        "speedup_interval": row.speedup_interval,
                        "same_text_as_baseline": row.same_text,
                        "failures": row.failures,
                    }
                    for row in table
                    if row.workload == level.workload and row.load == level.load
                },
                "server_counters": None
                if level.counters is None
                else {
                    p: asdict(proposer_counters(level.counters, p))
                    for p in sorted({proposer_of(a.name) for a in cfg.arms})
                },
                "memory_before": {k: asdict(v) for k, v in level.memory_before.items()},
                "memory_peak": {k: asdict(v) for k, v in level.memory_peak.items()},
                "gpu_memory_bytes": level.gpu_memory_bytes,
                "requests": [request(s, result.t0) for s in level.requests],
            }
        )
    return {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine,
        "server": result.server,
        "config": asdict(cfg) | {"arms": [a.name for a in cfg.arms]},
        "prompts": {w: [asdict(p) for p in ps] for w, ps in result.prompts.items()},
        "levels": levels,
        "failures": {
            "requests": sum(len(level.requests) for level in result.levels),
            "failed": sum(result.failures.values()),
            "by_reason": dict(result.failures.most_common()),
        },
        "counter_check": counter_check(result),
        "by_task": by_task(result),
    }


# --- CSV ------------------------------------------------------------------------------------------
TIME_METRICS = ("time_to_first_token", "time_to_second_token", "inter_token_latency", "inter_chunk_latency",
                "request_latency")  # fmt: skip


def csv_row(row: Row) -> dict[str, object]:
    s = row.summary
    out: dict[str, object] = {
        "workload": row.workload,
        "concurrency": row.load.concurrency,
        "request_rate": row.load.rate,
        "arm": row.arm,
        "requests": s.requests,
        "errors": s.errors,
        "request_count": s.request_count,
        "benchmark_duration_s": s.benchmark_duration,
        "output_tokens": s.output_tokens,
        "output_token_throughput": s.output_token_throughput,
        "request_throughput": s.request_throughput,
        "request_goodput": s.request_goodput,
        "slo_attainment": s.slo_attainment,
    }
    for name in TIME_METRICS:
        stat: Stats | None = getattr(s, name)
        for q in ("avg", "p50", "p90", "p99"):
            out[f"{name}_{q}_ms"] = getattr(stat, q) if stat else None
    per_user = s.output_token_throughput_per_user
    out |= {
        "output_token_throughput_per_user_avg": per_user.avg if per_user else None,
        "output_token_throughput_per_user_p50": per_user.p50 if per_user else None,
        "output_sequence_length_avg": s.output_sequence_length.avg if s.output_sequence_length else None,
        "input_sequence_length_avg": s.input_sequence_length.avg if s.input_sequence_length else None,
        "acceptance_rate": s.acceptance_rate,
        "mean_accepted_length": s.mean_accepted_length,
        "acceptance_per_position": " ".join(f"{x:.4f}" for x in s.acceptance_per_position),
        "speedup": row.speedup,
        "speedup_low": row.speedup_interval[0] if row.speedup_interval else None,
        "speedup_high": row.speedup_interval[1] if row.speedup_interval else None,
        "same_text_as_baseline": f"{row.same_text[0]}/{row.same_text[1]}",
        "failures": "; ".join(f"{reason}: {n}" for reason, n in row.failures.items()),
    }
    return out


def write_csv(table: Sequence[Row], path: Path) -> None:
    lines = [csv_row(r) for r in table]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(lines[0]) if lines else ["workload"])
        writer.writeheader()
        writer.writerows(lines)


# --- Markdown -------------------------------------------------------------------------------------
def _ms(stat: Stats | None, *qs: str) -> str:
    """Statistics of a metric in milliseconds, as whole milliseconds."""
    return " / ".join(f"{getattr(stat, q):.0f}" for q in qs) if stat else "-"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _num(x: float | None, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt)


def _table(header: Sequence[str], lines: Iterable[Sequence[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(line) + " |" for line in lines]
    return "\n".join(out)


def sampling_line(temperature: float | None, top_p: float | None) -> str:
    if temperature is None:
        return "greedy"
    return f"temperature {temperature}" + ("" if top_p is None else f", top_p {top_p}")


def markdown(result: BenchResult, machine: dict[str, object]) -> str:
    cfg = result.config
    table = rows(result)
    loop = "closed loop" if any(ld.concurrency for ld in cfg.loads) else "open loop"
    if cfg.interleave == "block":
        turns = "in alternating blocks (each arm alone on the server)"
    else:
        turns = "interleaved request by request (the arms share the server)"
    parts = [
        f"Machine: {summary_line(machine)}. Arms: {', '.join(a.name for a in cfg.arms)}, on the same prompts, "
        f"{turns}; "
        f"{loop}; {cfg.num_requests} requests per arm and level; "
        f"{sampling_line(cfg.temperature, cfg.top_p)}; "
        f"{'streamed' if cfg.stream else 'not streamed'} over {cfg.transport}.",
        *failures_markdown(result, table),
        "",
        "Metrics as genai-perf defines them (docs/load-generator.md), times in ms: TTFT time_to_first_token, "
        "ITL inter_token_latency ((request latency - TTFT) / (output tokens - 1)), inter-chunk: the gap between "
        "two responses (a speculative one brings several tokens), latency: request_latency; throughputs over "
        "each arm's benchmark_duration.",
        "",
        _table(
            [
                "workload",
                "load",
                "arm",
                "requests (failed)",
                "output tok/s",
                "req/s",
                "TTFT p50 / p99",
                "ITL p50 / p99",
                "inter-chunk p50 / p99",
                "latency p50 / p99",
                *(["goodput req/s"] if cfg.slo.is_set else []),
                "speedup (95% interval)",
                "same text as baseline",
            ],
            [
                [
                    r.workload,
                    r.load.label,
                    r.arm,
                    f"{r.summary.requests} ({r.summary.errors})",
                    f"{r.summary.output_token_throughput:.1f}",
                    f"{r.summary.request_throughput:.2f}",
                    _ms(r.summary.time_to_first_token, "p50", "p99"),
                    _ms(r.summary.inter_token_latency, "p50", "p99"),
                    _ms(r.summary.inter_chunk_latency, "p50", "p99"),
                    _ms(r.summary.request_latency, "p50", "p99"),
                    *([_num(r.summary.request_goodput)] if cfg.slo.is_set else []),
                    r.speedup_text,
                    f"{r.same_text[0]}/{r.same_text[1]}",
                ]
                for r in table
            ],
        ),
    ]
    spec_rows = [r for r in table if r.arm != BASELINE.name]
    if spec_rows:
        parts += [
            "",
            "Acceptance (client: from the totals each streamed response carries; per draft position i: "
            "accepted at i / drafted at i):",
            "",
            _table(
                ["workload", "load", "arm", "acceptance", "mean accepted length", "per position"],
                [
                    [
                        r.workload,
                        r.load.label,
                        r.arm,
                        _pct(r.summary.acceptance_rate),
                        _num(r.summary.mean_accepted_length),
                        " ".join(f"{x:.0%}" for x in r.summary.acceptance_per_position) or "-",
                    ]
                    for r in spec_rows
                ],
            ),
        ]
    checks = counter_check(result)
    if checks:
        parts += [
            "",
            "Client count / server counter (the server's Prometheus counters, after - before each level):",
            "",
            _table(
                [
                    "workload",
                    "load",
                    "proposer",
                    "requests",
                    "output tokens",
                    "draft tokens",
                    "accepted",
                    "server acceptance per position",
                ],
                [
                    [
                        c["workload"],
                        c["load"],
                        c["proposer"],
                        *(
                            f"{c[k][0]:.0f} / {c[k][1]:.0f}"
                            for k in ("requests", "output_tokens", "draft_tokens", "accepted_tokens")
                        ),
                        " ".join(f"{x:.0%}" for x in c["server_acceptance_per_position"]) or "-",
                    ]
                    for c in checks
                ],
            ),
        ]
    tasks = by_task(result)
    if len({t["kind"] for t in tasks}) > 1:
        parts += [
            "",
            "By task (all levels of a workload together):",
            "",
            _table(
                ["workload", "task", "arm", "requests", "acceptance", "mean accepted length", "speedup"],
                [
                    [
                        t["workload"],
                        t["kind"],
                        t["arm"],
                        str(t["requests"]),
                        _pct(t["acceptance_rate"]),
                        _num(t["mean_accepted_length"]),
                        _num(t["speedup"]) + ("x" if t["speedup"] else ""),
                    ]
                    for t in tasks
                ],
            ),
        ]
    memory = memory_table(result)
    if memory:
        parts += ["", memory]
    return "\n".join(parts) + "\n"


def failures_markdown(result: BenchResult, table: Sequence[Row]) -> list[str]:
    """The failed requests' count and reasons, and per level and arm a row for each reason with
    one of its errors; nothing when none failed."""
    failures = result.failures
    if not failures:
        return []
    sent = sum(len(level.requests) for level in result.levels)
    reasons = ", ".join(f"{reason} {n}" for reason, n in failures.most_common())
    example = {}
    for level in result.levels:
        for s in level.requests:
            if s.failure:
                example.setdefault((level.workload, level.load, s.arm, s.failure), s.record.error)
    lines = [
        [r.workload, r.load.label, r.arm, reason, str(n), _cell(example[(r.workload, r.load, r.arm, reason)])]
        for r in table
        for reason, n in r.failures.items()
    ]
    counters = ""
    if result.server.get("metrics_url"):
        unread = [f"{lv.workload} {lv.load.label}" for lv in result.levels if lv.counters is None]
        if unread:
            counters = f" No server counters for {', '.join(unread)}: unreachable, the server may have restarted."
    return [
        "",
        f"**{sum(failures.values())} of {sent} requests failed** ({reasons}); every other figure is over the "
        f"requests that succeeded.{counters}",
        "",
        _table(["workload", "load", "arm", "reason", "failed", "e.g."], lines),
    ]


def _cell(text: str | None, width: int = 120) -> str:
    """Text for a Markdown table cell: one line, no pipes, at most `width` characters."""
    text = " ".join((text or "").split()).replace("|", "/")
    return text if len(text) <= width else text[: width - 3] + "..."


def memory_table(result: BenchResult) -> str:
    """Server memory (PSS, MiB) per process: idle before the first level, then the peak of each."""
    levels = [lv for lv in result.levels if lv.memory_peak]
    if not levels:
        return ""
    names = [*sorted({n for lv in levels for n in lv.memory_peak} - {"total"}), "total"]
    first = levels[0].memory_before
    idle_total = sum(m.pss for m in first.values())
    lines = [
        [
            "idle, before the first level",
            *(f"{first[n].pss / MIB:.0f}" if n in first else "-" for n in names[:-1]),
            f"{idle_total / MIB:.0f}",
        ]
    ]
    for lv in levels:
        lines.append(
            [f"peak, {lv.workload} {lv.load.label}"]
            + [f"{lv.memory_peak[n].pss / MIB:.0f}" if n in lv.memory_peak else "-" for n in names]
        )
    gpu = [lv.gpu_memory_bytes for lv in levels if lv.gpu_memory_bytes is not None]
    note = (
        "Server memory, PSS in MiB by process (a Python backend stub per model; `draft` is the memory that "
        "draft-model speculation adds; n-gram lookup runs inside `spec_decode`, which the baseline uses too)"
    )
    if gpu:
        note += f"; GPU memory in use (Triton's gauge) at the end of the levels: {max(gpu) / MIB:.0f} MiB"
    return note + ":\n\n" + _table(["", *names], lines)


def terminal_table(result: BenchResult) -> Table:
    """The headline numbers, narrow enough for a terminal (summary.md has them all)."""
    several = len(result.config.workloads) > 1
    title = "speculation against the baseline: same prompts, same load (p50s)"
    table = Table(title=title if several else f"{result.config.workloads[0]}: {title}", box=box.SIMPLE_HEAD)
    failed = bool(result.failures)
    columns = ["workload"] * several + ["load", "arm", "tok/s", "TTFT ms", "ITL ms", "latency ms", "accept",
                                         "speedup", "same"] + ["failed"] * failed  # fmt: skip
    for col in columns:
        table.add_column(col, justify="left" if col in ("workload", "load", "arm") else "right")
    for r in rows(result):
        s = r.summary
        table.add_row(
            *[r.workload] * several, r.load.label, r.arm, f"{s.output_token_throughput:.1f}",
            _ms(s.time_to_first_token, "p50"), _ms(s.inter_token_latency, "p50"), _ms(s.request_latency, "p50"),
            _pct(s.acceptance_rate), r.speedup_text, f"{r.same_text[0]}/{r.same_text[1]}", *[str(s.errors)] * failed,
        )  # fmt: skip
    return table


# --- plots ----------------------------------------------------------------------------------------
def plot(result: BenchResult, out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg = result.config
    table = rows(result)
    workloads = list(cfg.workloads)
    labels = [ld.label for ld in cfg.loads]
    xlabel = "concurrency" if all(ld.concurrency for ld in cfg.loads) else "load"
    x = list(range(len(labels)))
    paths = []

    def series(workload: str, arm: str, value) -> list[float]:
        by_load = {r.load: value(r) for r in table if r.workload == workload and r.arm == arm}
        return [by_load.get(ld, float("nan")) for ld in cfg.loads]

    def finish(fig, name: str) -> None:
        fig.tight_layout()
        path = out_dir / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)

    def axes(nrows: int, ncols: int, width: float = 5.0, height: float = 3.6):
        fig, ax = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)
        return fig, ax

    # throughput against load
    fig, ax = axes(1, len(workloads))
    for i, w in enumerate(workloads):
        for arm in cfg.arms:
            ax[0][i].plot(x, series(w, arm.name, lambda r: r.summary.output_token_throughput), marker="o",
                          label=arm.name)  # fmt: skip
        ax[0][i].set(title=f"{w}: output_token_throughput", xlabel=xlabel, ylabel="tokens / s", xticks=x,
                     xticklabels=labels)  # fmt: skip
        ax[0][i].legend()
        ax[0][i].grid(alpha=0.3)
    finish(fig, "throughput.png")

    # latency percentiles against load
    metrics = (("time_to_first_token", "time_to_first_token (ms)"), ("inter_token_latency", "inter_token_latency (ms)"),
               ("request_latency", "request_latency (ms)"))  # fmt: skip
    fig, ax = axes(len(workloads), len(metrics))
    for i, w in enumerate(workloads):
        for j, (name, title) in enumerate(metrics):
            a = ax[i][j]
            for k, arm in enumerate(cfg.arms):
                color = f"C{k}"
                for q, style in (("p50", "-"), ("p99", "--")):
                    values = series(
                        w,
                        arm.name,
                        lambda r, n=name, q=q: (
                            getattr(getattr(r.summary, n), q, float("nan")) if getattr(r.summary, n) else float("nan")
                        ),
                    )
                    a.plot(x, values, style, color=color, marker="o", label=f"{arm.name} {q}")
            a.set(title=f"{w}: {title}, p50 solid, p99 dashed", xlabel=xlabel, xticks=x, xticklabels=labels)
            a.grid(alpha=0.3)
        ax[i][0].legend(fontsize=7)
    finish(fig, "latency.png")

    # speedup against load
    fig, ax = axes(1, len(workloads))
    for i, w in enumerate(workloads):
        for arm in cfg.arms:
            if not arm.is_baseline:
                gains = series(w, arm.name, lambda r: r.speedup or float("nan"))
                below = series(w, arm.name, lambda r: r.speedup - r.speedup_interval[0] if r.speedup_interval else 0.0)
                above = series(w, arm.name, lambda r: r.speedup_interval[1] - r.speedup if r.speedup_interval else 0.0)
                ax[0][i].errorbar(x, gains, yerr=[below, above], marker="o", capsize=3, label=arm.name)
        ax[0][i].axhline(1.0, color="grey", lw=1)
        ax[0][i].set(
            title=f"{w}: speedup (mean request latency), 95% intervals",
            xlabel=xlabel,
            ylabel="x",
            xticks=x,
            xticklabels=labels,
        )
        ax[0][i].legend()
        ax[0][i].grid(alpha=0.3)
    finish(fig, "speedup.png")

    # acceptance per draft position, all levels of a workload together
    spec_arms = [a for a in cfg.arms if not a.is_baseline]
    if spec_arms:
        fig, ax = axes(1, len(workloads))
        width = 0.8 / len(spec_arms)
        for i, w in enumerate(workloads):
            for k, arm in enumerate(spec_arms):
                records = [
                    s.record for lv in result.levels if lv.workload == w for s in lv.requests if s.arm == arm.name
                ]
                rates = summarize(records, 0.0).acceptance_per_position
                pos = [p + 1 + (k - (len(spec_arms) - 1) / 2) * width for p in range(len(rates))]
                ax[0][i].bar(pos, rates, width=width, label=arm.name)
            ax[0][i].set(
                title=f"{w}: acceptance per draft position",
                xlabel="draft position",
                ylabel="accepted / drafted",
                ylim=(0, 1),
            )
            ax[0][i].legend()
            ax[0][i].grid(alpha=0.3, axis="y")
        finish(fig, "acceptance.png")

    # time to first token and inter-chunk latency distributions (empirical CDFs), one column per load level
    fig, ax = axes(2 * len(workloads), len(cfg.loads), width=4.0, height=3.0)
    for i, w in enumerate(workloads):
        for j, load in enumerate(cfg.loads):
            level = next((lv for lv in result.levels if lv.workload == w and lv.load == load), None)
            if level is None:
                continue
            for k, arm in enumerate(cfg.arms):
                ms = [request_metrics(r) for r in level.records(arm.name) if r.error is None]
                for row, values in (
                    (2 * i, [m.time_to_first_token for m in ms if m.time_to_first_token is not None]),
                    (2 * i + 1, [g for m in ms for g in m.inter_chunk_latency]),
                ):
                    if values:
                        values = sorted(values)
                        ax[row][j].step(
                            values,
                            [(n + 1) / len(values) for n in range(len(values))],
                            where="post",
                            color=f"C{k}",
                            label=arm.name,
                        )
            ax[2 * i][j].set(title=f"{w} {load.label}: time_to_first_token", xlabel="ms", ylabel="fraction")
            ax[2 * i + 1][j].set(title=f"{w} {load.label}: inter_chunk_latency", xlabel="ms (log)", ylabel="fraction",
                                 xscale="log")  # fmt: skip
            for row in (2 * i, 2 * i + 1):
                ax[row][j].grid(alpha=0.3)
                ax[row][j].legend(fontsize=7)
    finish(fig, "distributions.png")
    return paths


# --- genai-perf's export layouts ------------------------------------------------------------------
# genai-perf (perf_analyzer repo, genai-perf/, branch r25.12 = 54882bc5): the metrics in the order
# of its JSON export (metrics/metrics.py and llm_metrics.py: the insertion order of Metrics.data)
GENAI_PERF_METRICS = (
    "request_throughput",
    "request_latency",
    "request_goodput",
    "request_count",
    "time_to_first_token",
    "time_to_second_token",
    "inter_token_latency",
    "output_token_throughput",
    "output_token_throughput_per_user",
    "output_sequence_length",
    "input_sequence_length",
)
# the metrics that get only an average (LLMMetrics.system_metrics)
GENAI_PERF_SYSTEM = ("output_token_throughput", "request_throughput", "request_goodput", "request_count")
# units in the JSON (metrics/statistics.py::_add_units) and in the CSV's labels (MetricMetadata)
GENAI_PERF_JSON_UNITS = {"request_throughput": "requests/sec", "request_goodput": "requests/sec",
                         "request_count": "count", "output_token_throughput": "tokens/sec",
                         "output_token_throughput_per_user": "tokens/sec/user", "output_sequence_length": "tokens",
                         "input_sequence_length": "tokens"}  # fmt: skip
GENAI_PERF_CSV_UNITS = GENAI_PERF_JSON_UNITS | {"request_throughput": "per sec", "request_goodput": "per sec"}
GENAI_PERF_STATS = ("avg", "p1", "p5", "p10", "p25", "p50", "p75", "p90", "p95", "p99", "min", "max", "std")
# export_data/csv_exporter.py: the request table's columns and rows, and the rows left out unstreamed
GENAI_PERF_CSV_STATS = ("avg", "min", "max", "p99", "p95", "p90", "p75", "p50", "p25", "p10", "p5", "p1")
GENAI_PERF_CSV_ROWS = (
    "time_to_first_token",
    "time_to_second_token",
    "request_latency",
    "inter_token_latency",
    "output_token_throughput_per_user",
    "output_sequence_length",
    "input_sequence_length",
)
GENAI_PERF_STREAMING_ONLY = ("time_to_first_token", "time_to_second_token", "inter_token_latency",
                             "output_token_throughput_per_user")  # fmt: skip
GENAI_PERF_FILE = "profile_export_genai_perf"


def genai_perf_stats(s: ArmSummary, goodput: bool) -> dict[str, dict[str, object]]:
    """An arm's figures as genai-perf's statistics: per metric its unit and statistics (system
    metrics: the average alone), times in ms; a metric without data points is left out, and
    request_goodput is there only with SLOs."""
    out: dict[str, dict[str, object]] = {}
    for name in GENAI_PERF_METRICS:
        unit = GENAI_PERF_JSON_UNITS.get(name, "ms")
        if name in GENAI_PERF_SYSTEM:
            if name == "request_goodput" and not goodput:
                continue
            out[name] = {"unit": unit, "avg": float(getattr(s, name))}
        elif (stat := getattr(s, name)) is not None:
            out[name] = {"unit": unit} | {k: getattr(stat, k) for k in GENAI_PERF_STATS}
    return out


def genai_perf_json(stats: dict[str, dict[str, object]], input_config: dict[str, object]) -> str:
    """profile_export_genai_perf.json: the statistics, then "input_config" (json_exporter.py)."""
    return json.dumps(stats | {"input_config": input_config}, indent=2)


def genai_perf_csv_rows(stats: dict[str, dict[str, object]], streaming: bool, goodput: bool) -> list[list[str]]:
    """profile_export_genai_perf.csv's rows (csv_exporter.py): the request metrics' statistics, a
    blank row, the system metrics' values; numbers as f"{v:,.2f}", a metric without data "N/A"."""

    def label(name: str) -> str:
        return f"{name.replace('_', ' ').title()} ({GENAI_PERF_CSV_UNITS.get(name, 'ms')})"

    def value(name: str, stat: str) -> str:
        return f"{stats[name][stat]:,.2f}" if name in stats else "N/A"

    out = [["Metric", *GENAI_PERF_CSV_STATS]]
    for name in GENAI_PERF_CSV_ROWS:
        if streaming or name not in GENAI_PERF_STREAMING_ONLY:
            out.append([label(name), *(value(name, stat) for stat in GENAI_PERF_CSV_STATS)])
    out += [[], ["Metric", "Value"]]
    for name in ("output_token_throughput", "request_throughput", "request_goodput", "request_count"):
        if name != "request_goodput" or goodput:
            out.append([label(name), value(name, "avg")])
    return out


def genai_perf_folder(workload: str, load: Load, arm: str) -> Path:
    """<workload>/<level>/<arm>: the level named as genai-perf names its artifact folders'
    stimulus (concurrency4, request_rate0.5), a workload file by its stem, ':' in an arm's name
    as '-'."""
    level = f"concurrency{load.concurrency}" if load.concurrency is not None else f"request_rate{load.rate:g}"
    name = Path(workload).stem if workload.endswith(".jsonl") else workload
    return Path(name) / level / arm.replace(":", "-")


def write_genai_perf(result: BenchResult, table: Sequence[Row], out_dir: Path) -> list[Path]:
    """Per workload, level and arm, profile_export_genai_perf.json and .csv; their paths."""
    cfg = result.config
    paths = []
    for row in table:
        folder = out_dir / genai_perf_folder(row.workload, row.load, row.arm)
        folder.mkdir(parents=True, exist_ok=True)
        stats = genai_perf_stats(row.summary, cfg.slo.is_set)
        stimulus = {"concurrency": row.load.concurrency} if row.load.concurrency is not None else {
            "request_rate": row.load.rate}  # fmt: skip
        input_config = {"subcommand": "specdec bench", "workload": row.workload, "arm": row.arm,
                        "stimulus": stimulus, "server": result.server,
                        "bench": asdict(cfg) | {"arms": [a.name for a in cfg.arms]}}  # fmt: skip
        json_path, csv_path = folder / f"{GENAI_PERF_FILE}.json", folder / f"{GENAI_PERF_FILE}.csv"
        json_path.write_text(genai_perf_json(stats, input_config))
        with csv_path.open("w", newline="") as f:  # the csv module's \r\n line ends, as genai-perf writes
            csv.writer(f).writerows(genai_perf_csv_rows(stats, cfg.stream, cfg.slo.is_set))
        paths += [json_path, csv_path]
    return paths


def write_report(result: BenchResult, out_dir: Path, machine: dict[str, object], plots: bool = True) -> dict[str, Path]:
    """Write bench.json, summary.csv, summary.md, the plots and the genai-perf exports; return
    their paths by kind (the exports' as "genai-perf <folder>/<file>")."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "bench.json", "csv": out_dir / "summary.csv", "markdown": out_dir / "summary.md"}
    paths["json"].write_text(json.dumps(to_json(result, machine), indent=1))
    table = rows(result)
    write_csv(table, paths["csv"])
    paths["markdown"].write_text(markdown(result, machine))
    if plots:
        for path in plot(result, out_dir):
            paths[path.stem] = path
    for path in write_genai_perf(result, table, out_dir):
        paths[f"genai-perf {path.relative_to(out_dir)}"] = path
    return paths
