"""The workloads: the built-in prompt sets, synthetic prompts, genai-perf's JSONL, planted typos."""

from __future__ import annotations

import json

import pytest

from specdec.client.workloads import WorkloadOptions, from_jsonl, load_workload, synthetic
from specdec.texts import with_typos


# --- workloads ------------------------------------------------------------------------------------
class WordTokenizer:
    def encode(self, text: str) -> list[int]:
        return [len(w) for w in text.split()]

    def decode(self, ids: list[int]) -> str:
        return " ".join("w" * i for i in ids)


def test_builtin_workloads():
    grounded = load_workload("grounded", WorkloadOptions(max_tokens=32))
    assert {p.kind for p in grounded[:4]} == {"summarise", "edit", "qa", "code"}
    assert all(p.max_tokens == 32 and p.apply_chat_template for p in grounded)
    chat = load_workload("chat", WorkloadOptions())
    assert {p.kind for p in chat} == {"chat"}
    mixed = load_workload("mixed", WorkloadOptions())
    assert len(mixed) == len(grounded) + len(chat) and mixed[1].kind == "chat"
    with pytest.raises(ValueError, match="unknown workload"):
        load_workload("nonsense", WorkloadOptions())


def test_synthetic_prompts_have_the_asked_length_and_ignore_the_end_token():
    prompts = synthetic(WorkloadOptions(max_tokens=16, synthetic_input_tokens=40), WordTokenizer(), count=5)
    assert all(len(WordTokenizer().encode(p.text)) == 40 for p in prompts)
    assert all(p.ignore_eos and not p.apply_chat_template and p.max_tokens == 16 for p in prompts)


def test_jsonl_in_genai_perf_format(tmp_path):
    path = tmp_path / "prompts.jsonl"
    lines = [{"text": "Hello"}, {"text_input": "Bye", "max_tokens": 5, "kind": "qa"}]
    path.write_text(json.dumps(lines[0]) + "\n\n" + json.dumps(lines[1]) + "\n")
    prompts = from_jsonl(path, max_tokens=64)
    assert [(p.text, p.max_tokens, p.kind) for p in prompts] == [("Hello", 64, "file"), ("Bye", 5, "qa")]
    path.write_text('{"nope": 1}\n')
    with pytest.raises(ValueError, match=":1: expected"):
        load_workload(str(path), WorkloadOptions())


def test_typos_are_planted_deterministically():
    text = "alpha bravo charlie delta echoes foxtrot golfer hotel"
    assert with_typos(text) == with_typos(text) != text
