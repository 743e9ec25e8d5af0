"""The real thing: tritonserver serving SmolLM2-135M on 127.0.0.1, tritonclient over sockets.

Greedy speculation must give exactly the tokens of plain decoding and of an independent
reference (Hugging Face transformers' greedy generate on the same weights), for every proposer,
draft length and with 8 requests in flight. The engine in bfloat16 (CpuBf16Ops) computes
another model, so its speculation is held to its own plain decoding."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import time
import urllib.request

import numpy as np
import pytest
import torch
from support.models import needs_bf16
from support.prompts import PASSAGE, PROMPTS
from support.servers import internal_client, variant_server, with_dtype

from specdec.client.client import RequestParams, TritonClient, http_generate
from specdec.client.server_stats import scrape, total
from specdec.contract import (
    CACHE_SALT_INPUT,
    ENGINE_INPUTS,
    ENGINE_OUTPUTS,
    ENSEMBLE_INPUTS,
    ENSEMBLE_OUTPUTS,
    GUESS_INPUT,
    GUESS_OUTPUT,
    ROW_ERRORS_OUTPUT,
    SEQUENCE_KEY_INPUT,
    SPEC_DECODE_INPUTS,
    SPEC_DECODE_OUTPUTS,
)
from specdec.engine.kv_slots import common_prefix
from specdec.triton.internal import TAG

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def prompt_ids(tokenizer):
    return [tokenizer.encode(tokenizer.chat_prompt(text)) for text, _ in PROMPTS]


@pytest.fixture(scope="module")
def reference(smollm_dir, prompt_ids, tokenizer):
    """transformers' greedy decoding: another implementation of the same model."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(smollm_dir, dtype=torch.float32)
    out = []
    with torch.inference_mode():
        for ids, (_, max_tokens) in zip(prompt_ids, PROMPTS, strict=True):
            seq = hf.generate(torch.tensor([ids]), max_new_tokens=max_tokens, do_sample=False,
                              eos_token_id=tokenizer.eos_id, pad_token_id=tokenizer.eos_id)  # fmt: skip
            tokens = seq[0, len(ids) :].tolist()
            out.append(tokens[:-1] if tokens and tokens[-1] == tokenizer.eos_id else tokens)
    return out


def generate_all(server, prompt_ids, params_list, in_flight=8):
    """Token ids for every (prompt, params), at most `in_flight` requests at once."""

    async def main():
        gate = asyncio.Semaphore(in_flight)
        async with internal_client(server) as client:

            async def one(ids, params):
                async with gate:
                    return await client.generate_ids(ids, params)

            return await asyncio.gather(*(one(ids, p) for ids, p in zip(prompt_ids, params_list, strict=True)))

    return asyncio.run(main())


def _params(k: int, method: str, tokenizer) -> list[RequestParams]:
    return [
        RequestParams(max_tokens=n, num_draft_tokens=k, draft_method=method, end_id=tokenizer.eos_id)
        for _, n in PROMPTS
    ]


def test_plain_decoding_through_the_server_matches_the_reference(server, prompt_ids, reference, tokenizer):
    records = generate_all(server, prompt_ids, _params(0, "none", tokenizer))
    assert [r.error for r in records] == [None] * len(PROMPTS)
    assert [r.ids for r in records] == reference
    assert any(len(ids) == n for ids, (_, n) in zip(reference, PROMPTS, strict=True))  # some hit max_tokens
    assert any(len(ids) < n for ids, (_, n) in zip(reference, PROMPTS, strict=True))  # some stop at EOS


# a draft model case takes 20-40 s (a prompt lookup case 6-9 s): three of its draft lengths
@pytest.mark.parametrize(
    ("method", "k"), [*itertools.product(["ngram"], [1, 3, 5, 8]), *itertools.product(["draft_model"], [1, 4, 8])]
)
def test_greedy_speculation_is_exact(server, prompt_ids, reference, tokenizer, method, k):
    records = generate_all(server, prompt_ids, _params(k, method, tokenizer))
    for r, ref, (text, _) in zip(records, reference, PROMPTS, strict=True):
        assert r.error is None
        assert r.ids == ref, f"{method} k={k} differs on {text[:40]!r}"
    assert sum(r.total_draft_tokens for r in records) > 0


