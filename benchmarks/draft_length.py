"""The default draft length: the cap on drafts (num_draft_tokens) that serves requests which send
none best, for the profile's speculation.num_draft_tokens.

    .venv/bin/python benchmarks/draft_length.py [--lengths 5,8,12,15] [--num-requests 16]
        [--max-tokens 128] [--grounded benchmarks/prompts/fresh-grounded.jsonl]
        [--open benchmarks/prompts/fresh-open.jsonl] [--profile configs/embedded.yaml]

Runs `specdec bench` on one server of the profile, one user, the baseline and prompt lookup capped
at each length taking turns in blocks of the same prompts, on grounded and on open-ended prompts
(the tuning sets: the held-out ones stay for the headline figures). The adaptive controller
shortens drafts where they do not pay, so the cap decides how long drafts may run where they are
accepted long. Writes --out (benchmarks/results/draft_length/): draft_length.md, each length's
speedup per workload with its 95% interval and the geometric mean over the workloads, the best
by that mean named; draft_length.json, the bench's rows; draft_length.png. Every text must equal
the baseline's. --bench-dir DIR summarises a bench already run with these arms instead.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import tempfile
from pathlib import Path

from performance import update as update_performance

from specdec.cli import main as specdec
from specdec.client.machine import summary_line

RESULTS = Path(__file__).parent / "results" / "draft_length"
PROMPTS = Path(__file__).parent / "prompts"


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="5,8,12,15", help="the caps to compare (comma-separated)")
    ap.add_argument("--num-requests", type=int, default=16, help="requests per arm and workload")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--grounded", type=Path, default=PROMPTS / "fresh-grounded.jsonl")
    ap.add_argument("--open", type=Path, default=PROMPTS / "fresh-open.jsonl")
    ap.add_argument("--profile", help="default: the embedded profile")
    ap.add_argument("--bench-dir", type=Path, help="summarise this bench's output instead of running one")
    ap.add_argument("--out", type=Path, default=RESULTS)
    return ap


def run_bench(args: argparse.Namespace, lengths: list[int], out: Path) -> None:
    argv = ["bench", "--workload", f"{args.grounded},{args.open}", "--concurrency", "1",
            "--arms", ",".join(["baseline", *(f"ngram:{k}" for k in lengths)]),
            "--num-requests", str(args.num_requests), "--max-tokens", str(args.max_tokens),
            "--no-plots", "--output-dir", str(out)]  # fmt: skip
    if args.profile:
        argv += ["--profile", args.profile]
    if specdec(argv) != 0:
        raise SystemExit("the bench failed")


def speedups(rows: list[dict], lengths: list[int]) -> dict[str, dict[int, tuple[float, float, float]]]:
    """{workload: {length: (speedup, low, high)}} from the bench's summary rows."""
    table: dict[str, dict[int, tuple[float, float, float]]] = {}
    for row in rows:
        if row["concurrency"] == "1" and row["arm"].startswith("ngram:") and int(row["arm"].split(":")[1]) in lengths:
            cell = (float(row["speedup"]), float(row["speedup_low"]), float(row["speedup_high"]))
            table.setdefault(Path(row["workload"]).stem, {})[int(row["arm"].split(":")[1])] = cell
    return table


def report(table: dict[str, dict[int, tuple[float, float, float]]], lengths: list[int], head: str) -> str:
    """The markdown table, naming the best length by the geometric mean of its speedups."""
    means = {k: math.exp(sum(math.log(table[w][k][0]) for w in table) / len(table)) for k in lengths}
    best = max(lengths, key=lambda k: means[k])
    lines = [head, "", "| num_draft_tokens | " + " | ".join(table) + " | geometric mean |",
             "|---|" + "---|" * (len(table) + 1)]  # fmt: skip
    for k in lengths:
        cells = " | ".join(f"{s:.2f}x ({lo:.2f}-{hi:.2f})" for s, lo, hi in (table[w][k] for w in table))
        mark = "**" if k == best else ""
        lines.append(f"| {mark}{k}{mark} | {cells} | {mark}{means[k]:.2f}x{mark} |")
    lines += ["", f"Best for requests that send no num_draft_tokens: **{best}**."]
    return "\n".join(lines) + "\n"


def plot(table: dict[str, dict[int, tuple[float, float, float]]], lengths: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for workload, cells in table.items():
        values = [cells[k] for k in lengths]
        mid = [s for s, _, _ in values]
        errors = [[s - lo for s, lo, _ in values], [hi - s for s, _, hi in values]]
        ax.errorbar(lengths, mid, yerr=errors, marker="o", capsize=3, label=workload)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xlabel("num_draft_tokens (the cap)")
    ax.set_ylabel("speedup over the baseline, 1 user")
    ax.set_xticks(lengths)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    lengths = sorted(int(k) for k in args.lengths.split(","))
    with tempfile.TemporaryDirectory() as scratch:
        bench_dir = args.bench_dir or Path(scratch)
        if args.bench_dir is None:
            run_bench(args, lengths, bench_dir)
        with (bench_dir / "summary.csv").open() as f:
            rows = list(csv.DictReader(f))
        machine = json.loads((bench_dir / "bench.json").read_text())["machine"]
    differing = [f"{r['workload']} {r['arm']}: {r['same_text_as_baseline']}" for r in rows
                 if r["arm"] != "baseline" and r["same_text_as_baseline"].split("/")[0] != r["requests"]]  # fmt: skip
    table = speedups(rows, lengths)
    same = "no" if differing else "yes"
    head = (f"One user, {args.max_tokens} tokens at most, {args.num_requests} requests per arm and workload; "
            f"every text the baseline's: {same}.\n\nMachine: {summary_line(machine)}.")  # fmt: skip
    text = report(table, lengths, head)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "draft_length.md").write_text(text)
    (args.out / "draft_length.json").write_text(json.dumps({"machine": machine, "rows": rows}, indent=1) + "\n")
    plot(table, lengths, args.out / "draft_length.png")
    print(text)
    update_performance(args.out)
    if differing:
        print("texts differ from the baseline's:\n  " + "\n  ".join(differing), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
