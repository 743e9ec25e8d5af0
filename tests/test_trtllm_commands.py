"""The commands and Triton configs each GPU profile produces: golden files to read flag by flag,
every flag and name checked against what the pinned TensorRT-LLM / Triton versions document, and
the build run for real with stand-in tools (resumable, stops with its log).

Regenerate the golden files after an intended change: SPECDEC_UPDATE_GOLDEN=1 pytest <this file>.
"""

from __future__ import annotations

import os
import shlex
import stat
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2
from trtllm_checkpoints import GPU_PROFILES, profile_file, tiny_profile

from specdec.build import build
from specdec.build import trtllm as t
from specdec.build.render import TEMPLATES, model_templates, render_configs, render_repository
from specdec.config import load_profile
from specdec.contract import ENGINE_INPUTS, ENGINE_OUTPUTS
from specdec.serve import CONTAINER_SERVER, Ports, TritonInstall, TritonServer

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


TRT_PROFILES = [n for n in GPU_PROFILES if n != "pytorch-cuda"]


@pytest.mark.parametrize("name", TRT_PROFILES)
def test_commands_use_only_pinned_flags(name):
    profile = load_profile(profile_file(name))
    for step in t.plan(profile):
        if step.argv[0] == "trtllm-build":
            assert _flags(step.argv) <= t.TRTLLM_BUILD_FLAGS
            if "--speculative_decoding_mode" in step.argv:
                mode = step.argv[step.argv.index("--speculative_decoding_mode") + 1]
                assert mode in t.SPECULATIVE_DECODING_MODES
        else:
            script = str(Path(step.argv[1]).relative_to(t.examples_dir()))
            assert _flags(step.argv) <= t.CONVERT_FLAGS[script]


def _value(argv, flag):
    return argv[argv.index(flag) + 1]


def test_draft_target_flags_the_issue_asks_for():
    profile = load_profile(profile_file("draft-target"))
    steps = {s.name: s.argv for s in t.plan(profile)}
    target, draft = steps["build target engine"], steps["build draft engine"]
    assert _value(target, "--speculative_decoding_mode") == "draft_tokens_external"
    assert _value(target, "--max_draft_len") == "8"
    assert "--gather_generation_logits" in draft and "--gather_generation_logits" not in target
    assert "--speculative_decoding_mode" not in draft
    for argv in (target, draft):  # KV cache reuse is on: paged context FMHA everywhere
        assert _value(argv, "--use_paged_context_fmha") == "enable"
    ngram = {s.name: s.argv for s in t.plan(load_profile(profile_file("ngram")))}
    assert _value(ngram["build target engine"], "--speculative_decoding_mode") == "draft_tokens_external"
    assert list(ngram) == ["convert target checkpoint", "build target engine"]


def test_in_engine_modes():
    modes = {}
    for name in ("medusa", "lookahead", "redrafter"):
        profile = load_profile(profile_file(name))
        build_step = next(s for s in t.plan(profile) if s.argv[0] == "trtllm-build")
        modes[name] = (_value(build_step.argv, "--speculative_decoding_mode"), t.triton_parameters(profile, "target"))
    assert modes["medusa"][0] == "medusa" and modes["medusa"][1]["decoding_mode"] == "medusa"
    assert modes["medusa"][1]["medusa_choices"].startswith("{0}, {0, 0}, {1}, {0, 1}")
    assert modes["lookahead"][0] == "lookahead_decoding"
    assert {k: v for k, v in modes["lookahead"][1].items() if k.startswith("lookahead")} == {
        "lookahead_window_size": "4",
        "lookahead_ngram_size": "4",
        "lookahead_verification_set_size": "4",
    }
    assert modes["redrafter"][0] == "explicit_draft_tokens" and modes["redrafter"][1]["decoding_mode"] == "redrafter"
    for _, params in modes.values():
        assert params["decoding_mode"] in t.DECODING_MODES
    assert t.plan(load_profile(profile_file("eagle3"))) == []  # LLM API: no engine build


@pytest.mark.parametrize("name", GPU_PROFILES)
def test_every_config_is_a_triton_model_config(name):
    profile = load_profile(profile_file(name))
    for text in render_configs(profile).values():
        config = text_format.Parse(text, model_config_pb2.ModelConfig())
        if config.backend == "tensorrtllm":
            assert {p for p in config.parameters} <= t.TRITON_PARAMETERS
            inputs = {i.name: model_config_pb2.DataType.Name(i.data_type) for i in config.input}
            outputs = {o.name for o in config.output}
            assert set(inputs) == set(ENGINE_INPUTS) and set(inputs) <= t.PINNED_ENGINE_INPUTS
            assert outputs == set(ENGINE_OUTPUTS) and outputs <= t.PINNED_ENGINE_OUTPUTS
            assert inputs["seed"] == "TYPE_UINT64"  # the pinned name; 0.19 and older said random_seed
            assert config.parameters["exclude_input_in_output"].string_value == "true"
            assert config.parameters["gpt_model_type"].string_value == "inflight_fused_batching"


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
    container = TritonInstall(CONTAINER_SERVER / "bin" / "tritonserver", CONTAINER_SERVER / "backends")
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
