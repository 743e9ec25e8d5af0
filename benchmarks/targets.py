"""The four speed figures of the embedded default, each beside its baseline from the same run.

    .venv/bin/python benchmarks/targets.py [--out benchmarks/results/targets] [--max-tokens 128]

1. plain decoding through the served engine at batch 1: tokens/s (1 / TPOT p50) and the weight
   bandwidth it implies (weights read per token x tokens/s, as gpt-fast reports it);
2. verification cost: one engine forward over k = 4 draft tokens + 1 against a one-token step
   (in this process, the engine the server runs): the best of 40 of each, and the median ratio
   of 40 interleaved pairs (the two forwards of a pair run under the same load of the machine);
3. prompt lookup on input-grounded prompts at batch 1: output tokens/s against no speculation
   (beside it the same after each request's first token: the prefill, equal in both, left out);
4. throughput of speculation (prompt lookup, adaptive draft length up to the profile's
   max_draft_tokens) against no speculation at concurrency 1..32 on grounded and on open-ended
   chat prompts: the lowest ratio. Beside it, the
   same comparison for an A/A arm (prompt lookup's path with drafting off, `ngram:0`: the
   baseline's work) says how far two identical arms drift apart in this run, by chance and by
   the shared machine: the yardstick for a ratio near 1.
Each ratio comes with a 95% interval (specdec.client.metrics.ratio_interval): a bootstrap over the
cell's rounds, each round's requests of the two arms resampled together, so what the machine's
speed of the moment did to both stays paired. A round holds its own prompts (at C = 1, one), so
speculation's interval spans the spread between prompts too: what another set of prompts like
these might give. The A/A arm's, whose halves do the same work on the same prompts, is the
machine's noise alone. Every cell has at least MIN_ROUNDS rounds, so every cell has one.
The arms take turns in blocks of C requests on one server (specdec.client.loadgen), in a rotating
order; each arm runs every prompt of the workload at least once and at least MIN_ROUNDS blocks,
so a figure speaks for the whole workload, not its first prompts. All texts
are compared with the baseline's: greedy, or with --temperature (and --top-p) sampled with a seed
per prompt, which prompt lookup reproduces too (the targets are greedy figures; a sampled run
says how sampled requests fare against the same bounds). Where a workload's prompts carry a task label (`kind`:
summarise, edit, qa, code in the grounded sets), each cell's speedup is also given by task: the
grounded figure depends on the mix of tasks (copy-edits and code run far ahead of summaries and
answers). Where tritonserver or one of its stubs dies during a cell (the README's operations
section: Triton's server#8882 under concurrent BLS load), the server is restarted and the cell
runs again from its start, at most CELL_TRIES times; the restarts are reported with the cells.
Writes targets.md, targets.json and targets.png (the ratios by concurrency; `--plot DIR` draws it
again from DIR/targets.json).

Held-out prompts: --grounded and --open take a .jsonl file each (one {"text": ...} object a line,
as `specdec bench --workload`) in place of the built-in grounded and chat workloads.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from performance import update as update_performance

from specdec.build import build
from specdec.client.loadgen import BASELINE, Arm, BenchConfig, Load, level_summaries, paired_rounds, run_bench
from specdec.client.machine import describe, summary_line
from specdec.client.metrics import SLO, ArmSummary, ratio_interval
from specdec.client.report import by_task, same_text_as_baseline, sampling_line
from specdec.client.workloads import WorkloadOptions, load_workload
from specdec.config import load_profile
from specdec.engine.engine import Engine
from specdec.engine.model import resolve_dtype
from specdec.progress import console
from specdec.triton.serve import Ports, TritonServer

SAME_AS_BASELINE = Arm("ngram", 0)
CONCURRENCY = (1, 2, 4, 8, 16, 32)
VERIFY_PAIRS = 40  # 1-row / 5-row forward pairs behind the verification figure
CELL_TRIES = 3
MIN_ROUNDS = 8  # the fewest rounds a cell's 95% interval is given for
GROUNDED_SPEEDUP = 2.5  # the grounded figure's target, at one user
FLOOR = 0.97  # the lowest ratio speculation may make at any concurrency


def verification_cost(engine: Engine, pairs: int = VERIFY_PAIRS) -> dict[str, float]:
    """1-row and 5-row forwards in `pairs` back-to-back pairs, the order alternating: the best
    of each, and the median of the pairs' ratios."""
    engine.warmup()
    one, five = [], []
    for i in range(pairs):
        order = (1, 5) if i % 2 == 0 else (5, 1)
        seconds = dict(zip(order, engine.calibrate(rows=order, repeats=1)["seconds"], strict=True))
        one.append(seconds[1])
        five.append(seconds[5])
    return {
        "one_row_s": min(one),
        "five_rows_s": min(five),
        "paired_median": statistics.median(f / o for f, o in zip(five, one, strict=True)),
    }


