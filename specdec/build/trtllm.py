"""TensorRT-LLM: the commands that build a profile's engines, their Triton models, and the launch.

Pinned: TensorRT-LLM 1.0.0 (git commit ae8270b713446948246f16fadf4e2a32e35d0f62), as shipped in
NVIDIA's Triton container nvcr.io/nvidia/tritonserver:25.09-trtllm-python-py3 (Triton 25.09,
TensorRT 10.11.0.33, CUDA 12.9.1, Python 3.12).

Where each fact was checked (tensorrtllm_backend = github.com/triton-inference-server/
tensorrtllm_backend, read with git; TRT-LLM = github.com/NVIDIA/TensorRT-LLM, read through a
code index that stores versions by commit, not by tag, so a TRT-LLM file was read at a commit
near 1.0.0 and the fact is marked as such where it could not be tied to the tag itself):

- Container <-> version: Triton's compatibility matrix (docs.nvidia.com/deeplearning/triton-
  inference-server/user-guide/docs/introduction/compatibility.html) lists 25.09 and 25.10
  trtllm-python-py3 with TensorRT-LLM 1.0.0 (25.08: 0.21.0); tensorrtllm_backend's tag v1.0.0
  and branch r25.09 both pin the tensorrt_llm submodule at ae8270b7.
- Tensor names (contract.ENGINE_*): tensorrtllm_backend's own all_models/inflight_batcher_llm/
  tensorrt_llm/config.pbtxt renamed `random_seed` to `seed` in commit c2e65b8 (2025-05-13, synced
  from TRT-LLM main), before 1.0.0 branched; the v1.0.0rc6 model_config.md (backend commit e6dfd73)
  and TRT-LLM's triton_backend/all_models/.../config.pbtxt both say `seed`. (The backend's v1.0.0
  *tag* still carries the stale 0.19 docs saying `random_seed`; the 1.0 code does not.)
  PINNED_ENGINE_INPUTS / PINNED_ENGINE_OUTPUTS below are the names of that config.pbtxt we use.
- Model parameters (TRITON_PARAMETERS): keys of that config.pbtxt, identical in backend commit
  c2e65b8 and TRT-LLM's current triton_backend copy; meanings in model_config.md (e6dfd73):
  gpt_model_type=inflight_fused_batching, gpt_model_path, decoding_mode in {medusa, redrafter,
  lookahead, eagle, ...}, medusa_choices as "{0, 0}, {0, 1}", lookahead_window_size /
  lookahead_ngram_size / lookahead_verification_set_size, gpu_device_ids as "0,1",
  executor_worker_path, FORCE_CPU_ONLY_INPUT_TENSORS.
- trtllm-build flags: tensorrt_llm/commands/build.py and tensorrt_llm/plugin/plugin.py (TRT-LLM,
  read at a commit near 1.0): --checkpoint_dir --output_dir --max_batch_size --max_input_len
  --max_seq_len --max_num_tokens --kv_cache_type {continuous,paged,disabled} --workers
  --gather_generation_logits --speculative_decoding_mode {draft_tokens_external,
  lookahead_decoding, medusa, explicit_draft_tokens, eagle} --max_draft_len; plugin options
  take "enable"/"disable" or a dtype (--use_paged_context_fmha enable, --gemm_plugin bfloat16).
  That build.py warns that --gather_generation_logits is deprecated ("use
  --output_generation_logits at runtime"); it is still accepted, and the issue asks for it.
- Conversion scripts (examples are not in the wheel: the Dockerfile fetches TRT-LLM's examples/ at
  tag v1.0.0): examples/models/core/llama/convert_checkpoint.py (--model_dir --output_dir --dtype
  --tp_size --pp_size --workers), examples/medusa/convert_checkpoint.py (+ --medusa_model_dir
  --num_medusa_heads --num_medusa_layers --max_medusa_token_len), examples/redrafter/
  convert_checkpoint.py (--drafter_model_dir --redrafter_num_beams --redrafter_draft_len_per_beam;
  it has no --pp_size).
- Modes: examples/draft_target_model/README.md (target: --speculative_decoding_mode
  draft_tokens_external --max_draft_len; --use_paged_context_fmha=enable for KV reuse; Triton
  params kv_cache_free_gpu_mem_fraction, enable_kv_cache_reuse, exclude_input_in_output,
  gpu_device_ids); examples/lookahead/README.md (lookahead_decoding, max_draft_len formula, see
  config.LookaheadOptions); examples/medusa/README.md; examples/redrafter/README.md
  (explicit_draft_tokens). tensorrt_llm/builder.py (near 1.0) takes a Medusa checkpoint's
  max_draft_len when none is given and sets ReDrafter's to num_beams * draft_len_per_beam.
  EAGLE-3: examples/eagle/README.md says the TensorRT-engine path supports EAGLE-1 only, so
  EAGLE-3 runs in TRT-LLM's PyTorch backend through the LLM API
  (specdec/llmapi_engine.py): EagleDecodingConfig(max_draft_len, speculative_model_dir,
  eagle3_one_model) as used by examples/llm-api/quickstart_advanced.py near 1.0 (not confirmed
  at the tag itself).
- Launch: tensorrtllm_backend scripts/launch_triton_server.py (c2e65b8): several TRT-LLM models in
  one repository use orchestrator mode, `mpirun -n 1 tritonserver ...` with TRTLLM_ORCHESTRATOR=1
  and TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES=1 plus --pinned-memory-pool-byte-size=0
  --enable-peer-access=false --cuda-memory-pool-byte-size=<gpu>:0; the backend then spawns
  tp*pp workers per model itself.

Not confirmed (no GPU, no TensorRT-LLM here): whether the tensorrtllm backend answers a `stop`
request for an id it no longer holds without an error (the BLS releases every sequence; release
errors are only logged), and whether the 1.0 executor treats temperature 0 with top_k 0 as greedy
(maintainers recommend top_k 1 for greedy; the pass-through sends that).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specdec.build.vocabulary import vocabulary_mismatch
from specdec.config import IN_ENGINE_WEIGHTS, REPO_ROOT, ModelSource, Profile, ProfileError, TrtllmOptions
from specdec.contract import ENGINE_INPUTS, ENGINE_OUTPUTS
from specdec.progress import console

TRTLLM_VERSION = "1.0.0"
TRITON_IMAGE = "nvcr.io/nvidia/tritonserver:25.09-trtllm-python-py3"
TEMPLATES = REPO_ROOT / "model_repository" / "tensorrtllm"
EXAMPLES_ENV = "SPECDEC_TRTLLM_EXAMPLES"  # TRT-LLM's examples/ folder (the Dockerfile puts it here)
DEFAULT_EXAMPLES = "/opt/tensorrt_llm/examples"
EXECUTOR_WORKER = "/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker"
MARKER = ".specdec-step.json"

# The tensorrt_llm model's inputs and outputs (pinned config.pbtxt) that our contract uses.
PINNED_ENGINE_INPUTS = frozenset(
    [
        "input_ids",
        "input_lengths",
        "request_output_len",
        "draft_input_ids",
        "draft_logits",
        "end_id",
        "pad_id",
        "temperature",
        "runtime_top_k",
        "runtime_top_p",
        "seed",
        "return_generation_logits",
        "return_perf_metrics",
        "exclude_input_in_output",
        "streaming",
        "stop",
    ]
)
PINNED_ENGINE_OUTPUTS = frozenset(
    [
        "output_ids",
        "sequence_length",
        "generation_logits",
        "acceptance_rate",
        "total_accepted_draft_tokens",
        "total_draft_tokens",
    ]
)
# Flags as read in the pinned sources (module docstring); tests check every command against them.
TRTLLM_BUILD_FLAGS = frozenset(
    [
        "--checkpoint_dir",
        "--output_dir",
        "--max_batch_size",
        "--max_input_len",
        "--max_seq_len",
        "--max_num_tokens",
        "--gemm_plugin",
        "--kv_cache_type",
        "--use_paged_context_fmha",
        "--speculative_decoding_mode",
        "--max_draft_len",
        "--gather_generation_logits",
        "--workers",
    ]
)
SPECULATIVE_DECODING_MODES = frozenset(
    ["draft_tokens_external", "lookahead_decoding", "medusa", "explicit_draft_tokens", "eagle"]
)
DECODING_MODES = frozenset(
    ["top_k", "top_p", "top_k_top_p", "beam_search", "medusa", "redrafter", "lookahead", "eagle"]
)
CONVERT_FLAGS = {
    "models/core/llama/convert_checkpoint.py": frozenset(
        ["--model_dir", "--output_dir", "--dtype", "--tp_size", "--pp_size", "--workers"]
    ),
    "medusa/convert_checkpoint.py": frozenset(
        [
            "--model_dir",
            "--output_dir",
            "--dtype",
            "--tp_size",
            "--pp_size",
            "--workers",
            "--medusa_model_dir",
            "--num_medusa_heads",
            "--num_medusa_layers",
            "--max_medusa_token_len",
        ]
    ),
    "redrafter/convert_checkpoint.py": frozenset(
        [
            "--model_dir",
            "--output_dir",
            "--dtype",
            "--tp_size",
            "--workers",
            "--drafter_model_dir",
            "--redrafter_num_beams",
            "--redrafter_draft_len_per_beam",
        ]
    ),
}
TRITON_PARAMETERS = frozenset(
    [
        "FORCE_CPU_ONLY_INPUT_TENSORS",
        "gpt_model_type",
        "gpt_model_path",
        "max_beam_width",
        "kv_cache_free_gpu_mem_fraction",
        "enable_kv_cache_reuse",
        "exclude_input_in_output",
        "gpu_device_ids",
        "executor_worker_path",
        "decoding_mode",
        "medusa_choices",
        "lookahead_window_size",
        "lookahead_ngram_size",
        "lookahead_verification_set_size",
    ]
)

# mode -> (conversion script under examples/, trtllm-build --speculative_decoding_mode, Triton decoding_mode)
MODES: dict[str, tuple[str | None, str | None, str | None]] = {
    "draft_target": ("models/core/llama/convert_checkpoint.py", "draft_tokens_external", None),
    "ngram": ("models/core/llama/convert_checkpoint.py", "draft_tokens_external", None),
    "medusa": ("medusa/convert_checkpoint.py", "medusa", "medusa"),
    "lookahead": ("models/core/llama/convert_checkpoint.py", "lookahead_decoding", "lookahead"),
    "redrafter": ("redrafter/convert_checkpoint.py", "explicit_draft_tokens", "redrafter"),
    "eagle3": (None, None, None),  # PyTorch backend through the LLM API: no engine build
}
DRAFT_SCRIPT = "models/core/llama/convert_checkpoint.py"


class BuildError(RuntimeError):
    """A build step failed; the message carries the end of its log."""


@dataclass(frozen=True)
class Step:
    name: str
    argv: tuple[str, ...]
    output: Path

    def done(self) -> bool:
        marker = self.output / MARKER
        return marker.is_file() and json.loads(marker.read_text()) == {"argv": list(self.argv)}


def _trt(profile: Profile) -> TrtllmOptions:
    if profile.trtllm is None:
        raise ProfileError(f"profile {profile.name}: backend is not tensorrtllm")
    return profile.trtllm


def checkpoint_dir(profile: Profile, role: str) -> Path:
    return profile.build_path() / "checkpoints" / role


def engine_dir(profile: Profile, role: str) -> Path:
    return profile.build_path() / "engines" / role


def examples_dir() -> Path:
    return Path(os.environ.get(EXAMPLES_ENV, DEFAULT_EXAMPLES))


# --- the build plan -----------------------------------------------------------------------------------
def convert_argv(profile: Profile, role: str) -> tuple[str, ...]:
    trt = _trt(profile)
    placement = trt.target if role == "target" else trt.draft
    source = profile.target if role == "target" else profile.draft
    assert placement is not None and source is not None and source.hf_dir
    script = MODES[trt.mode][0] if role == "target" else DRAFT_SCRIPT
    assert script is not None
    argv = [
        "python3", str(examples_dir() / script),
        "--model_dir", source.hf_dir,
        "--output_dir", str(checkpoint_dir(profile, role)),
        "--dtype", profile.engine.dtype,
        "--tp_size", str(placement.tp_size),
    ]  # fmt: skip
    if trt.mode != "redrafter":  # its converter has no --pp_size (pipeline parallelism unsupported)
        argv += ["--pp_size", str(placement.pp_size)]
    if role == "target" and trt.medusa is not None:
        argv += [
            "--medusa_model_dir", _weights(trt.medusa.heads),
            "--num_medusa_heads", str(trt.medusa.num_heads),
            "--num_medusa_layers", str(trt.medusa.num_layers),
            "--max_medusa_token_len", str(trt.max_draft_len),
        ]  # fmt: skip
    if role == "target" and trt.redrafter is not None:
        argv += [
            "--drafter_model_dir", _weights(trt.redrafter.drafter),
            "--redrafter_num_beams", str(trt.redrafter.num_beams),
            "--redrafter_draft_len_per_beam", str(trt.redrafter.draft_len_per_beam),
        ]  # fmt: skip
    argv += ["--workers", str(placement.tp_size * placement.pp_size)]
    return tuple(argv)


def build_argv(profile: Profile, role: str) -> tuple[str, ...]:
    trt = _trt(profile)
    placement = trt.target if role == "target" else trt.draft
    assert placement is not None
    argv = [
        "trtllm-build",
        "--checkpoint_dir", str(checkpoint_dir(profile, role)),
        "--output_dir", str(engine_dir(profile, role)),
        "--max_batch_size", str(profile.engine.max_batch_size),
        "--max_input_len", str(trt.max_input_len),
        "--max_seq_len", str(profile.engine.max_seq_len),
        "--max_num_tokens", str(trt.max_num_tokens),
        "--gemm_plugin", profile.engine.dtype,
        "--kv_cache_type", "paged",
        "--use_paged_context_fmha", "enable" if trt.paged_context_fmha else "disable",
    ]  # fmt: skip
    spec_mode = MODES[trt.mode][1]
    if role == "target" and spec_mode is not None:
        argv += ["--speculative_decoding_mode", spec_mode]
        if trt.max_draft_len:  # ReDrafter sizes its drafts at conversion
            argv += ["--max_draft_len", str(trt.max_draft_len)]
    if role == "draft" and trt.draft_logits:
        argv.append("--gather_generation_logits")  # draft logits for exact sampled verification
    argv += ["--workers", str(placement.tp_size * placement.pp_size)]
    return tuple(argv)


def plan(profile: Profile) -> list[Step]:
    """Conversion and engine build for each engine of the profile, in order."""
    trt = _trt(profile)
    if MODES[trt.mode][0] is None:
        return []
    roles = ["target"] + (["draft"] if trt.draft is not None else [])
    steps = []
    for role in roles:
        steps.append(Step(f"convert {role} checkpoint", convert_argv(profile, role), checkpoint_dir(profile, role)))
        steps.append(Step(f"build {role} engine", build_argv(profile, role), engine_dir(profile, role)))
    return steps


# --- checks that need the files -------------------------------------------------------------------
def _weights(source: ModelSource) -> str:
    assert source.hf_dir is not None
    return source.hf_dir


def weight_sources(profile: Profile) -> dict[str, ModelSource]:
    """Every checkpoint the profile reads, by the key that names it."""
    trt = _trt(profile)
    sources = {"target": profile.target}
    if profile.draft is not None:
        sources["draft"] = profile.draft
    for mode, key in IN_ENGINE_WEIGHTS:
        section = getattr(trt, mode)
        if section is not None:
            sources[f"trtllm.{mode}.{key}"] = getattr(section, key)
    return sources


def file_problems(profile: Profile) -> list[str]:
    """What stops the build, each with what to do about it. Reads files; writes nothing."""
    problems = []
    for key, source in weight_sources(profile).items():
        path = Path(_weights(source))
        if not (path / "config.json").is_file():
            fetch = f"hf download {source.hf_repo} --local-dir {path}" if source.hf_repo else "put the checkpoint there"
            problems.append(f"{key}.hf_dir: no checkpoint at {path} (no config.json): {fetch}")
    if profile.draft is not None and not problems:
        mismatch = vocabulary_mismatch(Path(_weights(profile.target)), Path(_weights(profile.draft)))
        if mismatch:
            problems.append(f"draft: cannot draft for this target, {mismatch}: pick a draft of the same model family")
    scripts = {MODES[_trt(profile).mode][0]} | ({DRAFT_SCRIPT} if profile.draft is not None else set())
    for script in sorted(s for s in scripts if s):
        if not (examples_dir() / script).is_file():
            problems.append(
                f"{examples_dir() / script} not found: set {EXAMPLES_ENV} to TensorRT-LLM v{TRTLLM_VERSION}'s examples/"
            )
    return problems


# --- running the plan ---------------------------------------------------------------------------
def run_step(step: Step, log: Path, env: dict[str, str] | None = None) -> float:
    """Run one step into its log; raise BuildError with the log's tail if it fails."""
    log.parent.mkdir(parents=True, exist_ok=True)
    step.output.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(log, "wb") as out:
        code = subprocess.run(list(step.argv), stdout=out, stderr=subprocess.STDOUT, env=env).returncode
    if code != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        raise BuildError(f"{step.name} failed (exit {code}); log: {log}\n{tail}")
    (step.output / MARKER).write_text(json.dumps({"argv": list(step.argv)}))
    return time.monotonic() - start


