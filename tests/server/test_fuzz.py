"""Random requests to the ensemble over HTTP and gRPC, each valid or wrong in exactly one field:
a valid one is served (its output length within min_length and max_tokens), a wrong one is
refused with a message that starts with that field's name (HTTP: a 400). Afterwards the server
is ready and its greedy output unchanged.

The limits are the embedded profile's (specdec/config.py, configs/embedded.yaml), read from the
server's own profile. Over HTTP every value is typed as its input is declared: Triton's JSON
parser refuses a mistyped value (or NaN) before any model sees it, with a message that names no
input (docs/operations.md); over gRPC typed values go through, NaN and invalid UTF-8 included."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdec.client.client import RequestParams, TritonClient
from specdec.contract import ENSEMBLE_INPUTS, MAX_CACHE_SALT_BYTES
from specdec.openai.protocol import ENSEMBLE_PREFIX

pytestmark = pytest.mark.server

VOCAB = 49152  # SmolLM2's; test_the_fuzzed_limits_are_the_servers checks it
MAX_SEQ_LEN, MAX_TOKENS = 2048, 2047  # min(server.max_tokens_limit, engine.max_seq_len - 1)
MAX_PROMPT_BYTES, MAX_STOP_WORDS, MAX_STOP_WORD_BYTES, MAX_DRAFT = 65536, 16, 256, 15
EXAMPLES = 30

text = st.text(st.characters(exclude_categories=("Cs",)), max_size=30)  # no lone surrogates: valid UTF-8
prompt = text.filter(lambda t: bool(t.strip()))
word = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=6)


@st.composite
def valid_request(draw) -> dict:
    body = {"text_input": draw(prompt), "max_tokens": draw(st.integers(1, 8))}
    optional = {
        "temperature": st.floats(0, 2),
        "top_k": st.integers(0, 60),
        "top_p": st.floats(0.05, 1),
        "seed": st.integers(0, 2**64 - 1),
        "stop_words": st.lists(word, max_size=3),
        "num_draft_tokens": st.integers(0, MAX_DRAFT),
        "draft_method": st.sampled_from(["ngram", "draft_model", "none", " ngram "]),
        "end_id": st.integers(-5, VOCAB - 1),
        "min_length": st.integers(0, body["max_tokens"]),
        "apply_chat_template": st.booleans(),
        "cache_salt": text,
        "exclude_input_in_output": st.just(True),
    }
    for name in draw(st.sets(st.sampled_from(sorted(optional)))):
        body[name] = draw(optional[name])
    return body


# Each field's wrong values, as the profile's limits make them wrong
WRONG = {
    "text_input": st.sampled_from(["", "  \n ", "word " * 3000, "x" * (MAX_PROMPT_BYTES + 1)]),
    "max_tokens": st.one_of(st.integers(-3, 0), st.integers(MAX_TOKENS + 1, 100_000)),
    "temperature": st.floats(-10, -0.001),
    "top_k": st.integers(-100, -1),
    "top_p": st.one_of(st.floats(-1, 0), st.floats(1.001, 5)),
    "stop_words": st.one_of(
        st.lists(word, min_size=MAX_STOP_WORDS + 1, max_size=MAX_STOP_WORDS + 3),
        st.just(["a", ""]),
        st.just(["y" * (MAX_STOP_WORD_BYTES + 1)]),
    ),
    "num_draft_tokens": st.one_of(st.integers(-5, -1), st.integers(MAX_DRAFT + 1, 1000)),
    "draft_method": st.sampled_from(["", "magic", "NGRAM", "draft-model"]),
    "end_id": st.integers(VOCAB, VOCAB + 1000),
    "min_length": st.integers(9, 1000),  # above every valid request's max_tokens (8 at most)
    "cache_salt": st.just("s" * (MAX_CACHE_SALT_BYTES + 1)),
    "exclude_input_in_output": st.just(False),
}
# Wrong only over gRPC: HTTP's JSON parser refuses them before the models (see the docstring)
WRONG_GRPC = {
    **WRONG,
    "temperature": st.one_of(WRONG["temperature"], st.sampled_from([float("nan"), float("inf")])),
    "text_input": st.one_of(WRONG["text_input"], st.just(b"\xff\xfe not UTF-8")),
}


@st.composite
def request_and_fault(draw, wrong: dict) -> tuple[dict, str | None]:
    """A valid request, or one with exactly one field wrong (and that field's name)."""
    body = draw(valid_request())
    field = draw(st.one_of(st.none(), st.sampled_from(sorted(wrong))))
    if field is not None:
        body[field] = draw(wrong[field])
        if field == "max_tokens":
            body.pop("min_length", None)  # valid only against a valid max_tokens
    return body, field


def check_outcome(body: dict, field: str | None, error: str | None, answer: dict | None) -> None:
    if field is None:
        assert error is None, (body, error)
        assert isinstance(answer["text_output"], str)
        assert body.get("min_length", 0) <= answer["num_output_tokens"] <= body["max_tokens"], (body, answer)
    else:
        assert error is not None, (body, field, answer)
        assert ENSEMBLE_PREFIX.sub("", error).startswith(f"{field}:"), (field, error)


@pytest.fixture(scope="module")
def reference(server):
    """A greedy generation before the fuzzing, to compare with after it."""
    return asyncio.run(_greedy(server))


async def _greedy(server):
    async with TritonClient(server.grpc_url) as client:
        return await client.generate("Name three rivers.", RequestParams(max_tokens=24, temperature=0.0))


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(request_and_fault(WRONG))
def test_http_requests_are_served_or_refused_naming_the_wrong_field(server, reference, case):
    body, field = case
    url = f"http://{server.http_url}/v2/models/ensemble/generate"
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            check_outcome(body, field, None, json.loads(resp.read()))
    except urllib.error.HTTPError as err:
        assert err.code == 400, (body, err.code)
        check_outcome(body, field, json.loads(err.read())["error"], None)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(request_and_fault(WRONG_GRPC), st.booleans())
def test_grpc_requests_are_served_or_refused_naming_the_wrong_field(server, reference, case, stream):
    body, field = case
    outputs = ["text_output", "num_output_tokens"]

    async def send() -> tuple[str | None, dict | None]:
        async with TritonClient(server.grpc_url) as client:
            values = {**body, "stream": stream}  # bytes go as they are: the invalid UTF-8 case
            answer = {"text_output": "", "num_output_tokens": 0}
            try:
                async for result in client.stream("ensemble", client.inputs(values, ENSEMBLE_INPUTS), outputs):
                    answer["text_output"] += result.as_numpy("text_output").reshape(-1)[0].decode()
                    answer["num_output_tokens"] = int(result.as_numpy("num_output_tokens").reshape(-1)[0])
            except RuntimeError as err:  # a stream's error carries the message, no status code
                return str(err), None
            return None, answer

    check_outcome(body, field, *asyncio.run(send()))


def test_the_server_is_ready_and_exact_after_the_fuzzing(server, reference):
    assert server.failure() is None
    with urllib.request.urlopen(f"http://{server.http_url}/v2/health/ready", timeout=5) as ready:
        assert ready.status == 200
    again = asyncio.run(_greedy(server))
    assert again.error is None and again.text == reference.text and reference.text


def test_the_fuzzed_limits_are_the_servers(server, tokenizer):
    profile = server.profile
    assert tokenizer.vocab_size == VOCAB and profile.engine.max_seq_len == MAX_SEQ_LEN
    assert min(profile.server.max_tokens_limit, MAX_SEQ_LEN - 1) == MAX_TOKENS
    assert (profile.server.max_prompt_bytes, profile.server.max_stop_words, profile.server.max_stop_word_bytes) == (
        MAX_PROMPT_BYTES, MAX_STOP_WORDS, MAX_STOP_WORD_BYTES)  # fmt: skip
    assert profile.speculation.max_draft_tokens == MAX_DRAFT
    assert len(tokenizer.encode("word " * 3000)) > MAX_SEQ_LEN  # the long prompt is too long in tokens
