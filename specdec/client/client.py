"""Clients for the served models, timestamping every streamed chunk.

- `TritonClient.generate`: text in, text out, through the `ensemble` (gRPC streaming, asyncio);
- `TritonClient.generate_ids`: token ids in, token ids out, through `spec_decode` directly (what
  the exactness checks compare): an internal model, so only for a client of tritonserver's own
  endpoint with the key of its start (`internal_key`; specdec/triton/internal.py);
- `http_generate`: the same ensemble over HTTP `generate` / `generate_stream` (SSE).
Every call returns a Record with the arrival time of each chunk, for latency metrics.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass, field
from functools import partial

import numpy as np

from specdec.contract import ENSEMBLE_INPUTS, SPEC_DECODE_INPUTS
from specdec.triton.internal import KEY_PARAMETER

TOTALS = ("total_draft_tokens", "total_accepted_draft_tokens", "total_draft_rounds", "num_output_tokens")


@dataclass
class RequestParams:
    max_tokens: int = 64
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    num_draft_tokens: int | None = None  # None: the profile's default; 0: speculation off
    draft_method: str | None = None  # draft_model | ngram | none; None: the profile's
    stop_words: list[str] | None = None
    end_id: int | None = None
    apply_chat_template: bool | None = None
    cache_salt: str | None = None  # share cached prefixes only with requests of this salt

    def tensors(self) -> dict[str, object]:
        """The optional ensemble inputs this request sets (absent ones take server defaults)."""
        out = {k: v for k, v in asdict(self).items() if v is not None}
        out.pop("stop_words", None)
        if self.stop_words:
            out["stop_words"] = self.stop_words
        return out


@dataclass
class Record:
    """One request as the client saw it."""

    start: float  # time.perf_counter() when sent
    chunks: list[tuple[float, str | list[int]]] = field(default_factory=list)  # (arrival, text or ids)
    end: float = 0.0
    total_draft_tokens: int = 0
    total_accepted_draft_tokens: int = 0
    total_draft_rounds: int = 0
    num_output_tokens: int = 0
    error: str | None = None
    # per chunk, the totals as that response reported them (output tokens, draft tokens, accepted,
    # rounds): per-round acceptance and tokens per chunk come from their differences
    totals: list[tuple[int, int, int, int]] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(c for _, c in self.chunks if isinstance(c, str))

    @property
    def ids(self) -> list[int]:
        return [t for _, c in self.chunks if isinstance(c, list) for t in c]

    @property
    def acceptance_rate(self) -> float:
        return self.total_accepted_draft_tokens / self.total_draft_tokens if self.total_draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens per drafted round: accepted / rounds + 1."""
        return self.total_accepted_draft_tokens / self.total_draft_rounds + 1 if self.total_draft_rounds else 1.0

    def take_totals(self, get) -> None:
        """Acceptance totals from a response; get(name) returns the output's value or None."""
        for name in TOTALS:
            value = get(name)
            if value is not None:
                setattr(self, name, int(value))
        self.totals.append(
            (self.num_output_tokens, self.total_draft_tokens, self.total_accepted_draft_tokens, self.total_draft_rounds)
        )


async def within(request: Awaitable[Record], seconds: float) -> Record:
    """The request's record, or a failed one if it has not ended after `seconds`: a request the
    server never ends (its Python stub died, say) must not hang the caller."""
    start = time.perf_counter()
    try:
        return await asyncio.wait_for(request, seconds)
    except TimeoutError:
        return Record(start=start, end=time.perf_counter(), error=f"timeout after {seconds:g} s")


def _array(name: str, value, dtypes: dict) -> np.ndarray:
    dtype = dtypes[name]
    if dtype is np.object_:
        items = value if isinstance(value, list) else [value]
        return np.array([[s.encode("utf-8") if isinstance(s, str) else s for s in items]], dtype=np.object_)
    if isinstance(value, list | np.ndarray):
        return np.asarray(value, dtype=dtype)[None]
    return np.array([[value]], dtype=dtype)


def _triton_dtype(arr: np.ndarray) -> str:
    from tritonclient.utils import np_to_triton_dtype

    return np_to_triton_dtype(arr.dtype)


