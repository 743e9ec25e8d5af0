"""The OpenAI-compatible API, driven by the official `openai` package and raw HTTP against the
real server: its answers are the ensemble's, its objects validate as openai's own types, its
refusals name their field, a closed stream frees what its request held, and a conversation's
next turn reuses the cache its last turn left. Then the genai-perf request shapes, over gRPC
and HTTP."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request

import numpy as np
import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from support.servers import wait_for

from specdec.cli import main
from specdec.client.client import RequestParams, TritonClient, http_generate
from specdec.client.server_stats import scrape, total
from specdec.contract import ENSEMBLE_INPUTS

CONVERSATION = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "Name a fruit."},
    {"role": "assistant", "content": "Apple."},
    {"role": "user", "content": "Name another, and say why it is good."},
]
GREEDY = {"temperature": 0.0, "max_tokens": 24}


@pytest.fixture(scope="module")
def api(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.openai_url, api_key="unused", max_retries=0, timeout=120)


def metric(server, name: str, **labels) -> float:
    samples = scrape(server.metrics_url)
    assert samples is not None
    return total(samples, name, **labels)


def post(server, path: str, body: bytes) -> urllib.request.Request:
    headers = {"Content-Type": "application/json"}
    return urllib.request.Request(f"{server.openai_url}/{path}", data=body, headers=headers)


def ensemble(server, values: dict[str, object]) -> tuple[str, dict[str, int]]:
    """The ensemble's whole text and totals for raw inputs, over gRPC."""
    outputs = ["text_output", "num_output_tokens", "num_input_tokens"]

    async def main():
        async with TritonClient(server.grpc_url) as client:
            text, totals = "", {}
            async for result in client.stream("ensemble", client.inputs(values, ENSEMBLE_INPUTS), outputs):
                text += result.as_numpy("text_output").reshape(-1)[0].decode()
                totals = {name: int(result.as_numpy(name).reshape(-1)[0]) for name in outputs[1:]}
            return text, totals

    return asyncio.run(main())


def test_models_lists_the_profile(api, server):
    assert [m.id for m in api.models.list().data] == [server.profile.name]


def test_a_greedy_chat_answers_what_the_ensemble_answers(api, server):
    """A system prompt and three turns: the answer, whole and streamed, is the ensemble's for the
    same conversation; the whole one validates as openai's ChatCompletion."""
    model = server.profile.name
    raw = api.chat.completions.with_raw_response.create(model=model, messages=CONVERSATION, **GREEDY)
    whole = ChatCompletion.model_validate(raw.http_response.json())
    expected, totals = ensemble(server, {"messages": json.dumps(CONVERSATION), "max_tokens": 24, "temperature": 0.0})
    assert whole.choices[0].message.content == expected and expected
    assert whole.usage.prompt_tokens == totals["num_input_tokens"] > 20  # the system prompt and turns, templated
    assert whole.usage.completion_tokens == totals["num_output_tokens"]
    speculation = whole.model_extra["speculation"]
    assert 0 <= speculation["accepted_tokens"] <= speculation["draft_tokens"]

    stream = api.chat.completions.create(model=model, messages=CONVERSATION, stream=True,
                                         stream_options={"include_usage": True}, **GREEDY)  # fmt: skip
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
    assert chunks[-1].usage.completion_tokens == totals["num_output_tokens"]


def test_a_stream_is_server_sent_events_of_openais_chunks(server):
    """Raw SSE: `data: <chunk>` events, each a valid ChatCompletionChunk, then `data: [DONE]`."""
    body = {"model": server.profile.name, "messages": CONVERSATION[:2], "stream": True, **GREEDY}
    with urllib.request.urlopen(post(server, "chat/completions", json.dumps(body).encode()), timeout=120) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
        events = [line.decode().rstrip("\n") for line in resp if line.strip()]
    assert all(line.startswith("data: ") for line in events) and events[-1] == "data: [DONE]"
    chunks = [ChatCompletionChunk.model_validate_json(line.removeprefix("data: ")) for line in events[:-1]]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks][-1] in ("stop", "length")
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])


def test_a_completion_is_the_ensembles_text_without_a_template(api, server):
    prompt = "The capital of France is"
    completion = api.completions.create(model=server.profile.name, prompt=prompt, temperature=0, max_tokens=8)
    expected, _ = ensemble(server, {"text_input": prompt, "max_tokens": 8, "temperature": 0.0,
                                    "apply_chat_template": False})  # fmt: skip
    assert completion.choices[0].text == expected
    assert completion.usage.completion_tokens == 8 and completion.choices[0].finish_reason == "length"


@pytest.mark.parametrize(
    ("changes", "status", "param"),
    [
        ({"n": 2}, 400, "n"),
        ({"logprobs": True}, 400, "logprobs"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, 400, "tools"),
        ({"temperature": 3}, 400, "temperature"),
        ({"max_tokens": 10**6}, 400, "max_tokens"),
        ({"model": "gpt-4o"}, 404, "model"),
        ({"extra_body": {"draft_method": "telepathy"}}, 400, "draft_method"),
        ({"messages": [{"role": "user", "content": "x" * 40000}]}, 400, "messages"),
    ],
)
def test_a_refusal_names_its_field_and_the_server_keeps_serving(api, server, changes, status, param):
    args = {"model": server.profile.name, "messages": CONVERSATION[:2], "max_tokens": 4} | changes
    with pytest.raises(openai.APIStatusError) as err:
        api.chat.completions.create(**args)
    assert err.value.status_code == status
    assert err.value.body["param"] == param and err.value.body["message"], err.value.body
    answer = api.chat.completions.create(model=server.profile.name, messages=CONVERSATION[:2], max_tokens=2)
    assert answer.usage.completion_tokens == 2