@pytest.fixture(scope="module")
def bf16_server(embedded_profile, smollm_dir):
    with variant_server(embedded_profile, smollm_dir, "test-bf16", **with_dtype(embedded_profile, "bfloat16")) as srv:
        yield srv


@needs_bf16
def test_bfloat16_speculation_is_exact_against_its_own_plain_decoding(bf16_server, prompt_ids, reference, tokenizer):
    """bf16 products: every row of a verification gets the bits it gets alone, so each proposer
    and draft length reproduces plain bf16 decoding; bf16 rounding makes a few tokens differ
    from float32's."""
    plain = [r.ids for r in generate_all(bf16_server, prompt_ids, _params(0, "none", tokenizer))]
    for method, k in [("ngram", 3), ("ngram", 8), ("draft_model", 5)]:
        records = generate_all(bf16_server, prompt_ids, _params(k, method, tokenizer))
        assert [r.error for r in records] == [None] * len(PROMPTS)
        assert [r.ids for r in records] == plain, f"{method} k={k}"
        assert sum(r.total_draft_tokens for r in records) > 0
    assert plain != reference  # it computed in bf16


def test_ngram_accepts_most_drafts_on_a_copy_task(server, prompt_ids, reference, tokenizer):
    copy = next(i for i, (text, _) in enumerate(PROMPTS) if text.startswith("Repeat"))
    (r,) = generate_all(server, [prompt_ids[copy]], [_params(5, "ngram", tokenizer)[copy]])
    assert r.ids == reference[copy]
    assert r.acceptance_rate > 0.6 and r.mean_accepted_length > 3


def test_streamed_text_equals_the_unstreamed_text(server):
    prompt = "Write a sentence about the moon with an emoji and the word café in it."
    params = RequestParams(max_tokens=60)

    async def main():
        async with TritonClient(server.grpc_url) as client:
            return await client.generate(prompt, params, stream=True), await client.generate(
                prompt, params, stream=False
            )

    streamed, whole = asyncio.run(main())
    assert streamed.error is None and whole.error is None
    assert len(streamed.chunks) > 1 and len(whole.chunks) == 1
    assert streamed.text == whole.text and streamed.text
    http_stream = asyncio.run(http_generate(server.http_url, prompt, params, stream=True))
    http_whole = asyncio.run(http_generate(server.http_url, prompt, params, stream=False))
    assert http_stream.text == http_whole.text == whole.text
    assert whole.num_output_tokens == streamed.num_output_tokens > 0


def test_requests_in_flight_share_the_target_forwards(server, prompt_ids):
    """12 plain requests at once: their steps go to the engine together. (The BLS loop's default
    thread pool, os.cpu_count() + 4 threads, once held the engine calls in flight to 6 on 2 cores.)"""
    import tritonclient.grpc as grpcclient

    ids = [prompt_ids[i % len(prompt_ids)] for i in range(12)]
    params = RequestParams(max_tokens=24, num_draft_tokens=0)
    results = generate_all(server, ids, [params] * 12, in_flight=12)
    assert all(r.error is None and r.ids for r in results)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    stats = client.get_inference_statistics("target", as_json=True)["model_stats"][0]
    client.close()
    assert max(int(b["batch_size"]) for b in stats["batch_stats"]) > 8  # more than other tests keep in flight


def metric_values(text: str, name: str, **labels) -> list[float]:
    """The values of the series of one metric with these labels in a Prometheus scrape."""
    return [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{") and all(
        f'{k}="{v}"' in line for k, v in labels.items())]  # fmt: skip