@dataclass(frozen=True)
class Access:
    """How a client reaches a server whose gRPC endpoint has TLS or whose APIs are restricted
    (server.tls, server.restricted_apis; docs/operations.md). tls: gRPC over TLS, trusting
    root_cert (PEM; None: the system's roots); cert and key: the client's own certificate, for
    mutual TLS; server_name: the name the server's certificate is checked against (None: the
    url's host); headers: sent with every request as named (a restricted gRPC API's header is
    triton-grpc-protocol-<key>). The headers' values are secrets: repr leaves them out."""

    tls: bool = False
    root_cert: str | None = None
    cert: str | None = None
    key: str | None = None
    server_name: str | None = None
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    def channel_args(self) -> list[tuple[str, object]] | None:
        """gRPC channel options: tritonclient's defaults (messages up to 2 GiB, its keepalive), and
        the certificate's name; None: tritonclient's defaults alone."""
        if self.server_name is None:
            return None
        from tritonclient.grpc import KeepAliveOptions

        keepalive = KeepAliveOptions()
        return [
            ("grpc.max_send_message_length", 2**31 - 1), ("grpc.max_receive_message_length", 2**31 - 1),
            ("grpc.keepalive_time_ms", keepalive.keepalive_time_ms),
            ("grpc.keepalive_timeout_ms", keepalive.keepalive_timeout_ms),
            ("grpc.keepalive_permit_without_calls", keepalive.keepalive_permit_without_calls),
            ("grpc.http2.max_pings_without_data", keepalive.http2_max_pings_without_data),
            ("grpc.ssl_target_name_override", self.server_name),
        ]  # fmt: skip


class TritonClient:
    """Async gRPC client (streaming API: the served models are decoupled)."""

    def __init__(self, url: str = "127.0.0.1:8001", access: Access = Access(), internal_key: str | None = None):
        """internal_key: the key of the server's start, which its internal models (spec_decode,
        the engines) take direct calls with; sent as a request parameter with every request."""
        import tritonclient.grpc.aio as grpcclient

        self._grpc = grpcclient
        self.parameters = {KEY_PARAMETER: internal_key} if internal_key else None
        self.headers = dict(access.headers) or None
        self.client = grpcclient.InferenceServerClient(
            url, ssl=access.tls, root_certificates=access.root_cert, private_key=access.key,
            certificate_chain=access.cert, channel_args=access.channel_args(),
        )  # fmt: skip

    async def close(self) -> None:
        await self.client.close()

    async def __aenter__(self) -> TritonClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def inputs(self, values: dict[str, object], dtypes: dict) -> list:
        """tritonclient's inputs for {name: value} (a value per request: scalars, lists, text)."""
        inputs = []
        for name, value in values.items():
            arr = _array(name, value, dtypes)
            tensor = self._grpc.InferInput(name, list(arr.shape), _triton_dtype(arr))
            tensor.set_data_from_numpy(arr)
            inputs.append(tensor)
        return inputs

    async def stream(
        self, model: str, inputs: list, outputs: list[str], cancel_after: int | None = None
    ) -> AsyncIterator:
        """Yield InferResult objects of one request until its final response, or cancel the
        request (the client closing its stream) after `cancel_after` responses, or when the
        caller stops reading (a closed or cancelled iteration)."""

        async def requests():
            yield {
                "model_name": model,
                "inputs": inputs,
                "outputs": [self._grpc.InferRequestedOutput(o) for o in outputs],
                "enable_empty_final_response": True,
                "parameters": self.parameters,
            }

        # Read the stream to its end (the server closes it after the final response): a stream
        # dropped half-read is cancelled, and Triton 2.51 then never lets its model unload.
        failure = None
        received = 0
        responses = self.client.stream_infer(requests(), headers=self.headers)
        finished = False
        try:
            async for result, error in responses:
                if error is not None:
                    failure = failure or str(error)
                elif result.get_response().outputs:
                    yield result
                    received += 1
                    if received == cancel_after:
                        return
            finished = True
        finally:
            if not finished:
                responses.cancel()
        if failure:
            raise RuntimeError(failure)

    async def generate(
        self,
        prompt: str,
        params: RequestParams,
        stream: bool = True,
        on_chunk: Callable[[str], None] | None = None,
        cancel_after: int | None = None,
    ) -> Record:
        """Text through the ensemble; on_chunk(text) is called as each chunk arrives; with
        cancel_after, the client cancels the request after that many chunks."""
        values = {"text_input": prompt, "stream": stream, **params.tensors()}
        inputs = self.inputs(values, ENSEMBLE_INPUTS)
        outputs = ["text_output", *TOTALS]
        record = Record(start=time.perf_counter())
        try:
            async for result in self.stream("ensemble", inputs, outputs, cancel_after):
                text = result.as_numpy("text_output").reshape(-1)[0].decode("utf-8")
                record.chunks.append((time.perf_counter(), text))
                if on_chunk is not None:
                    on_chunk(text)
                record.take_totals(partial(_output, result))
        except RuntimeError as err:
            record.error = str(err)
        record.end = time.perf_counter()
        return record

    async def generate_ids(
        self, input_ids: list[int], params: RequestParams, stream: bool = True, cancel_after: int | None = None
    ) -> Record:
        """Token ids through spec_decode directly (no tokenizer in the way): a client with the
        server's internal_key, on tritonserver's own endpoint."""
        values = {"input_ids": list(input_ids), "stream": stream, **params.tensors()}
        for name in ("stop_words", "apply_chat_template"):
            values.pop(name, None)
        inputs = self.inputs(values, SPEC_DECODE_INPUTS)
        outputs = ["output_ids", "context_length", *TOTALS]
        record = Record(start=time.perf_counter())
        try:
            async for result in self.stream("spec_decode", inputs, outputs, cancel_after):
                window = result.as_numpy("output_ids").reshape(-1).tolist()
                context = int(result.as_numpy("context_length").reshape(-1)[0])
                record.chunks.append((time.perf_counter(), window[context:]))
                record.take_totals(partial(_output, result))
        except RuntimeError as err:
            record.error = str(err)
        record.end = time.perf_counter()
        return record


