"""The engine's forwards at another git revision against this tree's, taking turns.

    .venv/bin/python benchmarks/engine_ab.py --base REV [--pairs 20] [--dtype bfloat16]

Checks REV out into a temporary git worktree and runs two worker processes, one importing the
engine from there, one from this tree, each with the embedded target over its own KV cache. They
take turns on each case, so that both see the same states of a shared machine: rows of one
sequence after a 250-token prompt (a step, and verifications of 4, 8, 11, 13 and 15 drafts: the
profile's most), 16 sequences of one row each, and a 250-token prefill (--prompt N: N tokens).
Prints the median of each and the median of the paired ratios (this tree / base), then how far
the logits of the prompt move between the two and whether every greedy choice stays. Any
revision whose Llama has this tree's forward(cache, tokens, positions, slots, logit_rows) can be
the base, whatever its kernels.
--dtype sets this tree's engine dtype, --base-dtype the base's (both float32 by default): `--base
HEAD --dtype bfloat16` compares the two CPU engines of this build, `--base REV --dtype bfloat16
--base-dtype bfloat16` two builds' bf16 engines. --attention times the AMX engine's attention
(amx.attention, one layer, over the same cache and cases; random queries, the same in both; a
case's time the median of ATTENTION_CALLS calls) in place of whole forwards, and compares its
outputs over the prompt.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from specdec.build import build
from specdec.config import load_profile
from specdec.progress import console, progress_bar

PROMPT = 250  # tokens of the prompt, the default
ATTENTION_CALLS = 20  # a case's time with --attention: the median of this many calls
REPO = Path(__file__).resolve().parent.parent


def cases(prompt):
    """name -> (tokens, positions, slots): the prompt is cached in slots 0..15."""
    import torch

    length = len(prompt)
    one = torch.zeros(17, dtype=torch.int64)
    after = torch.arange(length, length + 17)
    out = {f"{n} row{'s' * (n > 1)} of one sequence": (prompt[:n], after[:n], one[:n]) for n in (1, 5, 9, 12, 14, 16)}
    out["16 sequences, 1 row each"] = (prompt[:16], torch.full((16,), length), torch.arange(16))
    out[f"prefill of {length} tokens"] = (prompt, torch.arange(length), torch.full((length,), 16))
    return out


def worker(model_dir: str, dtype: str, attention: bool, length: int) -> None:
    """Answers each line of stdin: a case name -> its forward's (or attention's) seconds;
    "logits" -> the logits of every position of the prompt (or attention's outputs over it) as
    .npy bytes, hex."""
    import torch

    from specdec.engine.model import Llama

    model = Llama(Path(model_dir), dtype=dtype)
    cache = model.new_cache(17, max(1024, length + 17))
    prompt = torch.randint(0, model.cfg.vocab_size, (length,), generator=torch.Generator().manual_seed(0))

    def forward(tokens, positions, slots, logit_rows=None):
        rows = torch.tensor([len(tokens) - 1]) if logit_rows is None else logit_rows
        return model.forward(cache, tokens, positions, slots, rows)

    every = torch.arange(length)
    for slot in range(16):
        forward(prompt, every, torch.full((length,), slot))
    run = forward
    if attention:  # attention alone reads the prefill case's keys: the forward is not there to write them
        forward(prompt, every, torch.full((length,), 16))
        run = layer_attention(model, cache, length)
    runs = cases(prompt)
    for inputs in runs.values():  # compile, or load from numba's cache
        run(*inputs)
    print(json.dumps(list(runs)), flush=True)
    for line in sys.stdin:
        name = line.strip()
        if name == "logits":
            buffer = io.BytesIO()
            np.save(buffer, np.asarray(run(prompt, every, torch.full((length,), 16), every)))
            print(buffer.getvalue().hex(), flush=True)
        else:  # attention alone: the median of several calls, each far shorter than a forward
            times = []
            for _ in range(ATTENTION_CALLS if attention else 1):
                start = time.perf_counter()
                run(*runs[name])
                times.append(time.perf_counter() - start)
            print(statistics.median(times), flush=True)


def layer_attention(model, cache, length: int):
    """run(tokens, positions, slots, logit_rows=None) -> the first layer's attention over the
    cache for len(tokens) rows of seeded random queries (amx.attention: the AMX engine's)."""
    from specdec.engine import amx
    from specdec.engine.ops import CpuBf16Ops, as_numpy

    if not isinstance(model.ops, CpuBf16Ops):
        raise SystemExit(f"--attention: the AMX engine's attention; this engine's ops are {type(model.ops).__name__}")
    keys, values = as_numpy(cache.k)[0], as_numpy(cache.v)[0]
    heads, head_dim = model.cfg.num_attention_heads, model.cfg.head_dim
    queries = np.random.default_rng(0).standard_normal((length, heads, head_dim), dtype=np.float32)

    def run(tokens, positions, slots, logit_rows=None):
        out = np.empty((len(tokens), heads * head_dim), dtype=np.float32)
        amx.attention(queries[: len(tokens)], keys, values, slots.numpy(), positions.numpy(), out)
        return out

    return run


class Worker:
    def __init__(self, source: Path, model_dir: Path, dtype: str, attention: bool, length: int):
        # libgomp's threads spin a while after each parallel region: in the waiting process they
        # would spin into the other one's forward
        env = {"GOMP_SPINCOUNT": "10000", **os.environ, "PYTHONPATH": str(source)}
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--worker", str(model_dir), "--dtype", dtype, "--prompt", str(length),
             *["--attention"] * attention],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=source,
        )  # fmt: skip
        self.cases = json.loads(self.process.stdout.readline())

    def ask(self, line: str) -> str:
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        return self.process.stdout.readline().strip()

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", help="git revision whose engine to compare with")
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="this tree's engine dtype")
    ap.add_argument("--base-dtype", default="float32", choices=["float32", "bfloat16"], help="the base's")
    ap.add_argument("--attention", action="store_true", help="time the AMX engine's attention, not forwards")
    ap.add_argument("--prompt", type=int, default=PROMPT, help="tokens of the prompt and of the prefill case")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker, args.dtype, args.attention, args.prompt)
        return 0
    if not args.base:
        ap.error("--base is required")
    profile = load_profile()
    build(profile)
    with tempfile.TemporaryDirectory() as folder:
        tree = Path(folder) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), args.base], cwd=REPO, check=True,
                       capture_output=True)  # fmt: skip
        try:
            workers = {
                "base": Worker(tree, profile.model_dir("target"), args.base_dtype, args.attention, args.prompt),
                "this tree": Worker(REPO, profile.model_dir("target"), args.dtype, args.attention, args.prompt),
            }
            seconds = {case: {name: [] for name in workers} for case in workers["base"].cases}
            with progress_bar() as bar:
                task = bar.add_task("forward pairs", total=args.pairs)
                for i in range(args.pairs):
                    for case in seconds:
                        for name in sorted(workers, reverse=i % 2 == 1):
                            seconds[case][name].append(float(workers[name].ask(case)))
                    bar.advance(task)
            logits = {name: np.load(io.BytesIO(bytes.fromhex(w.ask("logits")))) for name, w in workers.items()}
            for w in workers.values():
                w.close()
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, check=False)

    what, unit, scale = ("the first layer's attention", "us", 1e6) if args.attention else ("forward", "ms", 1e3)
    lines = [
        f"The engine of this tree ({args.dtype}) against {args.base}'s ({args.base_dtype}), {args.pairs} pairs each, "
        f"{what} {unit} (median):",
        "",
        "| forward | base | this tree | this tree / base, median of pairs |",
        "|---|---|---|---|",
    ]
    for case, by in seconds.items():
        ratio = statistics.median(a / b for a, b in zip(by["this tree"], by["base"], strict=True))
        lines.append(
            f"| {case} | {statistics.median(by['base']) * scale:.1f} | "
            f"{statistics.median(by['this tree']) * scale:.1f} | {ratio:.3f} |"
        )
    diff = float(np.abs(logits["this tree"] - logits["base"]).max())
    if args.attention:
        lines += ["", f"Attention over a {args.prompt}-token prompt: largest difference {diff:.2e}."]
    else:
        same = bool((logits["this tree"].argmax(-1) == logits["base"].argmax(-1)).all())
        lines += [
            "",
            f"Logits of a {args.prompt}-token prompt: largest difference {diff:.2e}; every argmax the same: {same}.",
        ]
    console.print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