def test_a_body_that_is_not_json_is_refused(server):
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(post(server, "chat/completions", b"{not json"), timeout=30)
    assert err.value.code == 400 and json.loads(err.value.read())["error"]["type"] == "invalid_request_error"


def test_closing_a_stream_cancels_its_request_and_frees_its_cache(api, server):
    before = metric(server, "specdec_requests_total", reason="cancelled")
    stream = api.chat.completions.create(
        model=server.profile.name, messages=[{"role": "user", "content": "Count from 1 to 500, one per line."}],
        max_tokens=400, stream=True,
    )  # fmt: skip
    for i, _ in enumerate(stream):
        if i == 2:
            break
    stream.close()
    assert wait_for(lambda: metric(server, "specdec_requests_total", reason="cancelled") == before + 1, timeout=10)
    assert wait_for(lambda: metric(server, "specdec_kv_slots_in_use") == 0, timeout=10)


def test_a_conversations_next_turn_reuses_the_cache_its_last_turn_left(api, server):
    salt = f"conversation {time.time_ns()}"  # no earlier request has it
    model, extra = server.profile.name, {"cache_salt": salt}
    reused = lambda: metric(server, "specdec_kv_reused_prefix_tokens_total", model="target")  # noqa: E731
    start = reused()
    first = api.chat.completions.create(model=model, messages=CONVERSATION[:2], extra_body=extra, **GREEDY)
    assert reused() == start  # the first request of its salt
    turn = [*CONVERSATION[:2], {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "And another?"}]  # fmt: skip
    api.chat.completions.create(model=model, messages=turn, extra_body=extra, **GREEDY)
    assert reused() - start >= first.usage.prompt_tokens  # at least the whole first prompt


# --- genai-perf's request shapes ----------------------------------------------------------------------
def test_genai_perfs_tensorrtllm_inputs_over_grpc(server):
    """What genai-perf's triton service kind sends a TensorRT-LLM model (its converter
    triton_tensorrtllm_converter.py): text_input, max_tokens, exclude_input_in_output, streaming;
    min_length with --output-tokens-mean-deterministic. min_length holds the end token back."""
    prompt = "Reply with one word: yes or no?"
    values = {"text_input": prompt, "max_tokens": 40, "exclude_input_in_output": True, "stream": True,
              "temperature": 0.0}  # fmt: skip
    short, totals = ensemble(server, values)
    assert short and totals["num_output_tokens"] < 40  # ends by itself: min_length has something to hold
    _, held = ensemble(server, {**values, "min_length": 40})
    assert held["num_output_tokens"] == 40


def test_genai_perfs_generate_payload_over_http(server):
    """genai-perf's `generate` endpoint payload: text_input as a one-item JSON list, max_tokens a
    number (its triton_generate converter)."""
    body = json.dumps({"text_input": ["Name a fruit."], "max_tokens": 6, "temperature": 0.0}).encode()
    req = urllib.request.Request(f"http://{server.http_url}/v2/models/ensemble/generate", data=body,
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=120) as resp:
        answer = json.loads(resp.read())
    same = asyncio.run(http_generate(server.http_url, "Name a fruit.", RequestParams(max_tokens=6, temperature=0.0)))
    assert answer["text_output"] == same.text and answer["num_output_tokens"] == 6
    assert np.isfinite(answer["acceptance_rate"])


def test_the_load_generator_drives_the_openai_api(server, tmp_path):
    """`specdec bench --transport openai`: every request answered, speculation's tokens the
    baseline's, and the client's counts (from usage and speculation, chunk by chunk) the
    server's own counters."""
    out = tmp_path / "bench"
    argv = ["bench", "--url", f"127.0.0.1:{server.ports.openai}", "--transport", "openai",
            "--metrics-url", server.metrics_url, "--server-pid", str(server.process.pid),
            "--arms", "baseline,ngram:4", "--concurrency", "2", "--num-requests", "2", "--warmup", "1",
            "--max-tokens", "24", "--workload", "grounded", "--no-plots", "--output-dir", str(out)]  # fmt: skip
    assert main(argv) == 0
    report = json.loads((out / "bench.json").read_text())
    assert report["failures"] == {"requests": 4, "failed": 0, "by_reason": {}}
    (level,) = report["levels"]
    spec = level["summary"]["ngram:4"]
    assert spec["same_text_as_baseline"] == [2, 2] and spec["draft_tokens"] > 0
    assert spec["acceptance_per_position"] and spec["time_to_first_token"]["p50"] > 0
    for check in report["counter_check"]:
        for key in ("requests", "output_tokens", "draft_tokens", "accepted_tokens"):
            client, counted = check[key]
            assert client == counted, (check["proposer"], key)
