"""The OpenAI API's requests and objects (specdec/openai/protocol.py): every object made here
validates as the official `openai` package's own pydantic types (the version in
requirements.lock), and every refusal names its field as OpenAI's error body does."""

from __future__ import annotations

import json

import pytest
from openai.types import Completion, Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from specdec.openai.protocol import (
    Answer,
    OpenAIError,
    Totals,
    error_from_triton,
    models,
    parse_chat,
    parse_completion,
)

MODEL = "embedded"
LIMIT = 256
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}
TOTALS = Totals(prompt_tokens=12, completion_tokens=5, draft_tokens=8, accepted_tokens=6, draft_rounds=2)


def strict(model_type, obj: dict):
    """obj as openai's type reads it, checked field by field (model_validate, not construct)."""
    return model_type.model_validate(json.loads(json.dumps(obj)))


def test_a_chat_becomes_the_ensembles_messages_and_sampling_inputs():
    parts = [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]
    body = {**CHAT, "messages": [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": parts}],
            "temperature": 0.5, "top_p": 0.9, "seed": 7, "stop": "\n\n", "max_completion_tokens": 9,
            "num_draft_tokens": 3, "draft_method": "ngram", "min_tokens": 4, "cache_salt": "tenant-1",
            "top_k": 20}  # fmt: skip
    req = parse_chat(body, MODEL, LIMIT)
    assert json.loads(req.inputs.pop("messages")) == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]  # fmt: skip
    assert req.inputs == {"max_tokens": 9, "temperature": 0.5, "top_p": 0.9, "seed": 7, "stop_words": ["\n\n"],
                          "num_draft_tokens": 3, "draft_method": "ngram", "cache_salt": "tenant-1",
                          "top_k": 20, "min_length": 4}  # fmt: skip
    assert req.chat and not req.stream and req.max_tokens == 9


def test_a_completion_is_text_without_the_chat_template():
    req = parse_completion({"model": MODEL, "prompt": ["Once"], "echo": True, "stream": True,
                            "stream_options": {"include_usage": True}}, MODEL, LIMIT)  # fmt: skip
    assert req.inputs == {"max_tokens": 16, "text_input": "Once", "apply_chat_template": False}  # OpenAI's default 16
    assert req.stream and req.include_usage and req.echo == "Once"


