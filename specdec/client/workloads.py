"""Benchmark workloads: the prompts a load level sends, built from material that ships with us.

- grounded: tasks whose answer copies from the prompt (summarise, fix the spelling of, or answer a
  question from a given passage; rewrite a given function), where prompt lookup shines;
- chat: open-ended questions with nothing to copy, where it does not;
- mixed: the two interleaved, one after the other;
- synthetic: word salad of a controlled token length, no chat template, and an output length
  forced by ignoring the end token (genai-perf's synthetic mode);
- a .jsonl file in genai-perf's input format: one {"text": ...} object a line (also "text_input"
  or "prompt"; an optional "max_tokens" or "output_length").
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from specdec.texts import CHAT_QUESTIONS, PASSAGES, QUESTIONS, code_snippets, with_typos

BUILTIN_WORKLOADS = ("grounded", "chat", "mixed", "synthetic")


@dataclass(frozen=True)
class Prompt:
    text: str
    kind: str  # summarise | edit | qa | code | chat | synthetic | file
    max_tokens: int
    apply_chat_template: bool = True
    ignore_eos: bool = False  # generate exactly max_tokens


class Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...


@dataclass(frozen=True)
class WorkloadOptions:
    max_tokens: int = 128
    synthetic_input_tokens: int = 256
    synthetic_input_stddev: float = 0.0
    seed: int = 0


def grounded(max_tokens: int) -> list[Prompt]:
    summarise, edit, qa = [], [], []
    for name, passage in PASSAGES.items():
        summarise.append(
            Prompt(f"Summarize the following passage in a few sentences:\n\n{passage}", "summarise", max_tokens)
        )
        edit.append(
            Prompt(
                "Fix the spelling mistakes in the following paragraph and write it out in full:\n\n"
                f"{with_typos(passage)}",
                "edit",
                max_tokens,
            )
        )
        qa.append(Prompt(f"{passage}\n\nAnswer from the passage above: {QUESTIONS[name]}", "qa", max_tokens))
    instructions = (
        "Rewrite this Python function with clearer variable names, keeping its behaviour:",
        "Add type hints to this Python function and write it out in full:",
    )
    code = [
        Prompt(f"{instructions[i % len(instructions)]}\n\n{source}", "code", max_tokens)
        for i, (_, source) in enumerate(code_snippets())
    ]
    # task kinds take turns, so that the first few prompts already cover all of them
    return interleave(summarise, edit, qa, code)


def chat(max_tokens: int) -> list[Prompt]:
    return [Prompt(q, "chat", max_tokens) for q in CHAT_QUESTIONS]


def interleave(*lists: list[Prompt]) -> list[Prompt]:
    out = []
    for i in range(max(len(x) for x in lists)):
        out += [x[i] for x in lists if i < len(x)]
    return out


def synthetic(options: WorkloadOptions, tokenizer: Tokenizer, count: int = 32) -> list[Prompt]:
    """Word salad from the shipped passages, cut to about N tokens (N drawn per prompt)."""
    rng = random.Random(options.seed)
    words = " ".join(PASSAGES.values()).split()
    prompts = []
    for _ in range(count):
        target = max(1, round(rng.gauss(options.synthetic_input_tokens, options.synthetic_input_stddev)))
        ids: list[int] = []
        while len(ids) < target:
            ids = tokenizer.encode(" ".join(rng.choice(words) for _ in range(target)))
        prompts.append(
            Prompt(
                tokenizer.decode(ids[:target]),
                "synthetic",
                options.max_tokens,
                apply_chat_template=False,
                ignore_eos=True,
            )
        )
    return prompts


def from_jsonl(path: Path, max_tokens: int) -> list[Prompt]:
    prompts = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            text = next(item[k] for k in ("text", "text_input", "prompt") if k in item)
        except (json.JSONDecodeError, StopIteration, TypeError) as err:
            raise ValueError(f"{path}:{number}: expected a JSON object with a 'text' field") from err
        n = item.get("max_tokens", item.get("output_length", max_tokens))
        # an optional task label: the report's per-kind tables and copy_bound's rows group by it
        prompts.append(Prompt(str(text), str(item.get("kind", "file")), int(n)))
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts


def load_workload(name: str, options: WorkloadOptions, tokenizer: Tokenizer | None = None) -> list[Prompt]:
    """A built-in workload by name, or the prompts of a .jsonl file."""
    if name == "grounded":
        return grounded(options.max_tokens)
    if name == "chat":
        return chat(options.max_tokens)
    if name == "mixed":
        return interleave(grounded(options.max_tokens), chat(options.max_tokens))
    if name == "synthetic":
        if tokenizer is None:
            raise ValueError("the synthetic workload needs the model's tokenizer (build the profile first)")
        return synthetic(options, tokenizer)
    path = Path(name)
    if path.suffix == ".jsonl" and path.is_file():
        return from_jsonl(path, options.max_tokens)
    raise ValueError(f"unknown workload {name!r}: one of {', '.join(BUILTIN_WORKLOADS)} or a .jsonl file")
