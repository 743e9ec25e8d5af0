"""The served draft-length policy replayed over greedy outputs, against fixed draft lengths.

    .venv/bin/python benchmarks/policy_replay.py [--workload grounded,FILE.jsonl] [--overhead-ms 6]

Generates each prompt's greedy output with the engine the server runs
(benchmarks/copy_bound.py's generate(): in this process, with the engine's guesses at every
point of the output), then replays each workload's requests one after another (one user) as
spec_decode runs them: prompt lookup led by the profile's phrase index and the engine's guesses
(PromptLookup), the draft length of each round chosen by the adaptive controller
(specdec/speculation/controller.py, the profile's options), which learns from each round's acceptance and
cost and asks for a guess only where it would draft from one. Greedy verification accepts
exactly the common prefix of a draft and the output, so no forward runs again. Each round is
priced as the engine's forward over its rows (measured here), plus the guess where one was asked
(measured here, right after a forward), plus --overhead-ms: what a served round costs beyond its
forward in either arm (Triton's calls, the streamed responses; the controller's observe_round()
measures it when served); plain decoding pays a step and the overhead a token. Against the policy:
drafts of the profile's longest throughout, and the best static caps by the evidence a round
drafts from (a draft the guess leads; the length of lookup's match), a grid. `--vary KNOB=V1,V2`
also prices the controller with the profile's `speculation.adaptive.KNOB` at each value: tune
the knobs on your own prompts, e.g. `--vary ema_alpha=0.02,0.1 --vary prior_weight=1,8`.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time

import numpy as np
import torch
from copy_bound import Sample, forward_times, generate
from pydantic import ValidationError

from specdec.build import build
from specdec.client.machine import describe, summary_line
from specdec.config import AdaptiveOptions, load_profile
from specdec.engine.engine import Engine
from specdec.engine.verify import accepted_length
from specdec.progress import console
from specdec.speculation.controller import Controller, ForwardCost
from specdec.speculation.lookup import Lead, NgramProposer, PromptLookup
from specdec.speculation.opening import Opening
from specdec.speculation.phrases import PhraseIndex
from specdec.tokenizer import TextTokenizer

# evidence -> the most a draft from it may take (Lead.GUESS: led by the guess; n: lookup matched n tokens)
Caps = dict[int, int]


def guess_seconds(engine: Engine, sample: Sample, repeats: int = 20) -> float:
    """The guess head's time right after a one-row forward (as a served round asks it), the median."""
    model, head = engine.model, engine.guess_head
    assert head is not None
    cache = model.new_cache(1, len(sample.prompt) + 2)
    prompt = torch.from_numpy(sample.prompt)
    slots = torch.zeros(len(prompt), dtype=torch.int64)
    model.forward(cache, prompt, torch.arange(len(prompt)), slots, torch.tensor([len(prompt) - 1]))
    last, context, times = prompt[-1:], sample.prompt.tolist(), []
    for _ in range(repeats):
        hidden = model.hidden(cache, last, torch.tensor([len(prompt)]), slots[:1], torch.tensor([0]))
        start = time.perf_counter()
        head.guesses(hidden, last, [0], [context])
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def replay(samples: list[Sample], options: AdaptiveOptions, ngram: NgramProposer, longest: int,
           step: dict[int, float], guess_s: float, overhead_s: float, caps: Caps | None = None,
           phrases: PhraseIndex | None = None, opening: Opening | None = None) -> tuple[float, float]:  # fmt: skip
    """(speedup over plain decoding, tokens a round) of the requests one after another, drafts of
    at most `longest`, with the profile's phrase index and the prefill round's opening where given
    (a prefill's draft rows priced as a step's extra rows); `caps`: fixed drafts of at most
    caps[evidence] (`longest` where it has none) in place of the controller."""
    rows = sorted(step)
    controller = Controller(options, target=ForwardCost(rows, [step[r] for r in rows]))
    plain = spec = 0.0
    rounds = 0
    for n, sample in enumerate(samples):
        key = f"request {n}"
        controller.start(key, "ngram", longest)
        lookup = PromptLookup(ngram, len(sample.prompt), phrases, opening=opening)
        tokens, out, done = sample.prompt.tolist(), sample.output, 0
        plain += sample.prefill_s + len(out) * (step[1] + overhead_s)
        spec += sample.prefill_s
        while done < len(out):
            budget = min(longest, len(out) - done - 1)
            evidence = lookup.evidence(tokens) if budget else None
            if caps is None:
                k = controller.choose_k(key, budget, evidence)
            else:
                k = min(caps.get(evidence, longest), budget) if evidence else 0
            draft = lookup.draft(tokens, k) if k > 0 else []
            accepted = accepted_length(draft, out[done:].tolist())
            asked = controller.would_draft(key, Lead.GUESS)
            tokens += out[done : done + accepted + 1].tolist()
            done += accepted + 1
            lookup.heard(len(tokens), sample.guesses[len(tokens)] if asked else [])
            seconds = step[len(draft) + 1] + overhead_s + guess_s * asked
            if done > accepted + 1:  # past the prefill round
                spec += seconds
                rounds += 1
                controller.observe_round(seconds)
            else:
                spec += step[len(draft) + 1] - step[1]
            controller.observe(key, len(draft), accepted)
        controller.finish(key)
    return plain / spec, sum(len(s.output) for s in samples) / rounds