@pytest.mark.parametrize(
    ("parse", "changes", "param"),
    [
        (parse_chat, {"n": 2}, "n"),
        (parse_chat, {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        (parse_chat, {"logprobs": True}, "logprobs"),
        (parse_chat, {"response_format": {"type": "json_object"}}, "response_format"),
        (parse_chat, {"temperature": 2.5}, "temperature"),
        (parse_chat, {"top_p": 0}, "top_p"),
        (parse_chat, {"max_tokens": LIMIT + 1}, "max_tokens"),
        (parse_chat, {"max_tokens": True}, "max_tokens"),
        (parse_chat, {"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        (parse_chat, {"frequency_penalty": 0.5}, "frequency_penalty"),
        (parse_chat, {"messages": []}, "messages"),
        (parse_chat, {"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
        (parse_chat, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content"),
        (parse_chat, {"stream_options": {"include_usage": True}}, "stream_options"),
        (parse_chat, {"stream": "yes"}, "stream"),
        (parse_chat, {"min_tokens": 10, "max_tokens": 5}, "min_tokens"),
        (parse_chat, {"cache_salt": 3}, "cache_salt"),
        (parse_chat, {"frobnicate": 1}, "frobnicate"),
        (parse_completion, {"prompt": ["a", "b"]}, "prompt"),
        (parse_completion, {"prompt": [1, 2, 3]}, "prompt"),
        (parse_completion, {"logprobs": 2}, "logprobs"),
        (parse_completion, {"suffix": "x"}, "suffix"),
    ],
)
def test_a_refusal_names_its_field(parse, changes, param):
    body = {**CHAT, **changes} if parse is parse_chat else {"model": MODEL, "prompt": "Hi", **changes}
    with pytest.raises(OpenAIError) as err:
        parse(body, MODEL, LIMIT)
    assert err.value.status == 400 and err.value.param == param
    error = err.value.body()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"].startswith(param.split("[")[0])


def test_another_model_is_not_found():
    with pytest.raises(OpenAIError) as err:
        parse_chat({**CHAT, "model": "gpt-4o"}, MODEL, LIMIT)
    assert (err.value.status, err.value.param, err.value.code) == (404, "model", "model_not_found")


def test_whole_answers_are_openais_objects():
    chat = strict(ChatCompletion, Answer(parse_chat(CHAT, MODEL, LIMIT)).whole("Hello", TOTALS))
    assert chat.choices[0].message.content == "Hello" and chat.choices[0].finish_reason == "stop"
    assert (chat.usage.prompt_tokens, chat.usage.completion_tokens, chat.usage.total_tokens) == (12, 5, 17)
    assert chat.model_extra["speculation"] == {"draft_tokens": 8, "accepted_tokens": 6, "acceptance_rate": 0.75,
                                               "draft_rounds": 2}  # fmt: skip
    completion = Answer(parse_completion({"model": MODEL, "prompt": "Hi", "max_tokens": 5, "echo": True}, MODEL, LIMIT))
    text = strict(Completion, completion.whole(" there", TOTALS))
    assert text.choices[0].text == "Hi there" and text.choices[0].finish_reason == "length"  # 5 of max_tokens 5


@pytest.mark.parametrize("parse", [parse_chat, parse_completion])
def test_stream_chunks_are_openais_objects(parse):
    body = {"model": MODEL, "stream": True, "stream_options": {"include_usage": True}}
    body |= {"messages": CHAT["messages"]} if parse is parse_chat else {"prompt": "Hi"}
    answer = Answer(parse(body, MODEL, LIMIT))
    kind = ChatCompletionChunk if parse is parse_chat else Completion
    objects = [answer.chunk("Hel", TOTALS, first=True), answer.chunk("lo", TOTALS), *answer.last(TOTALS)]
    if parse is parse_completion:
        # A completions stream's chunks before the last have finish_reason null, as OpenAI's
        # service and vLLM send them; the package's Completion type (the whole answer's) has no
        # null, and its stream reader never validates: checked with the null replaced.
        assert [obj["choices"][0]["finish_reason"] for obj in objects[:2]] == [None, None]
        objects[:2] = [{**o, "choices": [{**o["choices"][0], "finish_reason": "stop"}]} for o in objects[:2]]
    chunks = [strict(kind, obj) for obj in objects]
    assert len({c.id for c in chunks}) == 1
    if parse is parse_chat:
        assert chunks[0].choices[0].delta.role == "assistant"
        assert "".join(c.choices[0].delta.content or "" for c in chunks[:-1]) == "Hello"
    assert chunks[2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5  # include_usage: its own chunk


def test_models_lists_the_one_served():
    listing = models(MODEL, 1700000000)
    assert listing["object"] == "list" and [strict(Model, m).id for m in listing["data"]] == [MODEL]


@pytest.mark.parametrize(
    ("message", "status", "param"),
    [
        ("in ensemble 'ensemble', text_input: 9000 tokens, more than max_input_len 2048", 400, "prompt"),
        ("in ensemble 'ensemble', messages[1].role: one of system, user, assistant", 400, "messages[1].role"),
        ("[StatusCode.UNAVAILABLE] server busy: 16 requests running and queued", 503, None),
        ("the model failed", 400, None),
    ],
)
def test_the_ensembles_refusals_keep_their_field(message, status, param):
    err = error_from_triton(message)
    assert (err.status, err.param) == (status, param)


def test_continuous_usage_puts_the_totals_so_far_in_every_chunk():
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    answer = Answer(parse_chat(body, MODEL, LIMIT))
    so_far = Totals(prompt_tokens=12, completion_tokens=2, draft_tokens=4, accepted_tokens=1, draft_rounds=1)
    chunk = strict(ChatCompletionChunk, answer.chunk("Hi", so_far, first=True))
    assert chunk.usage.completion_tokens == 2 and chunk.model_extra["speculation"]["draft_rounds"] == 1
    plain = Answer(parse_chat({**CHAT, "stream": True}, MODEL, LIMIT)).chunk("Hi", so_far)
    assert "usage" not in plain and "speculation" not in plain
