"""The commands and Triton configs each GPU profile produces: golden files to read flag by flag,
every flag and name checked against what the pinned TensorRT-LLM / Triton versions document, and
the build run for real with stand-in tools (resumable, stops with its log).

Regenerate the golden files after an intended change: SPECDEC_UPDATE_GOLDEN=1 pytest <this file>.
"""

from __future__ import annotations

import os
import re
import shlex
import stat
from pathlib import Path

import pytest
from google.protobuf import text_format
from support.trtllm import GPU_PROFILES, TRT_PROFILES, profile_file, tiny_profile
from tritonclient.grpc import model_config_pb2

from specdec.build import build, upstream
from specdec.build import trtllm as t
from specdec.build.repository import TEMPLATES, model_templates, render_configs, render_repository
from specdec.config import load_profile
from specdec.triton.serve import CONTAINER_BINARY, CONTAINER_SERVER, Ports, TritonInstall, TritonServer

GOLDEN = Path(__file__).parent / "golden" / "trtllm"
SHARED = ("ensemble", "preprocessing", "postprocessing", "spec_decode")


@pytest.fixture(autouse=True)
def default_examples(monkeypatch):
    monkeypatch.delenv(t.EXAMPLES_ENV, raising=False)


def golden_text(name: str) -> str:
    profile = load_profile(profile_file(name))
    parts = []
    if profile.backend == "tensorrtllm":
        parts.append("=== commands\n" + "\n".join(shlex.join(s.argv) for s in t.plan(profile)))
    for model, text in render_configs(profile).items():
        if model not in SHARED:
            parts.append(f"=== {model}/config.pbtxt\n{text.rstrip()}")
    return "\n\n".join(parts) + "\n"


