"""Who may call what, and how large a request may be, against the real tritonserver and its edge
(specdec/triton/edge.py, specdec/triton/internal.py, docs/operations.md "Security").

- Clients reach the ensemble only: at the server's endpoints (the edge) a direct call to any
  internal model is refused over gRPC and HTTP, naming the model; the ensemble still serves.
- On tritonserver's own endpoint (127.0.0.1, behind the edge) the internal models refuse a call
  without the key of the server's start or the tag of the ensemble's step before them, counted in
  specdec_requests_refused_total{reason="internal"}; a local operator with the key is served.
- A 100 MB body is refused within seconds, over HTTP and gRPC and by the OpenAI frontend, before
  it is read: no server process's resident memory grows by it, and the server goes on serving.
"""

from __future__ import annotations

import asyncio
import json
import queue
import socket
import time
import urllib.error
import urllib.request

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
from support.servers import internal_client, wait_for
from tritonclient.utils import InferenceServerException

from specdec.client.check import CheckArm
from specdec.client.client import RequestParams, TritonClient, http_generate
from specdec.client.commands import check
from specdec.client.server_stats import memory_snapshot, scrape, total
from specdec.contract import ENGINE_INPUTS, SPEC_DECODE_INPUTS
from specdec.triton.internal import KEY_PARAMETER, TAG, access_path, new_key, read_access_file, refusal
from specdec.triton.serve import free_port

pytestmark = pytest.mark.server

BIG = 100 * 2**20  # bytes
REFUSED_WITHIN_S = 5.0
GROWTH_LIMIT = 20 * 2**20  # resident memory a process may gain from refusing a 100 MB body
INTERNAL_MODELS = ("preprocessing", "spec_decode", "postprocessing", "target", "draft")

# valid inputs for each model: a refusal can only be for who called
INPUTS: dict[str, dict[str, tuple[str, np.ndarray]]] = {
    "preprocessing": {"text_input": ("BYTES", np.array([[b"Say hi."]], dtype=np.object_)),
                      "max_tokens": ("INT32", np.array([[4]], dtype=np.int32))},
    "spec_decode": {"input_ids": ("INT32", np.array([[1, 2, 3]], dtype=np.int32)),
                    "max_tokens": ("INT32", np.array([[2]], dtype=np.int32))},
    "postprocessing": {"sequence_id": ("UINT64", np.array([[7]], dtype=np.uint64)),
                       "output_ids": ("INT32", np.array([[1, 2, 3]], dtype=np.int32)),
                       "context_length": ("INT32", np.array([[0]], dtype=np.int32)),
                       "is_final": ("BOOL", np.array([[True]], dtype=np.bool_))},
    "target": {"input_ids": ("INT32", np.array([[1, 2, 3]], dtype=np.int32)),
               "request_output_len": ("INT32", np.array([[2]], dtype=np.int32))},
}  # fmt: skip
INPUTS["draft"] = INPUTS["target"]


def _tensors(values: dict[str, tuple[str, np.ndarray]]) -> list:
    tensors = []
    for name, (dtype, arr) in values.items():
        tensor = grpcclient.InferInput(name, list(arr.shape), dtype)
        tensor.set_data_from_numpy(arr)
        tensors.append(tensor)
    return tensors


def grpc_answer(url: str, model: str, values: dict, parameters: dict | None = None,
                request_id: str = "") -> tuple[object, str | None]:  # fmt: skip
    """One request over a gRPC stream (every model takes one): its first response and the error
    it carries (None: served)."""
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer(model, _tensors(values), request_id=request_id, parameters=parameters)
        result, error = answers.get(timeout=120)
    finally:
        client.stop_stream()
        client.close()
    return result, None if error is None else str(error)