def interval(bounds: tuple[float, float] | None) -> str:
    return f"{bounds[0]:.2f}-{bounds[1]:.2f}x" if bounds else "-"


def verdict(value: float, bound: float, at_least: bool = True) -> str:
    """Whether a figure meets its target, judged unrounded: 2.499x prints as 2.50x but misses 2.5x."""
    met = value >= bound if at_least else value <= bound
    return f"{'yes' if met else '**no**'} ({value:.3f})"


def target(value: float, bound: float, unit: str = "x", at_least: bool = True, note: str = "") -> tuple[str, str]:
    """A figure's target as its table shows it (">= 2.5x"), and its verdict: the bound written once."""
    return f"{'>=' if at_least else '<='} {bound:g}{unit}{note}", verdict(value, bound, at_least)


def closed_loop_throughput(arm: ArmSummary, concurrency: int) -> float | None:
    """Output tokens/s of C users of the arm at the latencies measured (Little's law: its tokens
    over its request time spread over the C slots). The arms take turns in blocks of C requests,
    whose wall time (output_token_throughput's benchmark_duration) is the slowest request's: this
    takes each request's own."""
    if arm.request_latency is None:
        return None
    seconds = arm.request_latency.avg * arm.request_latency.count / 1000 / concurrency
    return arm.output_tokens / seconds if seconds > 0 else None


def throughput_ratio(arm: ArmSummary, baseline: ArmSummary, concurrency: int) -> float | None:
    rates = [closed_loop_throughput(s, concurrency) for s in (arm, baseline)]
    return rates[0] / rates[1] if all(rates) else None


def after_first_token(arm: ArmSummary, concurrency: int) -> float | None:
    """Output tokens/s after each request's first token (closed loop at `concurrency`): the
    throughput less the first tokens and the time to them, the prefill, which is the same work
    with speculation or without. Beside the end-to-end ratio it says what speculation does to
    decoding itself."""
    ttft, latency = arm.time_to_first_token, arm.request_latency
    if ttft is None or latency is None:
        return None
    seconds = (latency.avg * latency.count - ttft.avg * ttft.count) / 1000 / concurrency
    return (arm.output_tokens - ttft.count) / seconds if seconds > 0 else None


