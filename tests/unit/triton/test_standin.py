"""The GPU profiles' own repositories on the CPU: the stand-in for the tensorrtllm backend
(specdec/triton/standin.py) loads each rendered tensorrt_llm model unchanged and behaves as the
upstream record says the backend does; then every TensorRT-LLM profile serves greedy requests,
streamed and not, through ensemble -> spec_decode -> engine in the real tritonserver, with
SmolLM2 in place of the profile's model, exact against plain decoding.

    pytest -m trtllm_standin
"""

from __future__ import annotations

import asyncio
import shutil

import numpy as np
import pytest
import yaml
from google.protobuf import json_format, text_format
from support.trtllm import TRT_PROFILES, profile_data, tiny_profile
from tritonclient.grpc import model_config_pb2

from specdec.build import upstream
from specdec.build.repository import render_configs
from specdec.config import parse_profile
from specdec.engine.engine import Engine, GenerationRequest
from specdec.engine.sampling import SamplingParams
from specdec.speculation.loop import RequestSpec
from specdec.triton.passthrough import PassthroughService, drafts_in_engine
from specdec.triton.service import EngineError, SpecDecodeService
from specdec.triton.standin import Call, LoadError, ResponseError, Standin, build_standin, load_config
from specdec.triton.tensors import InvalidInput, SpecDecodeRequest, parse_spec_decode

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


@pytest.mark.parametrize("name", sorted(upstream.required_parameters("lookahead")))
def test_a_missing_required_parameter_fails_the_load_naming_it(lookahead, name):
    config = engine_configs(lookahead)["target"]
    del config["parameters"][name]
    with pytest.raises(LoadError, match=f"^Cannot find parameter with name: {name}$"):
        load_config(config)


def test_lookahead_parameters_are_required_only_in_lookahead_mode(lookahead):
    config = engine_configs(lookahead)["target"]
    for name in ("decoding_mode", "lookahead_window_size", "lookahead_ngram_size", "lookahead_verification_set_size"):
        del config["parameters"][name]
    assert load_config(config).decoding_mode is None


def test_the_engine_path_and_batching_type_are_checked(lookahead, tmp_path):
    config = engine_configs(lookahead)["target"]
    config["parameters"]["gpt_model_path"]["string_value"] = str(tmp_path / "no-engine")
    with pytest.raises(LoadError, match=upstream.NO_MODEL_PATH):
        load_config(config)
    config = engine_configs(lookahead)["target"]
    config["parameters"]["gpt_model_type"]["string_value"] = "${batching_strategy}"  # an unfilled template
    with pytest.raises(LoadError, match="Invalid gpt_model_type"):
        load_config(config)


# --- responses, as the backend writes them ---------------------------------------------------------------
@pytest.fixture(scope="module")
def standin(lookahead):
    return Standin(load_config(engine_configs(lookahead)["target"]), threads=1)


def _call(requested, **inputs) -> Call:
    arrays = {"input_ids": np.array([5, 7, 9, 5, 7], np.int32), "input_lengths": np.array([5], np.int32),
              "request_output_len": np.array([6], np.int32), "exclude_input_in_output": np.array([True])}  # fmt: skip
    arrays |= {name: np.array([value]) for name, value in inputs.items()}
    return Call(arrays, set(requested), "req-1")


def test_output_ids_and_sequence_length_must_be_requested(standin):
    (answer,) = standin.run([_call(["output_ids"])])
    assert isinstance(answer, ResponseError)
    assert str(answer) == "Error encountered while populating response: sequence_length tensor must be present in " \
        "list of output tensors"  # fmt: skip


def test_only_requested_outputs_but_every_perf_metric_when_asked(standin):
    (plain,) = standin.run([_call(["output_ids", "sequence_length"])])
    assert set(plain) == {"output_ids", "sequence_length"}
    assert plain["output_ids"].shape == (1, 1, 6) and plain["sequence_length"].tolist() == [[6]]
    (perf,) = standin.run([_call(["output_ids", "sequence_length"], return_perf_metrics=True)])
    assert set(perf) == {"output_ids", "sequence_length"} | upstream.perf_metric_outputs()
    assert perf["arrival_time_ns"].dtype == np.int64 and perf["total_draft_tokens"].shape == (1, 1)
    assert int(perf["total_draft_tokens"][0, 0]) > 0  # an in-engine mode: the engine drafted


def test_an_output_the_config_does_not_declare_fails_the_response(lookahead):
    config = engine_configs(lookahead)["target"]
    config["output"] = [o for o in config["output"] if o["name"] != "kv_cache_reused_blocks"]
    (answer,) = Standin(load_config(config), threads=1).run([_call(["output_ids", "sequence_length"],
                                                                   return_perf_metrics=True)])  # fmt: skip
    assert isinstance(answer, ResponseError)
    assert "unexpected inference output 'kv_cache_reused_blocks' for model 'target'" in str(answer)


