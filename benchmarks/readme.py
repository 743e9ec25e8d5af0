"""The measurements behind the README's performance section, with the machine they ran on.

    .venv/bin/python benchmarks/readme.py [--out benchmarks/results/readme] [--quick]

One tritonserver (the embedded profile) serves everything, on free ports:
1. machine.json / machine.md: CPU model, cores, memory, GPUs, load averages at the start (a line per run);
2. sweep/ (step "sweep"): `specdec bench` over a concurrency sweep on the grounded and the chat
   workloads, the baseline, n-gram and draft-model speculation interleaved request by request on
   the same prompts (the arms share the server);
3. sweep-blocks/ (step "blocks"): the same with --interleave block (each arm alone on the server);
4. peer.md / peer.json (step "peer"): Hugging Face transformers' greedy, prompt-lookup and assisted
   generation in this process against the served baseline and speculation, same prompts, one at
   a time.
5. tables.md (step "tables"): the README's condensed tables, from the two sweeps' summary.csv.
6. anchor/ (step "anchor"): what NVIDIA's tensorrt_llm_bls draft-target loop cannot do, measured
   here on the held-out grounded prompts: prompt lookup at one user and at 8 (streamed/, with the
   baseline), and unstreamed at one user (unstreamed/: the only mode that loop serves);
   anchor.md puts each figure beside the loop's limit.
--steps runs some of them; --quick makes every count tiny (a smoke test, not numbers to publish).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

from performance import update as update_performance

from specdec.build import build
from specdec.cli import main as specdec
from specdec.client.machine import describe, summary_line
from specdec.client.peer import compare, summary_markdown
from specdec.client.workloads import chat, grounded, interleave
from specdec.config import load_profile
from specdec.progress import console, progress_bar
from specdec.tokenizer import TextTokenizer
from specdec.triton.serve import Ports, TritonServer


def condensed_table(summary_csv: Path) -> str:
    """Per workload and concurrency: each arm's output tokens/s, inter-token latency p50 and speedup."""
    rows = list(csv.DictReader(summary_csv.open()))
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    header = ["workload", "c", *(f"{a} tok/s (ITL p50 ms)" for a in arms), *(f"{a} speedup" for a in arms[1:])]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    levels = list(dict.fromkeys((r["workload"], r["concurrency"]) for r in rows))
    for workload, c in levels:
        by_arm = {r["arm"]: r for r in rows if (r["workload"], r["concurrency"]) == (workload, c)}
        cells = [f"{float(by_arm[a]['output_token_throughput']):.1f} "
                 f"({float(by_arm[a]['inter_token_latency_p50_ms']):.0f})" for a in arms]  # fmt: skip
        gains = [f"{float(by_arm[a]['speedup']):.2f}x" for a in arms[1:]]
        lines.append("| " + " | ".join([workload, c, *cells, *gains]) + " |")
    return "\n".join(lines) + "\n"


# relative to the working directory, as the reports print it
ANCHOR_PROMPTS = os.path.relpath(Path(__file__).parent / "prompts" / "heldout-grounded.jsonl")
BLS_MODEL = "TensorRT-LLM's `triton_backend/all_models/inflight_batcher_llm/tensorrt_llm_bls/1`"


def anchor_table(streamed: dict, unstreamed: dict, arm: str, many: int) -> str:
    """Each limit of the tensorrt_llm_bls draft-target loop beside what the two bench runs
    (bench.json of `--concurrency 1,MANY` with the baseline, and of one user `--no-stream`) measured."""

    def summary(run: dict, users: int, name: str) -> dict:
        return next(level for level in run["levels"] if level["load"]["concurrency"] == users)["summary"][name]

    one, several = summary(streamed, 1, arm), summary(streamed, many, arm)
    rate, rate_several = one["output_token_throughput"], several["output_token_throughput"]
    baseline_several = summary(streamed, many, "baseline")["output_token_throughput"]
    first_text = one["time_to_first_token"]["p50"]  # ms
    first_text_unstreamed = summary(unstreamed, 1, arm)["time_to_first_token"]["p50"]
    interval = one["speedup_interval"]  # none over fewer than eight rounds
    spread = f" (95% interval {interval[0]:.2f}-{interval[1]:.2f}x)" if interval else ""
    same, total = one["same_text_as_baseline"]
    rows = [
        ("requests at once",
         "one per BLS instance: `decode()` refuses a batch above 1 (\"speculative decoding is not supported with "
         "batch size > 1\") and `execute()` runs each of its requests to its last token before the next",
         f"{rate_several:.1f} tokens/s at {many} users, {rate_several / rate:.2f}x the {rate:.1f} of one user; "
         f"{several['speedup']:.2f}x the baseline's {baseline_several:.1f} at {many} users"),
        ("streaming",
         "refused: `Request.validate()` raises \"streaming is not supported with speculative decoding\"; "
         "the text comes in one response at the end",
         f"first text after {first_text:.0f} ms (p50), against {first_text_unstreamed:.0f} ms for the "
         "same requests unstreamed"),
        ("speedup at one user",
         "none reported (tensorrtllm_backend issue 498: Llama-3 70B with an 8B draft on 4 A100s)",
         f"{one['speedup']:.2f}x the baseline{spread}, {rate:.1f} tokens/s; "
         f"the same text in {same} of {total}"),
    ]  # fmt: skip
    lines = [f"| | tensorrt_llm_bls ({BLS_MODEL}: `lib/decode.py`, `model.py`) | `{arm}` here |", "|---|---|---|"]
    lines += [f"| {point} | {theirs} | {ours} |" for point, theirs, ours in rows]
    return "\n".join(lines) + "\n"


