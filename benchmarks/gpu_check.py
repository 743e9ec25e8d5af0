"""The GPU check: the PyTorch engine on CUDA through the spec_decode service, in process.

    python3 benchmarks/gpu_check.py [--out FILE]            # on one GPU, within 8 minutes
    .venv/bin/python benchmarks/gpu_check.py --device cpu --quick   # the same code on a tiny model

Runs with nothing but this repository and the machine's own PyTorch and CUDA: no network, no
TensorRT-LLM, no tritonserver. The engine is the pytorch-cuda profile's (specdec.engine.Engine,
dtype auto: bfloat16 on CUDA) over a model of SmolLM2-135M's shape with random weights made on
the spot (the real weights cannot travel to such a machine), and a draft of its first 4 layers.
Measures, in one JSON file:

- exactness: greedy tokens of prompt lookup and of the draft model at every draft length 1..8
  against plain decoding of the same prompts (each mismatch with where it starts);
- verification cost: one forward of 1..32 rows against one of a row (Engine.calibrate);
- throughput: tokens/s of 1, 8 and 32 requests at once, plain and with prompt lookup, and the
  share of draft tokens accepted.

A random model's outputs are not text; prompt lookup's acceptance on them says nothing about real
prompts (benchmarks/targets.py measures that on the real model). The draft of 4 layers agrees
with its target as rarely as SmolLM2's own truncated drafts do: it is there for exactness.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from performance import update as update_performance

from specdec.build.cpu import truncate_layers
from specdec.build.random_weights import SMOLLM2_SHAPE, write_random_llama
from specdec.client.machine import describe
from specdec.config import parse_profile
from specdec.engine.engine import Engine
from specdec.engine.sampling import SamplingParams
from specdec.speculation.loop import RequestSpec
from specdec.triton.service import SpecDecodeService, local_call
from specdec.triton.tensors import SpecDecodeRequest

QUICK_SHAPE = {**SMOLLM2_SHAPE, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
               "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512}  # fmt: skip
DRAFT_LAYERS = 4
DRAFT_LENGTHS = range(1, 9)


def prompts(vocab: int, count: int, seed: int = 0) -> list[list[int]]:
    """Prompts whose second half repeats their first (something for prompt lookup to find)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        passage = rng.integers(3, vocab, size=int(rng.integers(48, 96))).tolist()
        out.append(passage + rng.integers(3, vocab, size=8).tolist() + passage)
    return out


def service_for(target: Path, draft: Path, device: str, slots: int, build: Path):
    """The spec_decode service over a target and a draft engine in this process, and the engines."""
    profile = parse_profile({
        "name": "gpu-check", "build_dir": str(build),
        "target": {"hf_dir": str(target)}, "draft": {"hf_dir": str(draft)},
        "engine": {"device": device, "dtype": "auto", "kv_slots": slots, "max_seq_len": 512, "max_batch_size": slots},
        "speculation": {"proposer": "ngram", "num_draft_tokens": 4, "max_draft_tokens": 8,
                        "adaptive": {"enabled": False}, "ngram": {"opening": False}},
        "server": {"max_inflight": slots, "batch_wait_ms": 0},
    })  # fmt: skip
    engines = {
        role: Engine(path, device=device, dtype="auto", kv_slots=slots, max_seq_len=512)
        for role, path in (("target", target), ("draft", draft))
    }
    for engine in engines.values():
        engine.warmup()
    return SpecDecodeService(profile, local_call(engines)), engines


async def generate(service: SpecDecodeService, prompt: list[int], n: int, proposer: str, k: int):
    req = SpecDecodeRequest(RequestSpec(prompt, n, k), SamplingParams(), proposer, True, False)
    tokens, stats = [], None
    async for chunk in service.serve(req):
        tokens += chunk.tokens
        stats = chunk.gen.stats
    return tokens, stats


def first_difference(tokens: list[int], expected: list[int]) -> int:
    return next((i for i, (a, b) in enumerate(zip(tokens, expected, strict=False)) if a != b), len(expected))


