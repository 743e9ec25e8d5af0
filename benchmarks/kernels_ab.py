"""The engine's forwards with this tree's CPU kernels against another revision's, taking turns.

    .venv/bin/python benchmarks/kernels_ab.py --base REV [--pairs 20]

Loads the embedded target twice, over each version of specdec/engine/kernels.py (the base
revision's from git), and runs each case with both on one KV cache, taking turns, so that both see
the same states of a shared machine: rows of one sequence after a 250-token prompt (a step, and
verifications of 4, 8 and 16 drafts), 16 sequences of one row each, and a 250-token prefill.
Prints the median of each and the median of the paired ratios (this tree / base), then how far
the logits of a 250-token prompt move between the two and whether every greedy choice stays.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import torch

from specdec.build import build
from specdec.config import load_profile
from specdec.engine.model import Llama
from specdec.engine.ops import CpuOps
from specdec.progress import console, progress_bar

PROMPT = 250


def base_kernels(rev: str, folder: Path) -> ModuleType:
    source = subprocess.run(
        ["git", "show", f"{rev}:specdec/engine/kernels.py"], capture_output=True, check=True, cwd=Path(__file__).parent
    ).stdout
    path = folder / "kernels_base.py"
    path.write_bytes(source)
    spec = importlib.util.spec_from_file_location("kernels_base", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cases(prompt: torch.Tensor) -> dict[str, tuple[torch.Tensor, ...]]:
    """name -> (tokens, positions, slots): the prompt is cached in slots 0..15."""
    one = torch.zeros(17, dtype=torch.int64)
    after = torch.arange(PROMPT, PROMPT + 17)
    out = {f"{n} row{'s' * (n > 1)} of one sequence": (prompt[:n], after[:n], one[:n]) for n in (1, 5, 9, 17)}
    out["16 sequences, 1 row each"] = (prompt[:16], torch.full((16,), PROMPT), torch.arange(16))
    out[f"prefill of {PROMPT} tokens"] = (prompt, torch.arange(PROMPT), torch.full((PROMPT,), 16))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="git revision whose kernels.py to compare with")
    ap.add_argument("--pairs", type=int, default=20)
    args = ap.parse_args(argv)
    profile = load_profile()
    build(profile)
    with tempfile.TemporaryDirectory() as folder:
        base = base_kernels(args.base, Path(folder))
        models = {
            "base": Llama(profile.model_dir("target"), ops=CpuOps(base)),
            "this tree": Llama(profile.model_dir("target")),
        }
        cache = models["base"].new_cache(17, 1024)
        prompt = torch.randint(0, models["base"].cfg.vocab_size, (PROMPT,), generator=torch.Generator().manual_seed(0))

        def forward(name, tokens, positions, slots, logit_rows=None):
            rows = torch.tensor([len(tokens) - 1]) if logit_rows is None else logit_rows
            return models[name].forward(cache, tokens, positions, slots, rows)

        for slot in range(16):
            forward("this tree", prompt, torch.arange(PROMPT), torch.full((PROMPT,), slot))
        runs = cases(prompt)
        seconds = {case: {name: [] for name in models} for case in runs}
        with progress_bar() as bar:
            task = bar.add_task("forward pairs", total=args.pairs + 1)
            for i in range(args.pairs + 1):  # the first round compiles or loads, untimed
                for case, inputs in runs.items():
                    for name in sorted(models, reverse=i % 2 == 1):
                        start = time.perf_counter()
                        forward(name, *inputs)
                        if i:
                            seconds[case][name].append(time.perf_counter() - start)
                bar.advance(task)
        every = torch.arange(PROMPT)
        logits = {name: forward(name, prompt, every, torch.full((PROMPT,), 16), every) for name in models}

    lines = [
        f"kernels.py of this tree against {args.base}, {args.pairs} pairs each, forward ms (median):",
        "",
        "| forward | base | this tree | this tree / base, median of pairs |",
        "|---|---|---|---|",
    ]
    for case, by in seconds.items():
        ratio = statistics.median(a / b for a, b in zip(by["this tree"], by["base"], strict=True))
        lines.append(
            f"| {case} | {statistics.median(by['base']) * 1e3:.1f} | "
            f"{statistics.median(by['this tree']) * 1e3:.1f} | {ratio:.3f} |"
        )
    diff = (logits["this tree"] - logits["base"]).abs().max().item()
    same = bool((logits["this tree"].argmax(-1) == logits["base"].argmax(-1)).all())
    lines += ["", f"Logits of a {PROMPT}-token prompt: largest difference {diff:.2e}; every argmax the same: {same}."]
    console.print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
