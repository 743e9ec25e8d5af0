"""How far prompt lookup can go on a workload: the ceiling behind the grounded speedup target.

    .venv/bin/python benchmarks/copy_bound.py [--workload grounded,chat] [--max-tokens 128]
                                               [--out benchmarks/results/copy_bound]

Generates each prompt's greedy output with the engine the server runs (in this process, one
request at a time), then replays its decoding offline. Greedy verification accepts exactly the
common prefix of a draft and the real continuation, so the replay gives each round's accepted
length without running the model again, for any draft length k:
- our n-gram proposer as spec_decode runs it (PromptLookup, the profile's min_n/max_n), k fixed
  at 1..16;
- its best match: of all the earlier occurrences of the suffix the n-gram proposer matched, the
  one whose continuation is accepted furthest: the most any rule for choosing among its matches
  could accept;
- an oracle copier: each round drafts the longest continuation (k at most 16) that occurs
  anywhere in the context so far, the most any prompt lookup could accept;
- a tree of its matches (not built in the engine): the continuations of all the suffix's matches
  merged into a trie, of which the k most likely nodes are verified in one forward of k + 1 rows
  (match_tree), accepting the longest path that agrees with the output;
- with the profile's guess head: our n-gram proposer led by the engine's guesses where it matches
  little (PromptLookup.heard), each guess the engine's own for that point of the output;
- with the profile's phrase index too: as spec_decode serves the embedded profile.
Each replay is priced with the engine's measured forward times by row count (calibrate()) and
each prompt's measured prefill, as batch-1 tokens/s against plain decoding; "free verify"
prices a forward over k + 1 rows as one row. Writes copy_bound.md and copy_bound.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view
from performance import update as update_performance

from specdec.build import build
from specdec.build.guess_head import prefill_hidden
from specdec.client.machine import describe, summary_line
from specdec.client.workloads import WorkloadOptions, load_workload
from specdec.config import load_profile
from specdec.engine.engine import Engine, GenerationRequest
from specdec.engine.verify import accepted_length
from specdec.progress import console, progress_bar
from specdec.speculation.lookup import NgramProposer, PromptLookup
from specdec.speculation.phrases import PhraseIndex
from specdec.tokenizer import TextTokenizer

MAX_K = 16
# propose(context, continuation, k) -> drafts verified together, as the paths of a tree of at
# most k nodes (one draft: a chain); only the oracle looks at the continuation
Propose = Callable[[np.ndarray, np.ndarray, int], list[np.ndarray]]


@dataclass
class Sample:
    workload: str
    kind: str
    prompt: np.ndarray
    output: np.ndarray
    prefill_s: float
    guesses: list[list[int]] | None = None  # [n]: the engine's guesses at token n of prompt + output ([]: none)


def occurs(context: np.ndarray, span: np.ndarray) -> bool:
    if len(span) > len(context):
        return False
    return bool((sliding_window_view(context, len(span)) == span).all(axis=1).any())


def oracle_copy(context: np.ndarray, continuation: np.ndarray, k: int) -> list[np.ndarray]:
    """The longest head of the continuation (at most k tokens) found anywhere in the context."""
    length = 0
    while length < min(k, len(continuation)) and occurs(context, continuation[: length + 1]):
        length += 1
    return [continuation[:length]]


def served_lookup(lookup: PromptLookup) -> Propose:
    """spec_decode's prompt lookup for one request (it follows the copy it was making)."""

    def propose(context: np.ndarray, _continuation: np.ndarray, k: int) -> list[np.ndarray]:
        return [np.asarray(lookup.draft(context.tolist(), k), dtype=np.int64)]

    return propose


def guessed_lookup(lookup: PromptLookup, guesses: list[list[int]]) -> Propose:
    """served_lookup, hearing the engine's guesses for each point of the output."""

    def propose(context: np.ndarray, _continuation: np.ndarray, k: int) -> list[np.ndarray]:
        lookup.heard(len(context), guesses[len(context)])
        return [np.asarray(lookup.draft(context.tolist(), k), dtype=np.int64)]

    return propose


def engine_guesses(engine: Engine, prompt: np.ndarray, output: np.ndarray) -> list[list[int]]:
    """The guesses a round ending at each token of the output would bring: from one prefill of
    the whole sequence, whose rows are bit for bit those of the decoding."""
    assert engine.guess_head is not None
    seq = np.concatenate([prompt, output])
    rows = np.arange(len(prompt) - 1, len(seq) - 1)  # row t produced token t + 1
    hidden = prefill_hidden(engine, seq, rows)
    made = [  # one row at a time, as the rounds ask: the head keeps a sequence's own tokens as it grows
        engine.guess_head.guesses(
            hidden[i : i + 1], torch.from_numpy(seq[t + 1 : t + 2]), [0], [seq[: t + 2].tolist()]
        )[0]
        for i, t in enumerate(rows)
    ]
    guesses: list[list[int]] = [[] for _ in range(len(seq) + 1)]
    for t, g in zip(rows + 2, made, strict=True):
        guesses[t] = g
    return guesses