def sweep(server: TritonServer, ngram: Arm, role: str, workload: str, concurrency: int, max_tokens: int,
          temperature: float | None = None, top_p: float | None = None) -> dict:  # fmt: skip
    """One cell: the three arms (the baseline, `ngram`, the A/A arm) on `workload` (a built-in
    name or a .jsonl file) at concurrency C; greedy, or sampled at `temperature`."""
    options = WorkloadOptions(max_tokens=max_tokens)
    prompts = load_workload(workload, options)
    config = BenchConfig(
        arms=(BASELINE, ngram, SAME_AS_BASELINE),
        loads=(Load(concurrency=concurrency),),
        workloads=(workload,),
        num_requests=max(MIN_ROUNDS * concurrency, len(prompts)),
        # blocks of C requests, at least MIN_ROUNDS per arm, in rotating order (A B C, B C A, C A B,
        # ...), so that a drift of the shared machine falls on every arm: the A/A arm's ratio shows
        # what is left of it
        block_size=concurrency,
        warmup=1,
        workload_options=options,
        temperature=temperature,
        top_p=top_p,
    )
    result = run_bench(config, {workload: prompts}, server.grpc_url, server.metrics_url,
                       server.process.pid)  # fmt: skip
    (level,) = result.levels
    summaries = level_summaries(level, config.arms, SLO())
    base, spec, same_work = (summaries[arm.name] for arm in config.arms)
    same, total = same_text_as_baseline(level, ngram.name)
    round_size = config.round_size(level.load)
    spec_rounds, aa_rounds = (
        paired_rounds(level, arm.name, BASELINE.name, round_size) for arm in (ngram, SAME_AS_BASELINE)
    )
    decode_rates = [after_first_token(arm, concurrency) for arm in (spec, base)]
    return {
        "workload": role,
        "prompts": workload,
        "concurrency": concurrency,
        "baseline_tok_s": closed_loop_throughput(base, concurrency),
        "ngram_tok_s": closed_loop_throughput(spec, concurrency),
        "ratio": throughput_ratio(spec, base, concurrency),
        "aa_ratio": throughput_ratio(same_work, base, concurrency),
        "after_first_token_ratio": decode_rates[0] / decode_rates[1] if all(decode_rates) else None,
        "baseline_ttft_mean_s": base.time_to_first_token.avg / 1000 if base.time_to_first_token else None,
        "ngram_ttft_mean_s": spec.time_to_first_token.avg / 1000 if spec.time_to_first_token else None,
        "rounds": len(spec_rounds[0]),
        "ratio_interval": ratio_interval(*spec_rounds, min_units=MIN_ROUNDS),
        "aa_ratio_interval": ratio_interval(*aa_rounds, min_units=MIN_ROUNDS),
        "baseline_tpot_p50_s": base.inter_token_latency.p50 / 1000 if base.inter_token_latency else None,
        "ngram_tpot_p50_s": spec.inter_token_latency.p50 / 1000 if spec.inter_token_latency else None,
        "acceptance": spec.acceptance_rate,
        # where the workload's prompts carry a task label: how each task fares (the workload's
        # figure depends on its mix of tasks)
        "by_task": {t["kind"]: t["speedup"] for t in by_task(result) if t["arm"] == ngram.name},
        "same_text": f"{same}/{total}",
        "errors": len(result.errors),
    }


def surviving_sweep(server: TritonServer, *cell) -> dict:
    """sweep(server, *cell), run again on a restarted server each time tritonserver or one of its
    stubs dies during it."""
    for restarts in range(CELL_TRIES):
        try:
            row = sweep(server, *cell)
        except Exception:
            if server.failure() is None:
                raise  # not the server's death
            row = None
        failure = server.failure()
        if row is not None and failure is None:
            return {**row, "server_restarts": restarts}
        console.print(f"[red]{failure}[/] during the cell {cell[1:4]}: restarting the server, the cell runs again")
        kept = server.restart()
        console.print(f"the dead server's log: {kept}")
    raise RuntimeError(f"the server failed in each of {CELL_TRIES} tries of the cell {cell[1:4]}")


def decoding(row: dict) -> str:
    """The cell's ratio after the first token, and the mean time to it in each arm."""
    if row["after_first_token_ratio"] is None:
        return "no first tokens timed"
    return (f"after the first token {row['after_first_token_ratio']:.2f}x, the first token at "
            f"{row['ngram_ttft_mean_s'] * 1e3:.0f} vs {row['baseline_ttft_mean_s'] * 1e3:.0f} ms (the prefill, "
            "the same work in both arms)")  # fmt: skip