def http_answer(url: str, model: str, values: dict, parameters: dict | None = None,
                request_id: str = "") -> tuple[int, dict]:  # fmt: skip
    """One request over HTTP (spec_decode, which is decoupled, by `generate`; the rest by `infer`):
    its status and JSON answer."""
    if model == "spec_decode":
        path, body = "generate", {name: arr.reshape(-1).tolist() for name, (_, arr) in values.items()}
        body |= {"parameters": parameters} if parameters else {}
    else:
        path = "infer"
        body = {"inputs": [{"name": name, "datatype": dtype, "shape": list(arr.shape),
                            "data": [v.decode() if isinstance(v, bytes) else v for v in arr.reshape(-1).tolist()]}
                           for name, (dtype, arr) in values.items()]}  # fmt: skip
        body |= {"parameters": parameters} if parameters else {}
        body |= {"id": request_id} if request_id else {}
    request = urllib.request.Request(f"http://{url}/v2/models/{model}/{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def refused_internal(server, model: str) -> float:
    return total(scrape(server.metrics_url), "specdec_requests_refused_total", model=model, reason="internal")


def ensemble_serves(server) -> None:
    """The ensemble answers over gRPC and HTTP at the server's endpoints."""

    async def main():
        async with TritonClient(server.grpc_url) as client:
            return await client.generate("Say hi.", RequestParams(max_tokens=4, temperature=0.0))

    over_grpc = asyncio.run(main())
    over_http = asyncio.run(http_generate(server.http_url, "Say hi.", RequestParams(max_tokens=4, temperature=0.0)))
    assert over_grpc.error is None and over_grpc.text and over_http.error is None
    assert over_http.text == over_grpc.text


# --- who may call what ---------------------------------------------------------------------------------
@pytest.mark.parametrize("model", INTERNAL_MODELS)
def test_clients_reach_no_internal_model(server, model):
    """At the server's endpoints a direct call to an internal model is refused over gRPC and HTTP,
    naming it, before tritonserver sees it; the ensemble still serves."""
    _, error = grpc_answer(server.grpc_url, model, INPUTS[model])
    assert error == refusal(model)
    with pytest.raises(InferenceServerException, match=refusal(model)) as unary:
        grpcclient.InferenceServerClient(server.grpc_url).infer(model, _tensors(INPUTS[model]))
    assert unary.value.status() == "StatusCode.PERMISSION_DENIED"
    assert http_answer(server.http_url, model, INPUTS[model]) == (403, {"error": refusal(model)})
    ensemble_serves(server)


@pytest.mark.parametrize("model", ["spec_decode", "postprocessing", "target", "draft"])
def test_internal_models_refuse_calls_without_the_key(server, model):
    """On tritonserver's own endpoint each model behind preprocessing refuses a call that carries
    neither the key of the server's start nor the tag of the step before it (a wrong key is no
    key), over gRPC and HTTP, and counts it."""
    before = refused_internal(server, model)
    url, http_url = server.internal.grpc_url, server.internal.http_url
    wrong = {KEY_PARAMETER: new_key()}
    assert grpc_answer(url, model, INPUTS[model])[1] == refusal(model)
    assert grpc_answer(url, model, INPUTS[model], wrong)[1] == refusal(model)
    status, answer = http_answer(http_url, model, INPUTS[model])
    assert (status, answer["error"]) == (400, refusal(model))
    assert refused_internal(server, model) == before + 3


@pytest.mark.parametrize("model", ["spec_decode", "target", "draft"])
def test_a_local_operator_with_the_key_is_served(server, model):
    """The key of the server's start, from its access file (this user's alone), opens the internal
    models to a caller on the server's machine, over gRPC and HTTP. (A call straight to an engine
    holds its sequence's KV cache until a stop call releases it, as spec_decode's calls do.)"""
    internal = read_access_file(access_path(server.profile.build_path(), server.ports.grpc))
    assert internal == server.internal
    keyed = {KEY_PARAMETER: internal.key}
    engine = model != "spec_decode"
    result, error = grpc_answer(internal.grpc_url, model, INPUTS[model], keyed, request_id="security-grpc")
    assert error is None and result.as_numpy("output_ids").size
    status, answer = http_answer(internal.http_url, model, INPUTS[model], keyed, request_id="security-http")
    assert status == 200, answer
    for request_id in ("security-grpc", "security-http") if engine else ():
        stop = {**INPUTS[model], "stop": ("BOOL", np.array([[True]], dtype=np.bool_))}
        assert grpc_answer(internal.grpc_url, model, stop, keyed, request_id=request_id)[1] is None
    assert wait_for(lambda: total(scrape(server.metrics_url), "specdec_kv_slots_in_use") == 0, timeout=10)


def test_preprocessings_tag_lets_in_exactly_the_request_it_checked(server):
    """preprocessing cannot tell a direct call from the ensemble's step (it is the first step), so
    it answers one on tritonserver's own endpoint, with its tag: spec_decode then takes exactly the
    request preprocessing checked, and nothing else under that tag."""
    checked, error = grpc_answer(server.internal.grpc_url, "preprocessing", INPUTS["preprocessing"])
    assert error is None
    handed = {  # preprocessing's outputs under spec_decode's input names, as the ensemble maps them
        "input_ids": ("INT32", checked.as_numpy("input_ids")),
        "input_lengths": ("INT32", checked.as_numpy("input_lengths")),
        "max_tokens": ("INT32", checked.as_numpy("max_tokens_out")),
        "end_id": ("INT32", checked.as_numpy("end_id_out")),
        "stop_words_list": ("INT32", checked.as_numpy("stop_words_list")),
        TAG: ("UINT8", checked.as_numpy(TAG)),
    }
    assert grpc_answer(server.internal.grpc_url, "spec_decode", handed)[1] is None
    longer = {**handed, "max_tokens": ("INT32", checked.as_numpy("max_tokens_out") + 100)}
    other_prompt = {**handed, "input_ids": ("INT32", checked.as_numpy("input_ids")[:, 1:]),
                    "input_lengths": ("INT32", checked.as_numpy("input_lengths") - 1)}  # fmt: skip
    for changed in (longer, other_prompt):
        assert grpc_answer(server.internal.grpc_url, "spec_decode", changed)[1] == refusal("spec_decode")


def test_postprocessing_takes_a_sequence_only_under_spec_decodes_tag_for_it(server):
    """spec_decode's tag over a sequence id opens postprocessing for that sequence only: nobody
    else can have a sequence's cancellation relayed."""

    async def sequence():
        async with internal_client(server) as client:
            inputs = client.inputs({"input_ids": [1, 2, 3], "max_tokens": 2}, SPEC_DECODE_INPUTS)
            return [r async for r in client.stream("spec_decode", inputs, ["sequence_id", TAG])][-1]

    answer = asyncio.run(sequence())
    sequence_id, tag = answer.as_numpy("sequence_id"), answer.as_numpy(TAG)
    tagged = {**INPUTS["postprocessing"], "sequence_id": ("UINT64", sequence_id), TAG: ("UINT8", tag)}
    result, error = grpc_answer(server.internal.grpc_url, "postprocessing", tagged)
    assert error is None and result.as_numpy("text_output") is not None
    another = {**tagged, "sequence_id": ("UINT64", sequence_id + 1)}
    assert grpc_answer(server.internal.grpc_url, "postprocessing", another)[1] == refusal("postprocessing")


def test_the_key_is_in_no_answer_and_no_log(server):
    """The key reaches the models in tritonserver's environment: no configuration, metadata or
    log shows it."""
    key = server.internal.key
    seen = [urllib.request.urlopen(f"http://{server.http_url}/v2/models/{m}/config").read().decode()
            for m in ("ensemble", *INTERNAL_MODELS)]  # fmt: skip
    seen.append(server.log_file.read_text(errors="replace"))
    assert key not in "".join(seen)
    assert all(key not in " ".join(p.cmdline()) for p in psutil.Process(server.process.pid).children(recursive=True))


def test_operators_apis_stay_on_tritonservers_own_endpoint(server):
    """Repository, shared-memory and logging APIs are refused at the server's endpoints; the
    read-only ones genai-perf reads (configurations and statistics of every model) pass."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    for call in (client.get_model_repository_index, client.get_system_shared_memory_status,
                 client.get_log_settings):  # fmt: skip
        with pytest.raises(InferenceServerException, match="not served to clients") as refused:
            call()
        assert refused.value.status() == "StatusCode.PERMISSION_DENIED"
    assert client.get_model_config("spec_decode", as_json=True)["config"]["name"] == "spec_decode"
    assert client.get_inference_statistics("target", as_json=True)["model_stats"]
    for path in ("/v2/repository/index", "/v2/systemsharedmemory/status", "/v2/logging"):
        request = urllib.request.Request(f"http://{server.http_url}{path}", data=b"{}")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert refused.value.code == 403
        assert json.loads(refused.value.read()) == {"error": f"{path}: not served to clients"}


def test_specdec_check_runs_on_the_servers_machine_only(server):
    """`specdec check` sends token ids to spec_decode: given a local server's gRPC port it reads
    the key of the server's start from its access file; without one it says why and stops."""
    assert check(server.profile, server.grpc_url, [CheckArm("ngram", 3)], "mixed", 1, 8, 1) == 0
    assert check(server.profile, f"127.0.0.1:{free_port()}", [CheckArm("ngram", 3)], "mixed", 1, 8, 1) == 2


# --- how large a request may be ------------------------------------------------------------------------
def server_memory(server) -> dict[str, int]:
    """Resident bytes of every process of the server: tritonserver, each model's stub, the edge
    and the OpenAI frontend."""
    memory = {name: m.rss for name, m in memory_snapshot(server.process.pid).items()}
    for name, process in (("edge", server.edge), ("openai", server.frontend)):
        memory[name] = psutil.Process(process.pid).memory_info().rss
    return memory


def raw_http(url: str, path: str, headers: str, body_chunks, stop_after: int) -> tuple[float, bytes]:
    """POST `path` with `headers`, sending body chunks until `stop_after` bytes are sent (or the
    server stops taking them); the seconds until the answer's head arrived, and the answer."""
    host, port = url.split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{headers}\r\n".encode())
        start, sent = time.monotonic(), 0
        for chunk in body_chunks:
            if sent >= stop_after:
                break
            try:
                sock.sendall(chunk)
            except OSError:  # the server answered and closed
                break
            sent += len(chunk)
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += sock.recv(65536) or b"\r\n\r\n"  # (closed: what came is the answer)
        seconds = time.monotonic() - start
        head, _, body = answer.partition(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)  # fmt: skip
        while len(body) < length and (data := sock.recv(65536)):
            body += data
        return seconds, head + b"\r\n\r\n" + body


def test_a_100_mb_body_is_refused_before_it_is_read(server):
    """Over HTTP (from Content-Length, before `Expect: 100-continue` is answered, or as a chunked
    body passes the bound) and over gRPC (unary and streamed), to the ensemble and to the OpenAI
    frontend: refused within seconds, naming the bound; no process of the server grows by the
    body, and the server goes on serving."""
    limit = server.profile.server.body_limit
    assert limit < 2**20  # (the embedded profile's: 6 x (64 KiB prompt + stop words) + 64 KiB)
    before = server_memory(server)
    megabyte = b"x" * 2**20
    too_large = f'{{"error": "the request body is larger than {limit} bytes (server.max_body_bytes)"}}'.encode()
    generate = "/v2/models/ensemble/generate"
    for headers, chunks in (
        (f"Content-Length: {BIG}\r\n", [megabyte] * 100),
        (f"Content-Length: {BIG}\r\nExpect: 100-continue\r\n", []),
        ("Transfer-Encoding: chunked\r\n", [b"100000\r\n" + megabyte + b"\r\n"] * 100),
    ):
        seconds, answer = raw_http(server.http_url, generate, headers, chunks, BIG)
        assert answer.startswith(b"HTTP/1.1 413") and answer.endswith(too_large), (headers, answer[:300])
        assert seconds < REFUSED_WITHIN_S, headers

    prompt = np.array([[b"a" * BIG]], dtype=np.object_)
    values = {"text_input": ("BYTES", prompt), "max_tokens": ("INT32", np.array([[4]], dtype=np.int32))}
    start = time.monotonic()
    _, error = grpc_answer(server.grpc_url, "ensemble", values)
    assert "RESOURCE_EXHAUSTED" in error and f"vs. {limit})" in error
    with pytest.raises(InferenceServerException, match=f"Received message larger than max .* vs. {limit}"):
        grpcclient.InferenceServerClient(server.grpc_url).infer("ensemble", _tensors(values))
    assert time.monotonic() - start < 2 * REFUSED_WITHIN_S

    seconds, answer = raw_http(f"{server.host}:{server.ports.openai}", "/v1/chat/completions",
                               f"Content-Length: {BIG}\r\n", [megabyte] * 100, BIG)  # fmt: skip
    assert answer.startswith(b"HTTP/1.1 413") and seconds < REFUSED_WITHIN_S, answer[:300]

    after = server_memory(server)
    growth = {name: after[name] - before.get(name, 0) for name in after}
    grown = {name: size for name, size in growth.items() if size > GROWTH_LIMIT}
    assert not grown, {name: f"{size >> 20} MiB" for name, size in grown.items()}
    ensemble_serves(server)


def test_a_compressed_body_is_refused(server):
    """tritonserver would inflate a gzip body whole, whatever it inflates to: the edge takes none."""
    headers = "Content-Length: 20\r\nContent-Encoding: gzip\r\n"
    _, answer = raw_http(server.http_url, "/v2/models/ensemble/generate", headers, [b"\x1f\x8b" + b"\0" * 18], 20)
    assert answer.startswith(b"HTTP/1.1 415") and b"Content-Encoding gzip" in answer


def test_engine_inputs_at_the_edge_are_refused_whatever_their_size(server):
    """A call to an engine model is refused at the edge for who it is, not for its size: a prompt
    of the engine's whole context passes the bound and is still refused."""
    ids = np.zeros((1, server.profile.engine.max_seq_len - 1), dtype=np.int32)
    values = {"input_ids": ("INT32", ids), "request_output_len": ("INT32", np.array([[1]], dtype=np.int32))}
    assert set(values) <= set(ENGINE_INPUTS)
    assert grpc_answer(server.grpc_url, "target", values)[1] == refusal("target")