def best_match(ngram: NgramProposer) -> Propose:
    def propose(context: np.ndarray, continuation: np.ndarray, k: int) -> list[np.ndarray]:
        drafts = [context[start : start + k] for start in ngram.matches(context)[0]]
        return [max(drafts, key=lambda d: accepted_length(d, continuation), default=context[:0])]

    return propose


def match_tree(ngram: NgramProposer, recency: float = 0.5, decay: float = 0.8) -> Propose:
    """The k most likely nodes of the trie of all the suffix's matches' continuations. A match
    weighs recency^(its age in matches) (the most recent 1); a node's likelihood is its parent's
    times the share of the parent's weight that goes on to it, times decay a token."""

    def propose(context: np.ndarray, _continuation: np.ndarray, k: int) -> list[np.ndarray]:
        starts = ngram.matches(context)[0]
        weight: dict[tuple[int, ...], float] = {}
        for age, start in enumerate(starts[::-1]):
            path = tuple(context[start : start + k].tolist())
            for depth in range(1, len(path) + 1):
                weight[path[:depth]] = weight.get(path[:depth], 0.0) + recency**age
        total = sum(w for node, w in weight.items() if len(node) == 1)
        likely: dict[tuple[int, ...], float] = {}
        for node in sorted(weight, key=len):  # parents first; a first token's parent is the root
            parent = node[:-1]
            likely[node] = likely.get(parent, 1.0) * weight[node] / weight.get(parent, total) * decay
        return [np.asarray(node) for node in sorted(likely, key=likely.get, reverse=True)[:k]]

    return propose


def tree_rows(drafts: list[np.ndarray]) -> int:
    """Draft rows of a tree with these paths: their distinct prefixes."""
    return len({tuple(d[: i + 1].tolist()) for d in drafts for i in range(len(d))})


def replay(sample: Sample, propose: Propose, k: int) -> list[int]:
    """The draft rows of each round (0: a plain step) of replaying the sample's greedy decoding
    with drafts of at most k tokens; len() is the number of rounds."""
    tokens, i, rows = list(sample.prompt), 0, []
    out = sample.output
    while i < len(out):
        # the prefill round carries no draft (as in spec_decode); a round never goes past the output's end
        budget = min(k, len(out) - i - 1) if i else 0
        drafts = propose(np.asarray(tokens), out[i:], budget) if budget > 0 else []
        n = max((accepted_length(d, out[i:]) for d in drafts), default=0)
        rows.append(tree_rows(drafts))
        tokens += out[i : i + n + 1].tolist()
        i += n + 1
    return rows


def forward_times(engine: Engine, rows: tuple[int, ...], passes: int = 10) -> dict[int, float]:
    """Seconds of a forward by row count: the best of several passes over all counts."""
    return dict(zip(rows, engine.calibrate(rows=rows, repeats=passes)["seconds"], strict=True))


def generate(engine: Engine, tokenizer: TextTokenizer, workloads: list[str], max_tokens: int) -> list[Sample]:
    prompts = [(w, p) for w in workloads for p in load_workload(w, WorkloadOptions(max_tokens=max_tokens))]
    samples = []
    with progress_bar() as bar:
        task = bar.add_task("greedy outputs", total=len(prompts))
        for workload, p in prompts:
            ids = np.asarray(tokenizer.encode(tokenizer.chat_prompt(p.text)), dtype=np.int64)
            start = time.perf_counter()
            engine.generate([GenerationRequest(ids, max_new_tokens=1)])  # the prompt's prefill
            prefill = time.perf_counter() - start
            (result,) = engine.generate([GenerationRequest(ids, max_new_tokens=p.max_tokens, end_id=tokenizer.eos_id)])
            output = np.asarray(result.tokens, dtype=np.int64)
            guesses = engine_guesses(engine, ids, output) if engine.guess_head is not None else None
            samples.append(Sample(workload, p.kind, ids, output, prefill, guesses))
            bar.advance(task)
    return samples


def price(samples: list[Sample], rounds: list[list[int]], step: dict[int, float], prefill: bool) -> float:
    """Speedup over plain decoding of the same outputs: (prefill +) one step per token against
    (prefill +) one forward of draft + 1 rows per round."""
    base = sum(len(s.output) * step[1] + prefill * s.prefill_s for s in samples)
    spec = sum(sum(step[d + 1] for d in r) + prefill * s.prefill_s for s, r in zip(samples, rounds, strict=True))
    return base / spec