async def http_generate(url: str, prompt: str, params: RequestParams, stream: bool = False,
                        access: Access = Access()) -> Record:  # fmt: skip
    """The ensemble over HTTP: POST .../generate (one JSON answer) or .../generate_stream (SSE);
    with access.headers (tritonserver's HTTP endpoint has no TLS)."""
    import aiohttp

    body = {"text_input": prompt, "stream": stream, **params.tensors()}
    endpoint = "generate_stream" if stream else "generate"
    record = Record(start=time.perf_counter())
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"http://{url}/v2/models/ensemble/{endpoint}", json=body, headers=dict(access.headers)) as resp,
    ):
        if resp.status != 200:
            record.error = (await resp.text()).strip()
        elif not stream:
            _add_chunk(record, await resp.json())
        else:
            async for line in resp.content:
                line = line.decode("utf-8").strip()
                if line.startswith("data:"):
                    data = json.loads(line[5:])
                    if "error" in data:
                        record.error = data["error"]
                        break
                    _add_chunk(record, data)
    record.end = time.perf_counter()
    return record


# RequestParams' fields under the OpenAI API's names (specdec/openai/protocol.py reads them)
OPENAI_NAMES = {"stop_words": "stop"}


async def openai_generate(session, base_url: str, model: str, prompt: str, params: RequestParams,
                          stream: bool = False) -> Record:  # fmt: skip
    """The OpenAI-compatible API (`base_url` ends in /v1): a chat of one user turn, or a
    completion where params.apply_chat_template is false; `session` an aiohttp.ClientSession.
    Streams ask for the usage in every chunk (continuous_usage_stats), beside which `speculation`
    carries the request's drafts so far: the record's totals, chunk by chunk, as over gRPC."""
    chat = params.apply_chat_template is not False
    fields = {OPENAI_NAMES.get(k, k): v for k, v in params.tensors().items() if k != "apply_chat_template"}
    end_id = fields.pop("end_id", None)
    if end_id == -1:  # no end token (a fixed output length): min_tokens holds it back to the end
        fields["min_tokens"] = params.max_tokens
    elif end_id is not None:
        raise ValueError("end_id: the OpenAI API has no end token field")
    body = {"model": model, "stream": stream, **fields}
    body |= {"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt}
    if stream:
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    record = Record(start=time.perf_counter())
    async with session.post(f"{base_url}/{'chat/completions' if chat else 'completions'}", json=body) as resp:
        if resp.status != 200:
            record.error = f"HTTP {resp.status}: {(await resp.text()).strip()}"
        elif not stream:
            _add_openai(record, await resp.json(), chat)
        else:
            async for line in resp.content:
                data = line.decode("utf-8").strip().removeprefix("data:").strip()
                if not data or data == "[DONE]":
                    continue
                answer = json.loads(data)
                if "error" in answer:
                    record.error = answer["error"]["message"]
                    break
                _add_openai(record, answer, chat)
    record.end = time.perf_counter()
    return record


def _add_openai(record: Record, answer: dict, chat: bool) -> None:
    """A whole answer or a stream's chunk: its text and the totals its usage carries (a closing
    chunk of usage alone updates the totals)."""
    spec = answer.get("speculation") or {}
    usage = answer.get("usage") or {}
    totals = {"num_output_tokens": usage.get("completion_tokens"), "total_draft_tokens": spec.get("draft_tokens"),
              "total_accepted_draft_tokens": spec.get("accepted_tokens"),
              "total_draft_rounds": spec.get("draft_rounds")}  # fmt: skip
    if not answer.get("choices"):
        for name, value in totals.items():
            if value is not None:
                setattr(record, name, int(value))
        return
    choice = answer["choices"][0]
    text = (choice.get("message") or choice.get("delta") or {}).get("content") if chat else choice.get("text")
    record.chunks.append((time.perf_counter(), text or ""))
    record.take_totals(totals.get)


def _add_chunk(record: Record, data: dict) -> None:
    record.chunks.append((time.perf_counter(), data.get("text_output", "")))
    record.take_totals(data.get)


def _output(result, name: str):
    """The scalar value of an output of an InferResult, or None when absent."""
    arr = result.as_numpy(name)
    return None if arr is None else arr.reshape(-1)[0]


def run(coro):
    """asyncio.run for the synchronous entry points."""
    return asyncio.run(coro)