def test_stop_streaming_and_input_flags_as_upstream(standin):
    stop = _call(["output_ids", "sequence_length"], stop=True)
    no_id = Call(stop.inputs, stop.requested, "")
    streaming = _call(["output_ids", "sequence_length"], streaming=True)
    with_input = _call(["output_ids", "sequence_length"], exclude_input_in_output=False)
    answers = standin.run([stop, no_id, streaming, with_input])
    assert answers[0] == {}  # any id: the request it names may have finished
    assert str(answers[1]) == upstream.STOP_WITHOUT_ID
    assert str(answers[2]) == upstream.STREAMING_NOT_DECOUPLED  # a non-decoupled model cannot stream
    assert answers[3]["output_ids"].shape == (1, 1, 11)  # the request's flag over the parameter's


# --- spec_decode over the stand-ins, in process -----------------------------------------------------------
def standin_call(profile, log: list):
    """An PrepareCall answered by the stand-ins of the profile's rendered engine models; each call
    (model, inputs, outputs) goes into log."""
    build_standin(profile)
    standins = {name: Standin(load_config(config), threads=1) for name, config in engine_configs(profile).items()}

    def prepare(model, inputs, outputs, request_id):
        async def send():
            log.append((model, inputs, outputs))
            arrays = {name: np.asarray(arr)[0] for name, arr in inputs.items()}
            (answer,) = standins[model].run([Call(arrays, set(outputs), request_id)])
            if isinstance(answer, Exception):
                raise EngineError(f"{model}: {answer}")
            return answer

        return send

    return prepare


def plain_greedy(model_dir, prompt: list[int], n: int) -> list[int]:
    (result,) = Engine(model_dir, kv_slots=1, max_seq_len=256, threads=1).generate(
        [GenerationRequest(np.array(prompt), n)]
    )
    return result.tokens.tolist()


PROMPT = [5, 7, 9, 11, 5, 7, 9, 13, 5, 7]


@pytest.mark.parametrize("name", [n for n in TRT_PROFILES if n != "eagle3"])
def test_spec_decode_is_exact_over_the_standins_and_asks_what_upstream_answers(name, tmp_path):
    """Greedy requests through spec_decode and the profile's own engine configs, exact against
    plain decoding; every call asks for the outputs the backend requires, and everything the
    backend would write is declared (else the stand-in fails the call)."""
    profile = tiny_profile(name, tmp_path)
    log: list = []
    service_class = PassthroughService if drafts_in_engine(profile) else SpecDecodeService
    service = service_class(profile, standin_call(profile, log), draft_model="draft" if profile.draft else None)
    expected = plain_greedy(profile.model_dir("target"), PROMPT, 20)
    for proposer, stream in (("none", True), (profile.speculation.proposer, False), ("ngram", True)):
        if drafts_in_engine(profile) and proposer != "none":
            continue
        k = 0 if proposer == "none" else 4
        req = SpecDecodeRequest(RequestSpec(PROMPT, 20, k), SamplingParams(), proposer, stream, False)
        chunks = asyncio.run(_collect(service.serve(req)))
        assert [t for c in chunks for t in c.tokens] == expected, (name, proposer)
    assert log and all(not upstream.unrequested_required_outputs(outputs) for _, _, outputs in log if outputs)
    if drafts_in_engine(profile):
        assert chunks[-1].gen.stats.draft_tokens > 0  # the engine's own drafts, from its perf outputs


async def _collect(chunks):
    return [chunk async for chunk in chunks]


def test_sampled_requests_go_to_exact_modes_only(tmp_path):
    inputs = {"input_ids": np.array(PROMPT, np.int32), "max_tokens": np.array([8], np.int32),
              "temperature": np.array([0.8], np.float32)}  # fmt: skip
    for name in TRT_PROFILES:
        profile = tiny_profile(name, tmp_path / name)
        mode = profile.trtllm.mode
        if upstream.MODES[mode].sampling == "exact":
            assert not parse_spec_decode(inputs, profile, 96).sampling.greedy
        else:
            with pytest.raises(InvalidInput, match=f"^temperature: {mode} decodes greedily in TensorRT-LLM 1.0.0"):
                parse_spec_decode(inputs, profile, 96)


def test_render_only_writes_the_repository_a_build_serves(tmp_path):
    """`specdec build --render-only --output-dir DIR`: every model a GPU build renders, nothing built."""
    from specdec.cli import main

    for name in TRT_PROFILES:
        data = profile_data(name) | {"build_dir": str(tmp_path / "build" / name)}
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(data))
        out = tmp_path / "out" / name
        assert main(["build", "--profile", str(path), "--render-only", "--output-dir", str(out)]) == 0
        profile = parse_profile(data, name)
        expected = render_configs(profile)
        assert sorted(p.name for p in out.iterdir()) == sorted(expected)
        for model, text in expected.items():
            assert (out / model / "config.pbtxt").read_text() == text
        assert not (tmp_path / "build" / name).exists()  # no checkpoint, no engine, no profile written
        shutil.rmtree(out)