def groups(samples: list[Sample]) -> dict[str, list[Sample]]:
    """Each task kind, then each workload whole (what a benchmark run measures)."""
    out = {kind: [s for s in samples if s.kind == kind] for kind in dict.fromkeys(s.kind for s in samples)}
    for workload in dict.fromkeys(s.workload for s in samples):
        members = [s for s in samples if s.workload == workload]
        if len({s.kind for s in members}) > 1:
            out[f"{workload} (all)"] = members
    return out


def analyse(
    samples: list[Sample], step: dict[int, float], ngram: NgramProposer, phrases: PhraseIndex | None = None
) -> list[dict]:
    free = dict.fromkeys(step, step[1])
    # each sample's proposer: the served prompt lookup keeps state along a request
    proposers: dict[str, Callable[[Sample], Propose]] = {
        "ngram": lambda sample: served_lookup(PromptLookup(ngram, len(sample.prompt))),
        "best match": lambda _sample: best_match(ngram),
        "match tree": lambda _sample: match_tree(ngram),
        "oracle": lambda _sample: oracle_copy,
    }
    if all(s.guesses is not None for s in samples):
        proposers["ngram + guess"] = lambda s: guessed_lookup(PromptLookup(ngram, len(s.prompt)), s.guesses)
        if phrases is not None:
            proposers["ngram + guess + phrases"] = lambda s: guessed_lookup(
                PromptLookup(ngram, len(s.prompt), phrases), s.guesses
            )
    rows = []
    for kind, group in groups(samples).items():
        tokens = sum(len(s.output) for s in group)
        row: dict = {"kind": kind, "prompts": len(group), "tokens": tokens,
                     "prefill_share": sum(s.prefill_s for s in group)
                     / sum(s.prefill_s + len(s.output) * step[1] for s in group),
                     "proposers": {}}  # fmt: skip
        for name, make in proposers.items():
            by_k = {k: [replay(s, make(s), k) for s in group] for k in range(1, MAX_K + 1)}
            best = max(by_k, key=lambda k: price(group, by_k[k], step, prefill=True))
            row["proposers"][name] = {
                "tokens_per_round_max_k": tokens / sum(len(r) for r in by_k[MAX_K]),
                "best_k": best,
                "speedup": price(group, by_k[best], step, prefill=True),
                "speedup_decode_only": price(group, by_k[best], step, prefill=False),
                "speedup_free_verify_max_k": price(group, by_k[MAX_K], free, prefill=True),
            }
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "copy_bound")
    ap.add_argument("--workload", default="grounded,chat")
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args(argv)
    profile = load_profile()
    build(profile)
    model_dir = profile.model_dir("target")
    engine = Engine(
        model_dir, dtype=profile.engine.dtype, kv_slots=2, max_seq_len=1024, threads=profile.engine.threads,
        guess_head=profile.speculation.ngram.guess_head,
    )  # fmt: skip
    engine.warmup()
    step = forward_times(engine, rows=tuple(range(1, MAX_K + 2)))
    samples = generate(engine, TextTokenizer(model_dir), args.workload.split(","), args.max_tokens)
    options = profile.speculation.ngram
    phrases = PhraseIndex.load(options.phrases) if options.phrases else None
    rows = analyse(samples, step, NgramProposer(options.min_n, options.max_n), phrases)

    lines = [
        f"Machine: {summary_line(describe())}. Forward ms by rows: "
        + ", ".join(f"{r}: {s * 1e3:.1f}" for r, s in step.items())
        + ".",
        "",
        f"| task | prompts | tokens | prefill share | proposer | tokens/round, k={MAX_K} | best k | speedup "
        f"(decode only) | free verify, k={MAX_K} |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        task = f"| {r['kind']} | {r['prompts']} | {r['tokens']} | {r['prefill_share']:.0%} |"
        for name, p in r["proposers"].items():
            lines.append(
                f"{task} {name} | {p['tokens_per_round_max_k']:.2f} | {p['best_k']} | {p['speedup']:.2f}x "
                f"({p['speedup_decode_only']:.2f}x) | {p['speedup_free_verify_max_k']:.2f}x |"
            )
            task = "| | | | |"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "copy_bound.md").write_text("\n".join(lines) + "\n")
    (args.out / "copy_bound.json").write_text(json.dumps({"forward_s": step, "tasks": rows}, indent=1))
    console.print("\n".join(lines))
    update_performance(args.out)  # docs/performance.md, where this run is the tree's
    return 0


if __name__ == "__main__":
    sys.exit(main())
