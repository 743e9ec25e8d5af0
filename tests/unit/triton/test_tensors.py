"""Parsing the ensemble's and spec_decode's inputs: conversations, genai-perf's inputs, and the
field each refusal names."""

from __future__ import annotations

import json

import numpy as np
import pytest

from specdec.config import load_profile
from specdec.triton.tensors import InvalidInput, parse_preprocess, parse_spec_decode


@pytest.fixture(scope="module")
def profile():
    return load_profile()


def inputs(**values) -> dict:
    """Inputs as an adapter passes them: each its request's item (batch dimension removed)."""
    return {
        name: v if isinstance(v, np.ndarray) and v.ndim else np.array([v], dtype=object if isinstance(v, str) else None)
        for name, v in values.items()
    }


def test_a_conversation_is_read_in_place_of_the_text(profile):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}]  # fmt: skip
    req = parse_preprocess(inputs(messages=json.dumps(messages), max_tokens=np.int32(8)), profile)
    assert req.messages == messages and req.text == ""


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"text_input": "a", "messages": "[]"}, "^text_input: required .* not both"),
        ({"max_tokens": np.int32(8)}, "^text_input: required"),
        ({"messages": "not json"}, "^messages: not JSON"),
        ({"messages": "[]"}, "^messages: a non-empty JSON list"),
        ({"messages": json.dumps([{"role": "robot", "content": "x"}])}, "^messages: message 0's role must be one of"),
        ({"messages": json.dumps([{"role": "user"}])}, "^messages: message 0 must be an object with exactly"),
        ({"messages": json.dumps([{"role": "user", "content": 3}])}, "^messages: message 0's content must be text"),
        ({"text_input": "a", "exclude_input_in_output": False}, "^exclude_input_in_output: only true"),
    ],
)
def test_each_refusal_names_its_field(profile, values, expected):
    with pytest.raises(InvalidInput, match=expected):
        parse_preprocess(inputs(**{"max_tokens": np.int32(8), **values}), profile)


def test_genai_perfs_tensorrtllm_inputs_are_read(profile):
    """genai-perf's tensorrtllm request: text_input, max_tokens, exclude_input_in_output true,
    stream, and with fixed output lengths min_length (mapped to spec_decode's min_tokens)."""
    pre = parse_preprocess(inputs(text_input="Hello", max_tokens=np.int32(100), exclude_input_in_output=True), profile)
    assert pre.max_tokens == 100
    spec = parse_spec_decode(
        inputs(input_ids=np.array([5, 6], np.int32), max_tokens=np.int32(100), min_tokens=np.int32(100)), profile, 99
    )
    assert spec.spec.min_tokens == 100
    with pytest.raises(InvalidInput, match=r"^min_length: must be between 0 and max_tokens \(4\)"):
        parse_spec_decode(inputs(input_ids=np.array([5], np.int32), max_tokens=np.int32(4), min_tokens=np.int32(5)),
                          profile, 99)  # fmt: skip