def build_engines(profile: Profile, dry_run: bool = False) -> None:
    """Validate, then run the steps not done yet (resumable); with dry_run, print the exact
    commands and write nothing."""
    steps = plan(profile)
    problems = file_problems(profile)
    if dry_run:
        for problem in problems:
            print(f"# warning: {problem}")
        for i, step in enumerate(steps, 1):
            print(f"# [{i}/{len(steps)}] {step.name}{' (done)' if step.done() else ''}")
            print(shlex.join(step.argv))
        return
    if problems:
        raise ProfileError(f"{profile.name}: cannot build\n" + "\n".join(f"  {p}" for p in problems))
    logs = profile.build_path() / "logs"
    for i, step in enumerate(steps, 1):
        label = f"[{i}/{len(steps)}] {step.name}"
        if step.done():
            console.print(f"[green]✓[/] {label}: done before")
            continue
        log = logs / f"{step.name.replace(' ', '_')}.log"
        with console.status(f"{label} (log: {log})"):
            seconds = run_step(step, log)
        console.print(f"[green]✓[/] {label} in {seconds:.0f} s")


# --- the Triton models --------------------------------------------------------------------------
_TRITON_TYPES = {np.int32: "TYPE_INT32", np.float32: "TYPE_FP32", np.uint64: "TYPE_UINT64", np.bool_: "TYPE_BOOL"}
# Shapes as the pinned config declares them; scalars are [1] reshaped to [] for the backend.
_DIMS = {
    "input_ids": "[ -1 ]",
    "draft_input_ids": "[ -1 ]",
    "draft_logits": "[ -1, -1 ]",
    "output_ids": "[ -1, -1 ]",
    "sequence_length": "[ -1 ]",
    "generation_logits": "[ -1, -1, -1 ]",
}
_REQUIRED = ("input_ids", "input_lengths", "request_output_len")


