"""Prefills with KV cache reuse across requests against without, on a workload's prompts.

    .venv/bin/python benchmarks/prefix_reuse.py [--workload grounded] [--passes 2]

Two engines of the profile in this process, one with `kv_cache_reuse` and one without, take
turns prompt by prompt (the first alternating), so that both see the same states of a shared
machine. Each prompt (its chat template applied, as the server does) is prefilled as a new
request of its own sequence, which is then released: what a request's time to first token
spends in the engine. Each pass over the prompts has a cache salt of its own, as `specdec bench`
gives its passes, so a prompt reuses what the prompts before it in its pass share with it, never
itself. Prints the prompt tokens reused, the prefill seconds of each engine and their ratio.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from specdec.build import build
from specdec.client.machine import describe, summary_line
from specdec.client.workloads import WorkloadOptions, load_workload
from specdec.config import load_profile
from specdec.engine.engine import Engine, GenerationRequest
from specdec.progress import console, progress_bar
from specdec.tokenizer import TextTokenizer


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="grounded", help="built-in workload or .jsonl file")
    ap.add_argument("--passes", type=int, default=2)
    args = ap.parse_args(argv)
    profile = load_profile()
    build(profile)
    model_dir = profile.model_dir("target")
    tokenizer = TextTokenizer(model_dir)
    prompts = [
        np.asarray(tokenizer.prompt_ids(p.text, p.apply_chat_template))
        for p in load_workload(args.workload, WorkloadOptions())
    ]
    engines = {
        reuse: Engine(model_dir, dtype=profile.engine.dtype, kv_slots=profile.engine.kv_slots,
                      max_seq_len=profile.engine.max_seq_len, threads=profile.engine.threads, kv_cache_reuse=reuse)
        for reuse in (True, False)
    }  # fmt: skip
    for engine in engines.values():
        engine.warmup()
    seconds, reused = dict.fromkeys(engines, 0.0), dict.fromkeys(engines, 0)
    with progress_bar() as bar:
        task = bar.add_task("prefills", total=args.passes * len(prompts) * 2)
        for n in range(args.passes * len(prompts)):
            ids, salt = prompts[n % len(prompts)], f"pass {n // len(prompts)}"
            for reuse in (True, False) if n % 2 == 0 else (False, True):
                start = time.perf_counter()
                (result,) = engines[reuse].generate([GenerationRequest(ids, sequence_key="r", cache_salt=salt)])
                seconds[reuse] += time.perf_counter() - start
                reused[reuse] += result.reused
                engines[reuse].release("r")
                bar.advance(task)
    total = args.passes * sum(len(ids) for ids in prompts)
    console.print(
        f"{summary_line(describe())}. {args.workload}: {len(prompts)} prompts x {args.passes} passes, "
        f"{total} prompt tokens, {reused[True]} of them ({reused[True] / total:.0%}) reused across requests. "
        f"Prefills: {seconds[True]:.2f} s with reuse, {seconds[False]:.2f} s without: "
        f"{seconds[True] / seconds[False]:.3f}x."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
