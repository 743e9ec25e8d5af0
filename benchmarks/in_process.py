"""Speculation without serving: the spec_decode service over the engine in this process.

    .venv/bin/python benchmarks/in_process.py [--workload benchmarks/prompts/heldout-grounded.jsonl]
                                              [--max-tokens 128] [--passes 1]

benchmarks/targets.py measures the one-user grounded figure through tritonserver. This runs the
same loop (SpecDecodeService: prompt lookup led by the phrase index and the engine's guesses, the
adaptive draft length) over the profile's target engine in this process (local_call: the engine
model's request parsing and batching, no Triton), the workload's prompts one after another,
greedy, the baseline and prompt lookup taking turns prompt by prompt (the first alternating), each
request with a cache salt of its own. The controller prices rows with the engine's start-up
calibration, as the server's does. Prints each arm's tokens/s, its tokens a decoding round and
the share of its time in forwards, and speculation's ratio; every text must equal the baseline's.
Where this and the served figure differ, serving costs one arm more than the other; where serving
costs both arms alike, they agree within a run's noise.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from specdec.build import build
from specdec.build.repository import engine_options
from specdec.client.machine import describe, summary_line
from specdec.client.workloads import from_jsonl
from specdec.config import Profile, load_profile
from specdec.engine.engine import Engine
from specdec.engine.sampling import SamplingParams
from specdec.progress import console
from specdec.speculation.controller import ForwardCost, calibration_path
from specdec.speculation.loop import RequestSpec
from specdec.tokenizer import TextTokenizer
from specdec.triton.service import SpecDecodeService, local_call
from specdec.triton.tensors import SpecDecodeRequest

ARMS = ("none", "ngram")  # the baseline and prompt lookup with up to max_draft_tokens drafts


@dataclass
class ArmTotals:
    seconds: float = 0.0  # from each request's start to its last chunk
    forward_s: float = 0.0  # of that, in the engine's forwards
    tokens: int = 0
    rounds: int = 0  # target calls, the prefills included
    requests: int = 0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def tokens_per_round(self) -> float:
        """Tokens a decoding round: the prefill's round (one token each request) left out."""
        return (self.tokens - self.requests) / (self.rounds - self.requests)


async def run_arms(service: SpecDecodeService, engine: Engine, prompts: list[list[int]], max_tokens: int,
                   end_id: int | None, passes: int = 1) -> dict[str, ArmTotals]:  # fmt: skip
    """Each prompt through each arm, `passes` times; the arms' totals. Raises where a text
    differs from the baseline's."""
    totals = {arm: ArmTotals() for arm in ARMS}
    k = service.profile.speculation.max_draft_tokens
    for n, prompt in enumerate(prompts * passes):
        outputs = {}
        for arm in ARMS if n % 2 == 0 else ARMS[::-1]:
            spec = RequestSpec(prompt, max_tokens, k if arm == "ngram" else 0, end_id)
            req = SpecDecodeRequest(spec, SamplingParams(), arm, True, True, cache_salt=secrets.token_hex(8))
            engine.recent_forwards.clear()
            start, tokens, rounds = time.perf_counter(), [], 0
            async for chunk in service.serve(req):
                tokens += chunk.tokens
                rounds = chunk.gen.stats.rounds
            total = totals[arm]
            total.seconds += time.perf_counter() - start
            total.forward_s += sum(seconds for _, seconds, _, _ in engine.recent_forwards)
            total.tokens += len(tokens)
            total.rounds += rounds
            total.requests += 1
            outputs[arm] = tokens
        if outputs["ngram"] != outputs["none"]:
            raise AssertionError(f"prompt {n % len(prompts)}: prompt lookup's tokens differ from the baseline's")
    return totals


def in_process_service(profile: Profile, engine: Engine, build_dir: Path) -> SpecDecodeService:
    """The service over `engine`, its controller pricing rows by the engine's calibration (written
    where the service looks for it: a build folder of its own, not the server's, which lends it
    its models)."""
    path = calibration_path(build_dir, "target")
    path.parent.mkdir(parents=True, exist_ok=True)
    (build_dir / "models").symlink_to(profile.build_path() / "models")
    calibration = engine.calibrate()
    path.write_text(ForwardCost(calibration["rows"], calibration["seconds"]).to_json())
    return SpecDecodeService(profile.model_copy(update={"build_dir": str(build_dir)}), local_call({"target": engine}))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", type=Path, default=Path("benchmarks/prompts/heldout-grounded.jsonl"))
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--passes", type=int, default=1)
    args = ap.parse_args(argv)
    profile = load_profile()
    build(profile)
    model_dir = profile.model_dir("target")
    engine = Engine(model_dir, **engine_options(profile, "target"))  # as the server's engine model makes it
    engine.warmup()
    tokenizer = TextTokenizer(model_dir)
    prompts = [tokenizer.prompt_ids(p.text, p.apply_chat_template) for p in from_jsonl(args.workload, args.max_tokens)]
    with tempfile.TemporaryDirectory() as build_dir:
        service = in_process_service(profile, engine, Path(build_dir))
        with console.status(f"{len(prompts)} prompts x {args.passes}, both arms"):
            totals = asyncio.run(run_arms(service, engine, prompts, args.max_tokens, tokenizer.eos_id, args.passes))
    console.print(f"Machine: {summary_line(describe())}. {args.workload}, greedy, {args.max_tokens} tokens at most.")
    for arm, total in totals.items():
        console.print(
            f"{arm:6s} {total.tokens_per_s:6.1f} tokens/s, {total.tokens_per_round:.2f} tokens a decoding round, "
            f"{total.forward_s / total.seconds:.0%} of the time in forwards"
        )
    ratio = totals["ngram"].tokens_per_s / totals["none"].tokens_per_s
    console.print(f"prompt lookup against the baseline: {ratio:.2f}x, every text the baseline's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