def write_tables(out: Path) -> None:
    parts = []
    for folder, title in (("sweep-blocks", "each arm alone on the server (--interleave block)"),
                          ("sweep", "the arms sharing the server (--interleave request)")):  # fmt: skip
        if (out / folder / "summary.csv").is_file():
            parts.append(f"{title}:\n\n{condensed_table(out / folder / 'summary.csv')}")
    (out / "tables.md").write_text("\n".join(parts))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "readme")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--steps", default="sweep,blocks,anchor,peer")
    args = ap.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    if args.steps == "tables":
        write_tables(out)
        update_performance(out)  # docs/performance.md, where this run is the tree's
        return 0
    machine = describe()
    (out / "machine.json").write_text(json.dumps(machine, indent=1))
    with (out / "machine.md").open("a") as f:  # one line per invocation
        f.write(f"{time.strftime('%Y-%m-%d %H:%M %Z')}, steps {args.steps}: {summary_line(machine)}; {machine['os']}; "
                f"load averages at the start {machine['load_average']}\n")  # fmt: skip

    sweep = {"concurrency": "1,2" if args.quick else "1,2,4,8", "requests": "2" if args.quick else "8",
             "max_tokens": "16" if args.quick else "128"}  # fmt: skip
    peer_prompts, peer_tokens = (2, 16) if args.quick else (6, 128)
    k = 5

    steps = set(args.steps.split(","))
    profile = load_profile()
    build(profile)
    started = time.time()
    with TritonServer(profile, ports=Ports.free()) as server:
        bench = ["bench", "--url", server.grpc_url, "--metrics-url", server.metrics_url,
                 "--server-pid", str(server.process.pid)]  # fmt: skip
        for step, mode, folder in (("sweep", "request", "sweep"), ("blocks", "block", "sweep-blocks")):
            if step not in steps:
                continue
            argv = [*bench, "--interleave", mode,
                    "--arms", f"baseline,ngram:{k},draft_model:{k}", "--workload", "grounded,chat",
                    "--concurrency", sweep["concurrency"], "--num-requests", sweep["requests"],
                    "--max-tokens", sweep["max_tokens"], "--warmup", "2",
                    "--goodput", "ttft:2000", "tpot:100", "--output-dir", str(out / folder)]  # fmt: skip
            if specdec(argv) != 0:
                return 1
        write_tables(out)
        if "anchor" in steps:
            many = 2 if args.quick else 8
            arm = f"ngram:{profile.speculation.max_draft_tokens}"
            common = [*bench, "--workload", ANCHOR_PROMPTS, "--num-requests", "2" if args.quick else "32",
                      "--max-tokens", sweep["max_tokens"], "--warmup", "2", "--no-plots"]  # fmt: skip
            runs = {"streamed": ["--arms", f"baseline,{arm}", "--concurrency", f"1,{many}"],
                    "unstreamed": ["--arms", arm, "--concurrency", "1", "--no-stream"]}  # fmt: skip
            for folder, argv in runs.items():
                if specdec([*common, *argv, "--output-dir", str(out / "anchor" / folder)]) != 0:
                    return 1
            streamed, unstreamed = (json.loads((out / "anchor" / f / "bench.json").read_text()) for f in runs)
            (out / "anchor" / "anchor.md").write_text(anchor_table(streamed, unstreamed, arm, many))
        if "peer" not in steps:
            update_performance(out)
            return 0

        tokenizer = TextTokenizer(profile.model_dir("target"))
        prompts = interleave(grounded(peer_tokens), chat(peer_tokens))[:peer_prompts]
        ids = [tokenizer.encode(tokenizer.chat_prompt(p.text)) for p in prompts]
        draft_dir = profile.model_dir("draft") if profile.draft else None
        with progress_bar() as progress:
            task = progress.add_task("peer comparison", total=len(ids) * (6 if draft_dir else 4))
            runs = compare(server.internal, ids, peer_tokens, tokenizer.eos_id, profile.model_dir("target"),
                           draft_dir, k, on_done=lambda _: progress.advance(task))  # fmt: skip
    table = summary_markdown(runs)
    (out / "peer.md").write_text(
        f"{len(ids)} prompts (grounded and chat taking turns), greedy, {peer_tokens} new tokens at most, one "
        f"request at a time, methods taking turns prompt by prompt; draft length {k}.\n\n{table}"
    )
    (out / "peer.json").write_text(json.dumps({"prompts": [asdict(p) for p in prompts],
                                               "runs": [asdict(r) for r in runs]}, indent=1))  # fmt: skip
    console.print(table, markup=False)
    console.print(f"done in {(time.time() - started) / 60:.1f} min; results in {out}")
    update_performance(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