def test_metrics_count_drafts_per_proposer_and_position(server, prompt_ids, tokenizer):
    generate_all(server, prompt_ids[:2], _params(3, "ngram", tokenizer)[:2])
    text = urllib.request.urlopen(server.metrics_url).read().decode()

    def value(name: str, **labels) -> float:
        sel = ",".join(f'{k}="{v}"' for k, v in labels.items())
        rows = metric_values(text, name, **labels)
        assert rows, f"no {name}{{{sel}}} in /metrics"
        return sum(rows)

    drafted = value("specdec_draft_tokens_total", model="spec_decode", proposer="ngram")
    accepted = value("specdec_accepted_tokens_total", model="spec_decode", proposer="ngram")
    first = value("specdec_accepted_tokens_per_position_total", proposer="ngram", position="1")
    assert drafted > 0 and 0 <= accepted <= drafted and first <= accepted
    # every draft token counted at its position, every accepted one too (sent together)
    assert value("specdec_draft_tokens_per_position_total", proposer="ngram") == drafted
    assert value("specdec_accepted_tokens_per_position_total", proposer="ngram") == accepted
    assert value("specdec_requests_total", proposer="ngram") >= 2


def test_metrics_are_current_while_a_long_request_runs(server):
    """spec_decode sends its counters in batches (each update is a round trip to Triton), at
    least once a second: a dashboard sees a long generation's drafts before it ends."""

    def drafted() -> float:
        text = urllib.request.urlopen(server.metrics_url).read().decode()
        return sum(metric_values(text, "specdec_draft_tokens_total", proposer="ngram"))

    before = drafted()
    during = []
    start = None

    def on_chunk(_text: str) -> None:
        nonlocal start
        start = start or time.monotonic()
        if not during and time.monotonic() - start > 2.0:
            during.append(drafted())

    prompt = f"Repeat the following passage exactly:\n\n{PASSAGE}"
    params = RequestParams(max_tokens=400, draft_method="ngram", num_draft_tokens=5, end_id=-1)

    async def main():
        async with TritonClient(server.grpc_url) as client:
            return await client.generate(prompt, params, stream=True, on_chunk=on_chunk)

    record = asyncio.run(main())
    assert record.error is None and record.num_output_tokens == 400
    assert during, "the request ended within 2 s of its first chunk: nothing to look at mid-way"
    assert before < during[0] <= before + record.total_draft_tokens
    assert drafted() == before + record.total_draft_tokens


def test_requests_of_a_cache_salt_reuse_the_chat_template_they_share(server, tokenizer):
    """A new request reuses the keys/values of the prefix an ended request of its salt left (the
    chat template's system prompt); a request of another salt reuses nothing of it."""
    salt = f"test {time.time_ns()}"  # no earlier request has it
    first, second = "What is 2+2?", "Name a colour."
    shared = common_prefix(*(np.asarray(tokenizer.encode(tokenizer.chat_prompt(t))) for t in (first, second)))

    def reused() -> float:
        return total(scrape(server.metrics_url), "specdec_kv_reused_prefix_tokens_total", model="target")

    async def run(text: str, cache_salt: str):
        async with TritonClient(server.grpc_url) as client:
            record = await client.generate(text, RequestParams(max_tokens=4, cache_salt=cache_salt))
        assert record.error is None, record.error

    start = reused()
    asyncio.run(run(first, salt))
    assert reused() == start  # the first request of its salt
    asyncio.run(run(second, salt))
    assert shared > 10 and reused() == start + shared
    asyncio.run(run(second, salt + " other"))
    assert reused() == start + shared