def varied_options(base: AdaptiveOptions, vary: list[str]) -> list[tuple[str, AdaptiveOptions]]:
    """('KNOB VALUE', the options with it) for each value of each `KNOB=V1,V2`; ValueError naming
    the knob or value the profile's schema refuses."""
    variants = []
    for item in vary:
        knob, _, values = item.partition("=")
        if knob not in AdaptiveOptions.model_fields or not values:
            raise ValueError(
                f"--vary {item!r}: want KNOB=V1,V2 with KNOB one of {', '.join(AdaptiveOptions.model_fields)}"
            )
        for value in values.split(","):
            try:
                options = AdaptiveOptions.model_validate({**base.model_dump(), knob: value})
            except ValidationError as err:
                raise ValueError(f"--vary {knob}={value}: {err.errors()[0]['msg']}") from None
            variants.append((f"{knob} {value}", options))
    return variants


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="grounded", help="built-in workloads or .jsonl files, comma-separated")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--overhead-ms", type=float, default=6.0, help="a served round's cost beyond its forward")
    ap.add_argument(
        "--vary",
        action="append",
        default=[],
        metavar="KNOB=V1,V2",
        help="also price the controller with speculation.adaptive's KNOB at each value (repeatable)",
    )
    args = ap.parse_args(argv)
    profile = load_profile()
    try:
        variants = varied_options(profile.speculation.adaptive, args.vary)
    except ValueError as err:
        ap.error(str(err))
    build(profile)
    model_dir = profile.model_dir("target")
    options = profile.speculation.ngram
    engine = Engine(model_dir, dtype=profile.engine.dtype, kv_slots=2, max_seq_len=1024,
                    threads=profile.engine.threads, guess_head=options.guess_head)  # fmt: skip
    if engine.guess_head is None:
        ap.error("the profile's engine has no guess head (speculation.ngram.guess_head)")
    engine.warmup()
    longest = profile.speculation.max_draft_tokens
    step = forward_times(engine, rows=tuple(range(1, longest + 2)))
    workloads = {w: generate(engine, TextTokenizer(model_dir), [w], args.max_tokens) for w in args.workload.split(",")}
    guess_s = guess_seconds(engine, next(iter(workloads.values()))[0])
    ngram = NgramProposer(options.min_n, options.max_n)
    phrases = PhraseIndex.load(options.phrases) if options.phrases else None
    opening = Opening.from_tokenizer(TextTokenizer(model_dir)) if options.opening else None

    def price(samples: list[Sample], caps: Caps | None, options: AdaptiveOptions = profile.speculation.adaptive,
              ) -> tuple[float, float]:  # fmt: skip
        return replay(samples, options, ngram, longest, step, guess_s, args.overhead_ms / 1e3, caps, phrases, opening)

    grid = [{Lead.GUESS: g, 1: one} for g, one in itertools.product((1, 2, 3, 4, 6, longest), (4, 8, longest))]
    console.print(f"Machine: {summary_line(describe())}. Forward ms: 1 row {step[1] * 1e3:.1f}, {longest + 1} "
                  f"rows {step[longest + 1] * 1e3:.1f}; the guess {guess_s * 1e3:.2f} ms; a served round's overhead "
                  f"{args.overhead_ms:.1f} ms.\n")  # fmt: skip
    lines = ["| workload | policy | speedup | tokens/round |", "|---|---|---|---|"]
    for workload, samples in workloads.items():
        served, fixed = price(samples, None), price(samples, {})
        best_caps = max(grid, key=lambda caps: price(samples, caps)[0])
        best = price(samples, best_caps)
        named = ", ".join(f"{'guess-led' if e == Lead.GUESS else f'{e}-token match'} {c}" for e, c in best_caps.items())
        lines += [
            f"| {workload} | the controller (served) | {served[0]:.3f}x | {served[1]:.2f} |",
            f"| | drafts of up to {longest} | {fixed[0]:.3f}x | {fixed[1]:.2f} |",
            f"| | best caps of the grid ({named}) | {best[0]:.3f}x | {best[1]:.2f} |",
        ]
        for name, options in variants:
            speedup, per_round = price(samples, None, options)
            lines.append(f"| | the controller, {name} | {speedup:.3f}x | {per_round:.2f} |")
    console.print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
