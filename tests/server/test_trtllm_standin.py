"""The GPU profiles' own repositories on the CPU: the stand-in for the tensorrtllm backend
(specdec/triton/standin.py) loads each rendered tensorrt_llm model unchanged and behaves as the
upstream record says the backend does; then every TensorRT-LLM profile serves greedy requests,
streamed and not, through ensemble -> spec_decode -> engine in the real tritonserver, with
SmolLM2 in place of the profile's model, exact against plain decoding.

    pytest -m trtllm_standin
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from google.protobuf import json_format, text_format
from support.prompts import PASSAGE
from support.servers import internal_client
from support.trtllm import TRT_PROFILES, profile_data, tiny_profile
from tritonclient.grpc import model_config_pb2

from specdec.build import upstream
from specdec.build.repository import render_configs
from specdec.client.client import RequestParams, TritonClient, http_generate
from specdec.config import IN_ENGINE_WEIGHTS, parse_profile
from specdec.engine.engine import Engine, GenerationRequest
from specdec.triton.serve import Ports, ServerError, TritonServer
from specdec.triton.standin import Standin, build_standin, load_config

pytestmark = pytest.mark.trtllm_standin


def model_config(text: str) -> dict:
    """A config.pbtxt in the JSON form Triton gives a backend."""
    return json_format.MessageToDict(text_format.Parse(text, model_config_pb2.ModelConfig()),
                                     preserving_proto_field_name=True)  # fmt: skip


def engine_configs(profile) -> dict[str, dict]:
    configs = {name: model_config(text) for name, text in render_configs(profile).items()}
    return {name: c for name, c in configs.items() if c.get("backend") == "tensorrtllm"}


# --- loading, as the backend loads -----------------------------------------------------------------
@pytest.fixture(scope="module")
def lookahead(tmp_path_factory):
    profile = tiny_profile("lookahead", tmp_path_factory.mktemp("standin-lookahead"))
    build_standin(profile)
    return profile


# --- responses, as the backend writes them ---------------------------------------------------------------
@pytest.fixture(scope="module")
def standin(lookahead):
    return Standin(load_config(engine_configs(lookahead)["target"]), threads=1)


def plain_greedy(model_dir, prompt: list[int], n: int) -> list[int]:
    (result,) = Engine(model_dir, kv_slots=1, max_seq_len=256, threads=1).generate(
        [GenerationRequest(np.array(prompt), n)]
    )
    return result.tokens.tolist()


# --- the real server -----------------------------------------------------------------------------------
PROMPTS = [
    (f"Repeat the following passage exactly:\n\n{PASSAGE}", 40),
    ("Count from 1 to 20, separated by commas.", 32),
]


def smollm_profile(name: str, smollm_dir, root):
    """The GPU profile with SmolLM2 for its model and every checkpoint it names (the stand-in
    reads the target's and the draft's; a draft of SmolLM2 itself accepts everything), built
    under root."""
    data = profile_data(name)
    for role in ("target", "draft"):
        if role in data:
            data[role]["hf_dir"] = str(smollm_dir)
    for mode, key in IN_ENGINE_WEIGHTS:
        if data["trtllm"].get(mode):
            data["trtllm"][mode][key]["hf_dir"] = str(smollm_dir)
    data["build_dir"], data["server"]["host"], data["chat_template"] = str(root), "127.0.0.1", True
    data["trtllm"]["passthrough_chunk"] = 8  # in-engine modes stream these short answers in several chunks
    return parse_profile(data, name)


@pytest.fixture(scope="module")
def references(smollm_dir, tokenizer):
    """Plain greedy decoding in process: each prompt's ids and tokens up to the end token."""
    out = []
    for text, n in PROMPTS:
        ids = tokenizer.encode(tokenizer.chat_prompt(text))
        tokens = plain_greedy(smollm_dir, ids, n)
        out.append((ids, tokens[: tokens.index(tokenizer.eos_id)] if tokenizer.eos_id in tokens else tokens))
    return out


@pytest.mark.server
@pytest.mark.parametrize("name", TRT_PROFILES)
def test_the_profile_serves_exact_greedy_generations(name, smollm_dir, tokenizer, references, tmp_path):
    profile = smollm_profile(name, smollm_dir, tmp_path / "build")
    build_standin(profile)
    with TritonServer(profile, ports=Ports.free(), standin=True) as server:

        async def main():
            async with TritonClient(server.grpc_url) as client, internal_client(server) as direct:
                out = []
                for (text, n), (ids, _) in zip(PROMPTS, references, strict=True):
                    params = RequestParams(max_tokens=n)
                    out.append((
                        await client.generate(text, params, stream=True),
                        await http_generate(server.http_url, text, params, stream=False),
                        await direct.generate_ids(ids, params, stream=False),
                        await client.generate(text, RequestParams(max_tokens=n, temperature=0.7, seed=1)),
                    ))  # fmt: skip
                return out

        records = asyncio.run(main())
        for (streamed, unstreamed, by_ids, sampled), (_, tokens) in zip(records, references, strict=True):
            assert (streamed.error, unstreamed.error, by_ids.error) == (None, None, None)
            assert by_ids.ids == tokens, name
            assert streamed.text == unstreamed.text == tokenizer.decode(tokens), name
            assert len(streamed.chunks) > 1  # streamed: more than one response
            if upstream.MODES[profile.trtllm.mode].sampling == "exact":
                assert sampled.error is None and sampled.num_output_tokens > 0
            else:
                assert "temperature" in sampled.error and profile.trtllm.mode in sampled.error
        if profile.trtllm.mode != "eagle3":  # (TensorRT-LLM 1.0's LLM API reports no drafts)
            assert sum(streamed.total_draft_tokens for streamed, *_ in records) > 0, name


@pytest.mark.server
def test_the_real_server_refuses_what_the_backend_refuses(smollm_dir, tmp_path):
    """A config without a required parameter does not load; a call that does not ask for
    sequence_length fails with the backend's message."""
    profile = smollm_profile("ngram", smollm_dir, tmp_path / "build")
    build_standin(profile)
    config = profile.repository_dir() / "target" / "config.pbtxt"
    text = config.read_text()
    config.write_text("\n".join(line for line in text.splitlines() if '"guided_decoding_backend"' not in line))
    refused = TritonServer(profile, ports=Ports.free(), standin=True)
    with pytest.raises(ServerError, match="Cannot find parameter with name: guided_decoding_backend"):
        refused.__enter__()
    config.write_text(text)
    with TritonServer(profile, ports=Ports.free(), standin=True) as server:
        # the engine model itself, as spec_decode calls it: on tritonserver's own endpoint (the
        # backend reads no key, as the tensorrtllm backend reads none; the edge serves only the ensemble)
        client = grpcclient.InferenceServerClient(server.internal.grpc_url)
        inputs = []
        for name, value in (("input_ids", [[5, 7, 9]]), ("input_lengths", [[3]]), ("request_output_len", [[2]])):
            tensor = grpcclient.InferInput(name, [1, len(value[0])], "INT32")
            tensor.set_data_from_numpy(np.array(value, np.int32))
            inputs.append(tensor)
        with pytest.raises(Exception, match="sequence_length tensor must be present in list of output tensors"):
            client.infer("target", inputs, outputs=[grpcclient.InferRequestedOutput("output_ids")])
        answer = client.infer("target", inputs, outputs=[grpcclient.InferRequestedOutput(n)
                                                        for n in ("output_ids", "sequence_length")])  # fmt: skip
        assert answer.as_numpy("output_ids").shape == (1, 1, 2)