@pytest.mark.parametrize("name", GPU_PROFILES)
def test_golden(name):
    path = GOLDEN / f"{name}.txt"
    text = golden_text(name)
    if os.environ.get("SPECDEC_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"{path} differs: regenerate with SPECDEC_UPDATE_GOLDEN=1 if intended"


def _flags(argv: tuple[str, ...]) -> set[str]:
    return {a for a in argv if a.startswith("--")}


def _value(argv, flag):
    return argv[argv.index(flag) + 1]


@pytest.mark.parametrize("name", TRT_PROFILES)
def test_commands_use_only_upstream_flags_and_values(name):
    """Every trtllm-build flag and value, and every converter's flags, as TensorRT-LLM 1.0
    has them (upstream.TRTLLM_BUILD_FLAGS, upstream.CONVERTERS)."""
    profile = load_profile(profile_file(name))
    for step in t.plan(profile):
        if step.argv[0] == "trtllm-build":
            assert _flags(step.argv) <= set(upstream.TRTLLM_BUILD_FLAGS), step.name
            assert _value(step.argv, "--gemm_plugin") in upstream.GEMM_PLUGIN_DTYPES
            assert _value(step.argv, "--use_paged_context_fmha") in upstream.PLUGIN_SWITCH
            assert _value(step.argv, "--kv_cache_type") in upstream.KV_CACHE_TYPES
            if "--speculative_decoding_mode" in step.argv:
                assert _value(step.argv, "--speculative_decoding_mode") in upstream.SPECULATIVE_DECODING_MODES
            if "--logits_dtype" in step.argv:
                assert _value(step.argv, "--logits_dtype") in ("float16", "float32")
        else:
            script = str(Path(step.argv[1]).relative_to(t.examples_dir()))
            assert _flags(step.argv) <= upstream.CONVERTERS[script].flags, step.name


def test_each_mode_builds_and_decodes_as_upstream_names_it():
    for name in TRT_PROFILES:
        profile = load_profile(profile_file(name))
        mode = upstream.MODES[profile.trtllm.mode]
        builds = [s.argv for s in t.plan(profile) if s.argv[0] == "trtllm-build"]
        if mode.build_mode is None:
            assert builds == []  # the LLM API loads the checkpoints itself
            continue
        assert _value(builds[0], "--speculative_decoding_mode") == mode.build_mode
        assert t.triton_parameters(profile, "target").get("decoding_mode") == mode.decoding_mode
        assert mode.decoding_mode is None or mode.decoding_mode in upstream.DECODING_MODES


def test_draft_target_flags_the_issue_asks_for():
    profile = load_profile(profile_file("draft-target"))
    steps = {s.name: s.argv for s in t.plan(profile)}
    target, draft = steps["build target engine"], steps["build draft engine"]
    assert _value(target, "--speculative_decoding_mode") == "draft_tokens_external"
    assert _value(target, "--max_draft_len") == "8"
    assert "--gather_generation_logits" in draft and "--gather_generation_logits" not in target
    assert _value(draft, "--logits_dtype") == "float32"  # the draft config declares its logits FP32
    assert "--speculative_decoding_mode" not in draft
    for argv in (target, draft):  # KV cache reuse is on: paged context FMHA everywhere
        assert _value(argv, "--use_paged_context_fmha") == "enable"
    ngram = {s.name: s.argv for s in t.plan(load_profile(profile_file("ngram")))}
    assert list(ngram) == ["convert target checkpoint", "build target engine"]


def test_redrafter_converts_its_base_first():
    """TensorRT-LLM 1.0's ReDrafter converter takes the base model's converted checkpoint
    (--base_model_checkpoint_dir), not its Hugging Face folder."""
    profile = load_profile(profile_file("redrafter"))
    steps = t.plan(profile)
    assert [s.name for s in steps] == ["convert target base checkpoint", "convert target checkpoint",
                                       "build target engine"]  # fmt: skip
    base, redrafter = steps[0].argv, steps[1].argv
    assert base[1].endswith(upstream.LLAMA_CONVERTER) and _value(base, "--model_dir") == profile.target.hf_dir
    assert redrafter[1].endswith(upstream.REDRAFTER_CONVERTER)
    assert _value(redrafter, "--base_model_checkpoint_dir") == str(steps[0].output)
    assert "--pp_size" not in redrafter and "--model_dir" not in redrafter


def _config(text: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def _tensorrtllm_configs(name: str) -> dict[str, model_config_pb2.ModelConfig]:
    configs = {m: _config(text) for m, text in render_configs(load_profile(profile_file(name))).items()}
    return {m: c for m, c in configs.items() if c.backend == "tensorrtllm"}


def _declared(tensor: upstream.Tensor) -> tuple:
    dtype = "TYPE_FP32" if tensor.dtype == upstream.LOGITS_DATATYPE else tensor.dtype
    return dtype, list(tensor.dims)


@pytest.mark.parametrize("name", [n for n in TRT_PROFILES if n != "eagle3"])
def test_every_tensorrtllm_config_carries_what_the_backend_reads(name):
    """Parameters: every one the backend requires for the model's decoding mode, only ones it
    reads, values it parses (upstream.BACKEND_PARAMETERS)."""
    for model, config in _tensorrtllm_configs(name).items():
        params = {k: v.string_value for k, v in config.parameters.items()}
        decoding_mode = params.get("decoding_mode")
        assert upstream.required_parameters(decoding_mode) <= params.keys(), model
        assert params.keys() <= upstream.BACKEND_PARAMETERS.keys(), model
        assert decoding_mode is None or decoding_mode in upstream.DECODING_MODES
        assert params["gpt_model_type"] in upstream.GPT_MODEL_TYPES
        for key in ("enable_kv_cache_reuse", "exclude_input_in_output"):
            assert params[key] in upstream.BOOL_TRUE + upstream.BOOL_FALSE
        assert re.fullmatch(r"\d+(,\d+)*", params["gpu_device_ids"])  # one instance's devices
        if "medusa_choices" in params:  # "{0, 0, 0}, {0, 1}"
            assert re.fullmatch(r"\{\d+(, \d+)*\}(, \{\d+(, \d+)*\})*", params["medusa_choices"])


@pytest.mark.parametrize("name", TRT_PROFILES)
def test_every_engine_tensor_is_declared_as_upstream_declares_it(name):
    """Inputs and outputs: names, dtypes and dims of upstream's tensorrt_llm/config.pbtxt;
    inputs with its optional / reshape / ragged flags; the seed input named as 1.0 names it."""
    configs = {m: _config(text) for m, text in render_configs(load_profile(profile_file(name))).items()}
    for model in ("target", "draft"):
        if model not in configs:
            continue
        config = configs[model]
        for tensor in config.input:
            upstream_tensor = upstream.ENGINE_INPUTS[tensor.name]
            dtype = model_config_pb2.DataType.Name(tensor.data_type)
            assert (dtype, list(tensor.dims)) == _declared(upstream_tensor), tensor.name
            assert tensor.optional == upstream_tensor.optional, tensor.name
            assert tensor.HasField("reshape") == upstream_tensor.reshape, tensor.name
            assert tensor.allow_ragged_batch == upstream_tensor.ragged, tensor.name
        for tensor in config.output:
            dtype = model_config_pb2.DataType.Name(tensor.data_type)
            assert (dtype, list(tensor.dims)) == _declared(upstream.ENGINE_OUTPUTS[tensor.name].declared), tensor.name
        names = {tensor.name for tensor in config.input}
        assert upstream.SEED_INPUT in names and upstream.SEED_INPUT_BEFORE_1_0 not in names


@pytest.mark.parametrize("name", GPU_PROFILES)
def test_shared_models_are_the_cpu_paths(name):
    """The GPU repository's ensemble, pre/post-processing and spec_decode come from the same
    templates, with the same values, as the embedded CPU profile's."""
    gpu, cpu = model_templates(load_profile(profile_file(name))), model_templates(load_profile())
    for model in SHARED:
        assert gpu[model][0] == cpu[model][0] == TEMPLATES / model
        assert gpu[model][1].keys() == cpu[model][1].keys()


def _fake_tools(bin_dir: Path, fail_on: str | None = None) -> Path:
    """python3 and trtllm-build stand-ins that log their argv (and fail on a chosen argument)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    calls = bin_dir / "calls.log"
    for tool in ("python3", "trtllm-build"):
        script = bin_dir / tool
        fail = f'case "$*" in *{fail_on}*) echo "boom: out of memory"; exit 3;; esac\n' if fail_on else ""
        script.write_text(f'#!/bin/sh\necho "{tool} $*" >> {calls}\n{fail}echo working\n')
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return calls


def test_build_runs_resumes_and_stops_with_its_log(tmp_path, monkeypatch):
    profile = tiny_profile("draft-target", tmp_path)
    examples = tmp_path / "examples"
    for script in ("models/core/llama/convert_checkpoint.py",):
        (examples / script).parent.mkdir(parents=True)
        (examples / script).touch()
    monkeypatch.setenv(t.EXAMPLES_ENV, str(examples))
    path = os.environ["PATH"]

    calls = _fake_tools(tmp_path / "failing", fail_on="engines/draft")
    monkeypatch.setenv("PATH", f"{tmp_path / 'failing'}:{path}")
    with pytest.raises(t.BuildError) as err:
        build(profile)
    assert "build draft engine failed (exit 3)" in str(err.value) and "boom: out of memory" in str(err.value)
    assert len(calls.read_text().splitlines()) == 4

    calls = _fake_tools(tmp_path / "working")
    monkeypatch.setenv("PATH", f"{tmp_path / 'working'}:{path}")
    repo = build(profile)
    assert [c.split()[0] for c in calls.read_text().splitlines()] == ["trtllm-build"]  # only the failed step
    assert (repo / "target" / "1").is_dir() and (repo / "draft" / "config.pbtxt").is_file()
    assert (repo / "spec_decode" / "1" / "model.py").is_file()

    build(profile)  # everything done: nothing runs again
    assert len(calls.read_text().splitlines()) == 1


def test_dry_run_prints_the_commands_and_writes_nothing(tmp_path, capsys):
    profile = tiny_profile("draft-target", tmp_path)
    build(profile, dry_run=True)
    out = capsys.readouterr().out
    assert [shlex.join(s.argv) for s in t.plan(profile)] == [
        line for line in out.splitlines() if not line.startswith("#")
    ]
    assert "# [4/4] build draft engine" in out and "not found: set SPECDEC_TRTLLM_EXAMPLES" in out
    assert not profile.build_path().exists()


def test_the_container_serves_a_tensorrtllm_profile_under_mpirun(tmp_path):
    """`specdec serve` (the container's entrypoint) starts NVIDIA's tritonserver under mpirun in
    orchestrator mode, with the flags and environment it gives any server."""
    profile = tiny_profile("lookahead", tmp_path)
    render_repository(profile)
    server = TritonServer(profile, ports=Ports(8000, 8001, 8002))
    container = TritonInstall(CONTAINER_BINARY, CONTAINER_SERVER / "backends")
    argv, env = server.launch(container)
    assert argv[:4] == ["mpirun", "-n", "1", str(container.binary)]
    assert set(server.command(container)[1:]) <= set(argv[4:])
    assert env["TRTLLM_ORCHESTRATOR"] == "1" and env["PATH"] == server.environment(container)["PATH"]


def test_launch_in_orchestrator_mode():
    profile = load_profile(profile_file("draft-target"))
    argv, env = t.launch_command(profile, ["/opt/tritonserver/bin/tritonserver", "--model-repository=/r"], {})
    assert argv[:4] == ["mpirun", "-n", "1", "/opt/tritonserver/bin/tritonserver"]
    assert env == {"TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1"}
    assert "--cuda-memory-pool-byte-size=0:0" in argv
    argv, env = t.launch_command(load_profile(profile_file("eagle3")), ["tritonserver"], {})
    assert argv == ["mpirun", "-n", "1", "tritonserver"] and env == {}
