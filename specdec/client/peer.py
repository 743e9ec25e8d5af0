"""A peer comparison on the same machine: Hugging Face transformers' own speculative decoding
(prompt lookup, `prompt_lookup_num_tokens`; assisted generation, `assistant_model`) in-process,
against our served path, on the same token ids, greedy, one request at a time.

The methods take turns prompt by prompt (the order rotating), so drift of the machine hits all
alike. Each method's tokens are compared with transformers' plain greedy decoding: an independent
implementation of the same model, so this is an exactness check as well as a speed one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from specdec.client.client import RequestParams, TritonClient
from specdec.client.loadgen import BASELINE, Arm
from specdec.triton.internal import InternalAccess

HF_GREEDY = "transformers greedy"


@dataclass(frozen=True)
class PeerRun:
    method: str
    prompt: int
    tokens: list[int]
    seconds: float
    draft_tokens: int | None = None  # served methods only
    accepted_tokens: int | None = None


def hf_methods(
    target_dir: Path, draft_dir: Path | None, k: int
) -> dict[str, Callable[[list[int], int, int], list[int]]]:
    """transformers' generate: plain greedy, prompt lookup and (with a draft) assisted generation."""
    import torch
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32).eval() if draft_dir else None

    def generate(**extra) -> Callable[[list[int], int, int], list[int]]:
        def run(ids: list[int], max_tokens: int, eos: int) -> list[int]:
            with torch.inference_mode():
                seq = target.generate(torch.tensor([ids]), max_new_tokens=max_tokens, do_sample=False,
                                      eos_token_id=eos, pad_token_id=eos, **extra)  # fmt: skip
            tokens = seq[0, len(ids) :].tolist()
            return tokens[:-1] if tokens and tokens[-1] == eos else tokens

        return run

    methods = {
        HF_GREEDY: generate(),
        f"transformers prompt lookup (prompt_lookup_num_tokens={k})": generate(prompt_lookup_num_tokens=k),
    }
    if draft is not None:
        methods[f"transformers assisted (assistant_model=draft, {k} tokens)"] = generate(
            assistant_model=draft, num_assistant_tokens=k, num_assistant_tokens_schedule="constant"
        )
    return methods


def served_arms(k: int, with_draft: bool) -> list[Arm]:
    return [BASELINE, Arm("ngram", k), *([Arm("draft_model", k)] if with_draft else [])]


def served_name(arm: Arm) -> str:
    return f"served {arm.name}"


async def _served(internal: InternalAccess, arm: Arm, ids: list[int], max_tokens: int, eos: int) -> PeerRun:
    # each arm its own cache salt: none reuses the prompt another arm just left cached
    params = RequestParams(max_tokens=max_tokens, num_draft_tokens=arm.num_draft_tokens,
                              draft_method=arm.draft_method, end_id=eos, cache_salt=served_name(arm))  # fmt: skip
    async with TritonClient(internal.grpc_url, internal_key=internal.key) as client:
        record = await client.generate_ids(ids, params, stream=False)
    if record.error:
        raise RuntimeError(f"{served_name(arm)}: {record.error}")
    return PeerRun(served_name(arm), -1, record.ids, record.end - record.start, record.total_draft_tokens,
                   record.total_accepted_draft_tokens)  # fmt: skip


def compare(internal: InternalAccess, prompt_ids: Sequence[list[int]], max_tokens: int, eos: int, target_dir: Path,
            draft_dir: Path | None, k: int, on_done: Callable[[str], None] | None = None) -> list[PeerRun]:  # fmt: skip
    """Every method on every prompt, methods taking turns; warm-up runs first and are not kept. The
    served arms send token ids to spec_decode on tritonserver's own endpoint, with the key of its
    start (`internal`: TritonServer.internal)."""
    hf = hf_methods(target_dir, draft_dir, k)
    arms = served_arms(k, draft_dir is not None)
    names = list(hf) + [served_name(a) for a in arms]

    def one(name: str, ids: list[int], tokens: int) -> PeerRun:
        if name in hf:
            start = time.perf_counter()
            out = hf[name](ids, tokens, eos)
            return PeerRun(name, -1, out, time.perf_counter() - start)
        arm = next(a for a in arms if served_name(a) == name)
        return asyncio.run(_served(internal, arm, ids, tokens, eos))

    for name in names:  # warm-up: first calls pay for lazy initialisation
        one(name, prompt_ids[0], 8)
    runs = []
    for p, ids in enumerate(prompt_ids):
        for j in range(len(names)):
            name = names[(j + p) % len(names)]
            run = one(name, ids, max_tokens)
            runs.append(PeerRun(name, p, run.tokens, run.seconds, run.draft_tokens, run.accepted_tokens))
            if on_done is not None:
                on_done(name)
    return runs


def summary_markdown(runs: Sequence[PeerRun]) -> str:
    names = list(dict.fromkeys(r.method for r in runs))
    reference = {r.prompt: r.tokens for r in runs if r.method == HF_GREEDY}

    def rate(name: str) -> float:
        mine = [r for r in runs if r.method == name]
        return sum(len(r.tokens) for r in mine) / sum(r.seconds for r in mine)

    hf_rate, served_rate = rate(HF_GREEDY), rate(served_name(BASELINE))
    lines = [
        "| method | output tokens/s | mean time per request s | vs transformers greedy | vs served baseline "
        "| acceptance | same tokens as transformers greedy |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in names:
        mine = [r for r in runs if r.method == name]
        drafted = sum(r.draft_tokens or 0 for r in mine)
        accepted = sum(r.accepted_tokens or 0 for r in mine)
        same = sum(r.tokens == reference.get(r.prompt) for r in mine)
        lines.append(
            f"| {name} | {rate(name):.1f} | {sum(r.seconds for r in mine) / len(mine):.2f} "
            f"| {rate(name) / hf_rate:.2f}x | {rate(name) / served_rate:.2f}x "
            f"| {f'{accepted / drafted:.0%}' if drafted else '-'} | {same}/{len(mine)} |"
        )
    return "\n".join(lines) + "\n"