def plot(rows: list[dict], path: Path) -> None:
    """The sweep's ratios as a figure: a panel a workload, prompt lookup's throughput over the
    baseline's by concurrency with its 95% interval, the A/A arm's beside it (the yardstick for a
    ratio near 1), the floor, and on grounded prompts the target at one user."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    fig, axes = plt.subplots(1, len(workloads), figsize=(5.5 * len(workloads), 3.8), squeeze=False)
    for ax, workload in zip(axes[0], workloads, strict=True):
        cells = [r for r in rows if r["workload"] == workload]
        x = list(range(len(cells)))
        for key, label, shift in (("ratio", "prompt lookup", -0.06), ("aa_ratio", "A/A arm", 0.06)):
            values = [r[key] for r in cells]
            bounds = [r[f"{key}_interval"] or (v, v) for r, v in zip(cells, values, strict=True)]
            errors = [[v - lo for v, (lo, _) in zip(values, bounds, strict=True)],
                      [hi - v for v, (_, hi) in zip(values, bounds, strict=True)]]  # fmt: skip
            ax.errorbar([i + shift for i in x], values, yerr=errors, marker="o", capsize=3, label=label)
        ax.axhline(FLOOR, color="C3", ls="--", lw=1, label=f"floor, {FLOOR:g}x")
        if workload == "grounded" and cells[0]["concurrency"] == 1:
            ax.plot([0], [GROUNDED_SPEEDUP], "*", ms=12, color="C2", label=f"target at one user, {GROUNDED_SPEEDUP:g}x")
        ax.set(title=f"{workload} ({cells[0]['prompts']})", xlabel="concurrency (users)",
               ylabel="tokens/s over the baseline's", xticks=x,
               xticklabels=[str(r["concurrency"]) for r in cells])  # fmt: skip
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "targets")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--concurrency", default=",".join(map(str, CONCURRENCY)))
    ap.add_argument("--grounded", default="grounded", help="input-grounded prompts: built-in, or a .jsonl file")
    ap.add_argument("--open", default="chat", help="open-ended prompts: built-in chat, or a .jsonl file")
    ap.add_argument("--temperature", type=float, help="sample (a seed per prompt); default: greedy")
    ap.add_argument("--top-p", type=float)
    ap.add_argument("--plot", type=Path, metavar="DIR", help="only draw DIR/targets.png from DIR/targets.json")
    args = ap.parse_args(argv)
    if args.plot:
        plot(json.loads((args.plot / "targets.json").read_text())["levels"], args.plot / "targets.png")
        return 0
    levels = [int(c) for c in args.concurrency.split(",")]
    if 1 not in levels:  # (figures 1 and 3 are one user's: found missing after the whole sweep, before)
        ap.error("--concurrency must include 1: plain decoding and the grounded figure are measured at one user")
    workloads = {"grounded": args.grounded, "chat": args.open}
    options = WorkloadOptions(max_tokens=args.max_tokens)
    for source in workloads.values():
        try:
            load_workload(source, options)  # a bad file fails here, not after the first half hour
        except ValueError as err:
            ap.error(str(err))
    profile = load_profile()
    build(profile)
    ngram = Arm("ngram", profile.speculation.max_draft_tokens)  # adaptive: up to the profile's longest draft
    machine = describe()
    engine = Engine(profile.model_dir("target"), dtype=profile.engine.dtype, kv_slots=2, max_seq_len=256,
                    threads=profile.engine.threads)  # fmt: skip
    verify = verification_cost(engine)
    weights = engine.model.weight_bytes()
    del engine  # its memory, before the server's engines load
    rows = []
    with TritonServer(profile, ports=Ports.free()) as server:
        for role, workload in workloads.items():
            for c in levels:
                rows.append(surviving_sweep(server, ngram, role, workload, c, args.max_tokens, args.temperature,
                                            args.top_p))  # fmt: skip
                console.print(rows[-1])
    first = {r["workload"]: r for r in rows if r["concurrency"] == 1}["grounded"]
    plain_tok_s = 1 / first["baseline_tpot_p50_s"]
    worst = min(rows, key=lambda r: r["ratio"] or 0)
    aa = [r["aa_ratio"] for r in rows if r["aa_ratio"] is not None]
    figures = [
        ("plain decoding at batch 1 (served)", f"{plain_tok_s:.1f} tokens/s, {weights * plain_tok_s / 1e9:.1f} GB/s",
         *target(plain_tok_s, 20, " tokens/s")),
        ("verify k=4 / one-token step (engine)", f"best of {VERIFY_PAIRS} each: "
         f"{verify['five_rows_s'] / verify['one_row_s']:.2f}x ({verify['five_rows_s'] * 1e3:.1f} / "
         f"{verify['one_row_s'] * 1e3:.1f} ms); median of {VERIFY_PAIRS} interleaved pairs: "
         f"{verify['paired_median']:.2f}x",
         *target(verify["paired_median"], 1.2, at_least=False, note=" (the median)")),
        ("prompt lookup, grounded, batch 1", f"{first['ratio']:.2f}x, 95% interval {interval(first['ratio_interval'])} "
         f"over {first['rounds']} rounds ({first['ngram_tok_s']:.1f} vs {first['baseline_tok_s']:.1f} tokens/s); "
         f"A/A arm {first['aa_ratio']:.2f}x ({interval(first['aa_ratio_interval'])}); {decoding(first)}",
         *target(first["ratio"], GROUNDED_SPEEDUP)),
        ("lowest speculation / baseline throughput, c=" + ",".join(map(str, levels)),
         f"{worst['ratio']:.2f}x ({worst['workload']}, c={worst['concurrency']}); A/A arm: {min(aa):.2f}x to "
         f"{max(aa):.2f}x", *target(worst["ratio"], FLOOR)),
    ]  # fmt: skip
    prompts = ", ".join(f"{role}: {source}" for role, source in workloads.items())
    dtype = resolve_dtype(profile.engine.dtype, profile.engine.device)
    lines = [
        f"Machine: {summary_line(machine)}. Engine dtype: {dtype}. Prompts: {prompts}. "
        f"Decoding: {sampling_line(args.temperature, args.top_p)}.",
        "",
    ]
    lines += ["| figure | measured | target | met (unrounded) |", "|---|---|---|---|"]
    lines += [f"| {' | '.join(figure)} |" for figure in figures]
    restarted = [f"{r['workload']} c={r['concurrency']} ({r['server_restarts']})" for r in rows if r["server_restarts"]]
    lines += ["", f"tritonserver restarts, cells run again: {', '.join(restarted) or 'none'}."]
    lines += [
        "",
        "| workload | c | baseline tok/s | ngram tok/s | ratio (95% interval) | acceptance | same text "
        "| A/A ratio (95% interval) | rounds |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        acceptance = f"{r['acceptance']:.0%}" if r["acceptance"] is not None else "-"
        lines.append(f"| {r['workload']} | {r['concurrency']} | {r['baseline_tok_s']:.1f} | {r['ngram_tok_s']:.1f} | "
                     f"{r['ratio']:.2f}x ({interval(r['ratio_interval'])}) | {acceptance} | {r['same_text']} | "
                     f"{r['aa_ratio']:.2f}x ({interval(r['aa_ratio_interval'])}) | {r['rounds']} |")  # fmt: skip
    task_rows = [r for r in rows if len(r["by_task"]) > 1]  # the cells whose prompts name several tasks
    if task_rows:
        tasks = sorted({kind for r in task_rows for kind in r["by_task"]})
        lines += [
            "",
            "By task: speculation's speedup (the baseline's mean end-to-end time over its own):",
            "",
            f"| workload | c | {' | '.join(tasks)} |",
            "|---|---|" + "---|" * len(tasks),
        ]
        for r in task_rows:
            ratios = (r["by_task"].get(kind) for kind in tasks)
            cells = " | ".join(f"{x:.2f}x" if x else "-" for x in ratios)
            lines.append(f"| {r['workload']} | {r['concurrency']} | {cells} |")
    lines += ["", f"The intervals: a paired bootstrap over a cell's rounds, none under {MIN_ROUNDS} rounds "
              "(over fewer it understates the spread).", "", "![the ratios by concurrency](targets.png)"]  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    plot(rows, args.out / "targets.png")
    (args.out / "targets.md").write_text("\n".join(lines) + "\n")
    (args.out / "targets.json").write_text(
        json.dumps(
            {
                "machine": machine,
                "dtype": dtype,
                "decoding": sampling_line(args.temperature, args.top_p),
                "figures": figures,
                "verification": verify,
                "levels": rows,
            },
            indent=1,
        )
    )
    console.print("\n".join(lines))
    update_performance(args.out)  # docs/performance.md, where this run is the tree's
    return 1 if any(r["errors"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