def _tensor(name: str, dtype: type, output: bool) -> str:
    dims = _DIMS.get(name, "[ 1 ]")
    line = f'{{ name: "{name}" data_type: {_TRITON_TYPES[dtype]} dims: {dims}'
    if not output:
        if dims == "[ 1 ]":
            line += " reshape: { shape: [ ] }"
        if name not in _REQUIRED:
            line += " optional: true"
        if dims.startswith("[ -1"):
            line += " allow_ragged_batch: true"
    return line + " }"


def io_block() -> str:
    """The input/output declaration of an engine model, from the tensor contract."""
    ins = ",\n  ".join(_tensor(n, t, False) for n, t in ENGINE_INPUTS.items())
    outs = ",\n  ".join(_tensor(n, t, True) for n, t in ENGINE_OUTPUTS.items())
    return f"input [\n  {ins}\n]\noutput [\n  {outs}\n]"


def _pbtxt_string(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def parameters_block(params: dict[str, str]) -> str:
    return "\n".join(
        f'parameters {{ key: "{k}" value: {{ string_value: "{_pbtxt_string(v)}" }} }}' for k, v in params.items()
    )


def triton_parameters(profile: Profile, role: str) -> dict[str, str]:
    """The tensorrt_llm model's parameters for one engine (names: TRITON_PARAMETERS)."""
    trt = _trt(profile)
    placement = trt.target if role == "target" else trt.draft
    assert placement is not None
    params = {
        "FORCE_CPU_ONLY_INPUT_TENSORS": "no",
        "gpt_model_type": "inflight_fused_batching",
        "gpt_model_path": str(engine_dir(profile, role)),
        "max_beam_width": "1",
        "kv_cache_free_gpu_mem_fraction": f"{placement.kv_cache_free_gpu_mem_fraction:g}",
        "enable_kv_cache_reuse": "true" if trt.kv_cache_reuse else "false",
        "exclude_input_in_output": "true",
        "gpu_device_ids": ",".join(str(g) for g in placement.gpu_ids),
        "executor_worker_path": EXECUTOR_WORKER,
    }
    decoding_mode = MODES[trt.mode][2]
    if role == "target" and decoding_mode:
        params["decoding_mode"] = decoding_mode
    if role == "target" and trt.medusa is not None:
        params["medusa_choices"] = ", ".join("{" + ", ".join(map(str, path)) + "}" for path in trt.medusa.choices)
    if role == "target" and trt.lookahead is not None:
        params["lookahead_window_size"] = str(trt.lookahead.window_size)
        params["lookahead_ngram_size"] = str(trt.lookahead.ngram_size)
        params["lookahead_verification_set_size"] = str(trt.lookahead.verification_set_size)
    return params


def llm_options(profile: Profile) -> dict:
    """Keyword arguments for the LLM API engine (EAGLE-3), see specdec/llmapi_engine.py."""
    trt = _trt(profile)
    assert trt.eagle3 is not None
    return {
        "model": _weights(profile.target),
        "tensor_parallel_size": trt.target.tp_size,
        "pipeline_parallel_size": trt.target.pp_size,
        "max_batch_size": profile.engine.max_batch_size,
        "max_seq_len": profile.engine.max_seq_len,
        "max_num_tokens": trt.max_num_tokens,
        "kv_cache_config": {
            "free_gpu_memory_fraction": trt.target.kv_cache_free_gpu_mem_fraction,
            "enable_block_reuse": trt.kv_cache_reuse,
        },
        "speculative_config": {
            "max_draft_len": trt.max_draft_len,
            "speculative_model_dir": _weights(trt.eagle3.draft),
            "eagle3_one_model": trt.eagle3.one_model,
        },
        "gpu_ids": trt.target.gpu_ids,
    }


def engine_models(profile: Profile) -> dict[str, tuple[Path, dict[str, object]]]:
    """The profile's engine models: name -> (template folder, placeholder values)."""
    trt = _trt(profile)
    common = {
        "max_batch_size": profile.engine.max_batch_size,
        "max_queue_delay_us": profile.engine.max_queue_delay_us,
        "max_queue_size": profile.server.max_queue + profile.server.max_inflight,
        "io": io_block(),
    }
    if trt.mode == "eagle3":
        options = json.dumps(llm_options(profile))
        return {"target": (TEMPLATES / "llmapi_engine", {**common, "llm_options": _pbtxt_string(options)})}
    roles = ["target"] + (["draft"] if trt.draft is not None else [])
    return {
        role: (
            TEMPLATES / "engine",
            {**common, "model_name": role, "parameters": parameters_block(triton_parameters(profile, role))},
        )
        for role in roles
    }


# --- launch -------------------------------------------------------------------------------------
def launch_command(profile: Profile, server_argv: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """Wrap a tritonserver command line for the profile: one MPI rank; with tensorrtllm-backend
    models in orchestrator mode, so the backend spawns the tp*pp workers of each engine itself."""
    trt = _trt(profile)
    env = dict(env)
    argv = ["mpirun", "-n", "1", *server_argv]
    if trt.mode != "eagle3":
        env |= {"TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1"}
        gpus = sorted({g for p in (trt.target, trt.draft) if p for g in p.gpu_ids})
        argv += ["--pinned-memory-pool-byte-size=0", "--enable-peer-access=false"]
        argv += [f"--cuda-memory-pool-byte-size={g}:0" for g in gpus]
    return argv, env