def exactness(service: SpecDecodeService, cases: list[list[int]], n: int) -> dict:
    async def run():
        plain = [(await generate(service, p, n, "none", 0))[0] for p in cases]
        checks = []
        for proposer in ("ngram", "draft_model"):
            for k in DRAFT_LENGTHS:
                outs = [await generate(service, p, n, proposer, k) for p in cases]
                mismatches = [
                    {"prompt": i, "first_differing_token": first_difference(tokens, expected)}
                    for i, ((tokens, _), expected) in enumerate(zip(outs, plain, strict=True))
                    if tokens != expected
                ]
                checks.append({
                    "proposer": proposer, "k": k, "exact": not mismatches, "mismatches": mismatches,
                    "draft_tokens": sum(s.draft_tokens for _, s in outs),
                    "accepted": sum(s.accepted_tokens for _, s in outs),
                })  # fmt: skip
        return checks

    checks = asyncio.run(run())
    return {"all_exact": all(c["exact"] for c in checks), "checks": checks}


def verification_cost(engine: Engine, rows: tuple[int, ...]) -> dict:
    table = engine.calibrate(rows=rows)
    step = table["seconds"][0]
    return {**table, "relative_to_one_row": [s / step for s in table["seconds"]]}


def throughput(service: SpecDecodeService, cases: list[list[int]], n: int, levels: tuple[int, ...]) -> list[dict]:
    async def level(users: int, proposer: str):
        batch = [cases[i % len(cases)] for i in range(users)]
        start = time.perf_counter()
        outs = await asyncio.gather(*(generate(service, p, n, proposer, 0 if proposer == "none" else 8) for p in batch))
        seconds = time.perf_counter() - start
        tokens = sum(len(t) for t, _ in outs)
        drafted = sum(s.draft_tokens for _, s in outs)
        accepted = sum(s.accepted_tokens for _, s in outs)
        return {"requests": users, "proposer": proposer, "tokens": tokens, "seconds": seconds,
                "tokens_per_s": tokens / seconds, "acceptance": accepted / drafted if drafted else 0.0}  # fmt: skip

    out = []
    for users in levels:
        plain, lookup = asyncio.run(level(users, "none")), asyncio.run(level(users, "ngram"))
        out += [plain, {**lookup, "speedup": lookup["tokens_per_s"] / plain["tokens_per_s"]}]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="a tiny model, few rows and users (tests)")
    ap.add_argument("--out", type=Path, help="default: $OUT/gpu_check.json, else benchmarks/results/gpu_check/")
    args = ap.parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run on a GPU machine, or pass --device cpu", file=sys.stderr)
        return 2
    shape, rows, levels, n = (
        (QUICK_SHAPE, (1, 2, 4, 8), (1, 2), 12) if args.quick else (SMOLLM2_SHAPE, tuple(range(1, 33)), (1, 8, 32), 64)
    )
    out = args.out or (Path(os.environ["OUT"]) / "gpu_check.json" if os.environ.get("OUT")
                       else Path("benchmarks/results/gpu_check/gpu_check.json"))  # fmt: skip
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        target = write_random_llama(Path(tmp) / "target", shape, seed=0)
        truncate_layers(target, Path(tmp) / "draft", min(DRAFT_LAYERS, shape["num_hidden_layers"]))
        service, engines = service_for(target, Path(tmp) / "draft", args.device, max(levels), Path(tmp) / "build")
        cases = prompts(shape["vocab_size"], 3 if args.quick else 6)
        report = {
            "machine": describe(),
            "torch": torch.__version__,
            "device": torch.cuda.get_device_name() if args.device == "cuda" else args.device,
            "dtype": str(engines["target"].model.dtype),
            "model": {"shape": shape, "weights": "random", "draft_layers": DRAFT_LAYERS},
            "exactness": exactness(service, cases[:3], n),
            "verification_cost": verification_cost(engines["target"], rows),
            "throughput": throughput(service, cases, n, levels),
        }
    report["seconds"] = time.perf_counter() - started
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(json.dumps({k: report[k] for k in ("device", "dtype", "seconds")} | {
        "all_exact": report["exactness"]["all_exact"],
        "verify_32_rows_vs_1": report["verification_cost"]["relative_to_one_row"][-1],
        "speedups": [t["speedup"] for t in report["throughput"] if "speedup" in t],
    }))  # fmt: skip
    print(f"wrote {out}")
    update_performance(out.parent)  # docs/performance.md, where this run is the tree's
    return 0 if report["exactness"]["all_exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