# --- bad input: INVALID_ARG naming the field, and the server keeps serving -----------------------
def _post(server, model: str, body: dict) -> tuple[int, str]:
    req = urllib.request.Request(
        f"http://{server.http_url}/v2/models/{model}/generate", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


BAD = [
    ({"text_input": "", "max_tokens": 8}, "text_input"),
    ({"text_input": "   ", "max_tokens": 8}, "text_input"),
    ({"text_input": "word " * 3000, "max_tokens": 8}, "text_input"),  # longer than the context
    ({"text_input": "hi", "max_tokens": 0}, "max_tokens"),
    ({"text_input": "hi", "max_tokens": -5}, "max_tokens"),
    ({"text_input": "hi", "max_tokens": 100000}, "max_tokens"),
    ({"text_input": "word " * 1500, "max_tokens": 1000}, "max_tokens"),  # fits alone, not with the output
    ({"text_input": "hi", "max_tokens": 8, "draft_method": "magic"}, "draft_method"),
    ({"text_input": "hi", "max_tokens": 8, "num_draft_tokens": -1}, "num_draft_tokens"),
    ({"text_input": "hi", "max_tokens": 8, "num_draft_tokens": 16}, "num_draft_tokens"),  # max_draft_tokens is 15
    ({"text_input": "hi", "max_tokens": 8, "temperature": -1.0}, "temperature"),
    ({"text_input": "hi", "max_tokens": 8, "top_p": 1.5}, "top_p"),
    ({"text_input": "hi", "max_tokens": 8, "top_k": -3}, "top_k"),
    ({"text_input": "hi", "max_tokens": 8, "stop_words": [""]}, "stop_words"),
    ({"max_tokens": 8}, "text_input"),  # missing
    ({"text_input": "hi", "max_tokens": 8, "cache_salt": "x" * 300}, "cache_salt"),
]


@pytest.mark.parametrize(("body", "field"), BAD, ids=[f"{f}-{i}" for i, (_, f) in enumerate(BAD)])
def test_bad_input_is_refused_naming_the_field(server, body, field):
    status, text = _post(server, "ensemble", body)
    assert status == 400, text
    assert re.search(rf"\b{field}\b", json.loads(text)["error"]), text


def test_wrong_dtype_is_refused_by_triton_naming_the_input(server):
    """Over HTTP/JSON a wrong type is Triton's own parse error (500, no field name: a Triton 2.51
    limitation); over gRPC Triton refuses it naming the input and both types."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc_url)
    text = grpcclient.InferInput("text_input", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[b"hi"]], dtype=np.object_))
    max_tokens = grpcclient.InferInput("max_tokens", [1, 1], "FP32")
    max_tokens.set_data_from_numpy(np.array([[8.0]], dtype=np.float32))
    results = []
    client.start_stream(callback=lambda result, error: results.append(error))
    client.async_stream_infer("ensemble", [text, max_tokens])
    client.stop_stream()
    assert results and "'max_tokens' data-type is 'FP32'" in str(results[0])


def test_bad_token_level_input_to_spec_decode(server, tokenizer):
    async def main(ids, **kw):
        async with internal_client(server) as client:
            return await client.generate_ids(ids, RequestParams(max_tokens=4, **kw))

    assert "input_ids" in asyncio.run(main([tokenizer.vocab_size + 5])).error
    assert "input_ids" in asyncio.run(main([-1])).error
    assert "temperature" in asyncio.run(main([1, 2], temperature=float("nan"))).error


@pytest.mark.parametrize("asked", [[], ["output_ids", "is_final"]])
def test_spec_decode_answers_with_the_outputs_asked_for(server, asked):
    """spec_decode sends only the requested outputs (see _response in its model.py); a request
    that names none gets them all, as Triton promises."""

    async def main():
        async with internal_client(server) as client:
            inputs = client.inputs({"input_ids": [1, 2, 3], "max_tokens": 3}, SPEC_DECODE_INPUTS)
            return [r async for r in client.stream("spec_decode", inputs, asked)]

    results = asyncio.run(main())
    assert results
    for result in results:
        assert {o.name for o in result.get_response().outputs} == set(asked or [*SPEC_DECODE_OUTPUTS, TAG])


@pytest.mark.parametrize(
    ("model", "inputs", "outputs", "own_inputs", "own_outputs"),
    [
        ("ensemble", ENSEMBLE_INPUTS, ENSEMBLE_OUTPUTS, [], []),
        ("spec_decode", SPEC_DECODE_INPUTS, SPEC_DECODE_OUTPUTS, [TAG], [TAG]),  # the tags ensemble steps carry
        ("target", ENGINE_INPUTS, ENGINE_OUTPUTS, [GUESS_INPUT, CACHE_SALT_INPUT, SEQUENCE_KEY_INPUT],
         [GUESS_OUTPUT, ROW_ERRORS_OUTPUT]),
    ],
)  # fmt: skip
def test_the_served_models_speak_the_contract(server, model, inputs, outputs, own_inputs, own_outputs):
    """The tensors each loaded model declares (Triton's model metadata) are specdec.contract's,
    names and dtypes: the client builds its requests from the contract, so a config.pbtxt that
    drifted from it would fail requests at run time. The engine model also has its own tensors
    beside TensorRT-LLM's."""
    from tritonclient.grpc import InferenceServerClient
    from tritonclient.utils import np_to_triton_dtype

    metadata = InferenceServerClient(server.grpc_url).get_model_metadata(model, as_json=True)
    for kind, contract, own in (("inputs", inputs, own_inputs), ("outputs", outputs, own_outputs)):
        served = {t["name"]: t["datatype"] for t in metadata[kind]}
        assert set(served) == set(contract) | set(own)
        assert {n: served[n] for n in contract} == {n: np_to_triton_dtype(np.dtype(t)) for n, t in contract.items()}


def test_the_server_still_serves_after_bad_input(server):
    for body, _ in BAD[:4]:
        _post(server, "ensemble", body)
    status, text = _post(server, "ensemble", {"text_input": "What is 2+2?", "max_tokens": 8})
    assert status == 200 and json.loads(text)["text_output"]
    assert np.isfinite(json.loads(text)["acceptance_rate"])


def test_operator_metrics_have_prometheus_names_units_and_types(server, prompt_ids, tokenizer):
    """Latency histograms in seconds, refusals by reason, running and queued apart, rounds by the
    draft length chosen (counters that sum across replicas), the KV cache's capacity."""
    records = generate_all(server, prompt_ids[:3], _params(4, "ngram", tokenizer)[:3])
    bad = asyncio.run(_generate_one(server, "Hi", RequestParams(max_tokens=0)))  # refused by preprocessing
    worse = asyncio.run(_generate_one(server, "Hi", RequestParams(max_tokens=4, num_draft_tokens=99)))  # spec_decode
    assert "max_tokens" in bad.error and "num_draft_tokens" in worse.error
    text = urllib.request.urlopen(server.metrics_url).read().decode()
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    for name in ("time_to_first_token", "time_per_output_token", "request_duration", "queue_duration"):
        assert types[f"specdec_{name}_seconds"] == "histogram", name
        assert sum(metric_values(text, f"specdec_{name}_seconds_count", proposer="ngram")) >= 3
        buckets = [line for line in text.splitlines() if line.startswith(f"specdec_{name}_seconds_bucket{{")]
        assert any('le="+Inf"' in line for line in buckets)
    assert types["specdec_requests_refused_total"] == "counter"
    for model in ("preprocessing", "spec_decode"):
        assert sum(metric_values(text, "specdec_requests_refused_total", model=model, reason="invalid_argument")) >= 1
    assert types["specdec_requests_running"] == types["specdec_requests_queued"] == "gauge"
    assert (
        sum(metric_values(text, "specdec_requests_running")) == sum(metric_values(text, "specdec_requests_queued")) == 0
    )
    rounds_by_length = {
        int(re.search(r'draft_tokens="(\d+)"', line)[1]): float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("specdec_verification_rounds_total{") and 'proposer="ngram"' in line
    }
    assert max(rounds_by_length) <= server.profile.speculation.max_draft_tokens
    assert 4 in rounds_by_length and sum(rounds_by_length.values()) >= len(records)
    assert sum(metric_values(text, "specdec_kv_slots_capacity")) > 0
    assert all(
        not name.endswith("_total") or kind == "counter" for name, kind in types.items() if name.startswith("specdec_")
    )


async def _generate_one(server, prompt, params):
    async with TritonClient(server.grpc_url) as client:
        return await client.generate(prompt, params)
