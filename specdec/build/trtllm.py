"""TensorRT-LLM: the commands that build a profile's engines, their Triton models, and the launch.

Every flag, script, parameter and tensor name used here is a fact of the upstream record
(specdec/build/upstream.py), which says where in TensorRT-LLM 1.0.0 and its Triton backend it was
read; the tests check the commands and the rendered configs against that record.

Not confirmed (no GPU, no TensorRT-LLM here): whether the 1.0 executor treats temperature 0 with
top_k 0 as greedy (maintainers recommend top_k 1 for greedy; spec_decode sends that).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from specdec.build import upstream
from specdec.build.upstream import (
    CONVERTERS,
    EXECUTOR_WORKER,
    LLAMA_CONVERTER,
    MODES,
    REDRAFTER_CONVERTER,
    TRITON_IMAGE,
    TRTLLM_VERSION,
)
from specdec.build.vocabulary import vocabulary_mismatch
from specdec.config import IN_ENGINE_WEIGHTS, REPO_ROOT, ModelSource, Profile, ProfileError, TrtllmOptions
from specdec.contract import ENGINE_INPUTS, ENGINE_OUTPUTS
from specdec.progress import console

__all__ = ["TRITON_IMAGE", "TRTLLM_VERSION"]

TEMPLATES = REPO_ROOT / "model_repository" / "tensorrtllm"
EXAMPLES_ENV = "SPECDEC_TRTLLM_EXAMPLES"  # TRT-LLM's examples/ folder (the Dockerfile puts it here)
DEFAULT_EXAMPLES = "/opt/tensorrt_llm/examples"
MARKER = ".specdec-step.json"
LOGITS_DTYPE = "float32"  # trtllm-build --logits_dtype where logits leave an engine; the configs declare TYPE_FP32


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
def _converter(script: str, model: str, output: Path, dtype: str, tp_size: int, pp_size: int | None) -> list[str]:
    """A convert_checkpoint.py command's common part; pp_size None for a converter without --pp_size."""
    source = "--base_model_checkpoint_dir" if script == REDRAFTER_CONVERTER else "--model_dir"
    argv = [
        "python3", str(examples_dir() / script), source, model, "--output_dir", str(output),
        "--dtype", dtype, "--tp_size", str(tp_size),
    ]  # fmt: skip
    return argv if pp_size is None else [*argv, "--pp_size", str(pp_size)]


def convert_steps(profile: Profile, role: str) -> list[Step]:
    """The conversion of one engine's checkpoint: the Llama converter, or the mode's. ReDrafter's
    converter (TensorRT-LLM 1.0) takes the base model already converted, so it is two steps."""
    trt = _trt(profile)
    placement = trt.target if role == "target" else trt.draft
    source = profile.target if role == "target" else profile.draft
    assert placement is not None and source is not None and source.hf_dir
    dtype, tp, pp = profile.engine.dtype, placement.tp_size, placement.pp_size
    workers = tp * pp
    out = checkpoint_dir(profile, role)
    script = (MODES[trt.mode].converter if role == "target" else None) or LLAMA_CONVERTER
    if script == REDRAFTER_CONVERTER:
        assert trt.redrafter is not None
        base = checkpoint_dir(profile, f"{role}-base")
        base_argv = [*_converter(LLAMA_CONVERTER, source.hf_dir, base, dtype, tp, pp), "--workers", str(workers)]
        argv = [
            *_converter(REDRAFTER_CONVERTER, str(base), out, dtype, tp, None),
            "--drafter_model_dir", _weights(trt.redrafter.drafter),
            "--redrafter_num_beams", str(trt.redrafter.num_beams),
            "--redrafter_draft_len_per_beam", str(trt.redrafter.draft_len_per_beam),
            "--workers", str(workers),
        ]  # fmt: skip
        return [
            Step(f"convert {role} base checkpoint", tuple(base_argv), base),
            Step(f"convert {role} checkpoint", tuple(argv), out),
        ]
    argv = _converter(script, source.hf_dir, out, dtype, tp, pp)
    if script == upstream.MEDUSA_CONVERTER:
        assert trt.medusa is not None
        argv += [
            "--medusa_model_dir", _weights(trt.medusa.heads),
            "--num_medusa_heads", str(trt.medusa.num_heads),
            "--num_medusa_layers", str(trt.medusa.num_layers),
            "--max_medusa_token_len", str(trt.max_draft_len),
        ]  # fmt: skip
    argv += ["--workers", str(workers)]
    return [Step(f"convert {role} checkpoint", tuple(argv), out)]


def logits_leave(profile: Profile) -> bool:
    """Whether generation logits travel between this profile's engines: the draft's, verified
    against by the target (draft-target with draft_logits)."""
    trt = _trt(profile)
    return trt.mode == "draft_target" and trt.draft_logits


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
    spec_mode = MODES[trt.mode].build_mode
    if role == "target" and spec_mode is not None:
        argv += ["--speculative_decoding_mode", spec_mode]
        if trt.max_draft_len:  # ReDrafter sizes its drafts at conversion
            argv += ["--max_draft_len", str(trt.max_draft_len)]
    if logits_leave(profile):
        # the draft returns its logits for exact sampled verification (its config declares them
        # FP32, and the backend fails a response whose logits have another dtype)
        if role == "draft":
            argv.append("--gather_generation_logits")
        argv += ["--logits_dtype", LOGITS_DTYPE]
    argv += ["--workers", str(placement.tp_size * placement.pp_size)]
    return tuple(argv)


def plan(profile: Profile) -> list[Step]:
    """Conversion and engine build for each engine of the profile, in order."""
    trt = _trt(profile)
    if MODES[trt.mode].build_mode is None:
        return []  # the LLM API loads the checkpoints itself
    roles = ["target"] + (["draft"] if trt.draft is not None else [])
    steps = []
    for role in roles:
        steps += convert_steps(profile, role)
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
    if not problems:
        problems += family_problems(profile)
    scripts = {Path(step.argv[1]).relative_to(examples_dir()) for step in plan(profile) if step.argv[0] == "python3"}
    for script in sorted(scripts):
        if not (examples_dir() / script).is_file():
            problems.append(
                f"{examples_dir() / script} not found: set {EXAMPLES_ENV} to TensorRT-LLM v{TRTLLM_VERSION}'s examples/"
            )
    return problems


def family_problems(profile: Profile) -> list[str]:
    """Targets that TensorRT-LLM 1.0's converter for the mode would convert wrongly, or that
    upstream does not support for it (upstream.CONVERTERS)."""
    trt = _trt(profile)
    if trt.mode != "medusa":
        return []
    config = json.loads((Path(_weights(profile.target)) / "config.json").read_text())
    converter = CONVERTERS[upstream.MEDUSA_CONVERTER]
    if config.get("rope_scaling") or config.get("model_type") != "llama":
        return [
            f"target.hf_dir: {profile.target.hf_dir} is a {config.get('model_type')} model with rope_scaling "
            f"{config.get('rope_scaling')}: TensorRT-LLM {TRTLLM_VERSION}'s Medusa supports Vicuna (Llama) targets "
            f"only ({converter.families_where}), and its converter keeps rope_scaling's type and drops its factor "
            f"({converter.where}); serve Llama-3.x with EAGLE-3, draft-target, n-gram or lookahead instead"
        ]
    return []


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
def engine_outputs(profile: Profile) -> list[str]:
    """The outputs a tensorrt_llm model must declare: every output the backend can write into a
    response to spec_decode's requests (upstream.outputs_written), which ask for the contract's
    outputs and, for in-engine speculation, set return_perf_metrics."""
    asked = [name for name in ENGINE_OUTPUTS if name in upstream.ENGINE_OUTPUTS]
    written = upstream.outputs_written(asked, return_perf_metrics=not _trt(profile).external)
    return [name for name in upstream.ENGINE_OUTPUTS if name in written]


def _dtype(tensor: upstream.Tensor) -> str:
    return "TYPE_FP32" if tensor.dtype == upstream.LOGITS_DATATYPE else tensor.dtype  # LOGITS_DTYPE's


def _declaration(name: str, tensor: upstream.Tensor, output: bool) -> str:
    """One tensor as upstream's tensorrt_llm/config.pbtxt declares it."""
    line = f'{{ name: "{name}" data_type: {_dtype(tensor)} dims: [ {", ".join(map(str, tensor.dims))} ]'
    if not output:
        line += " reshape: { shape: [ ] }" if tensor.reshape else ""
        line += " optional: true" if tensor.optional else ""
        line += " allow_ragged_batch: true" if tensor.ragged else ""
    return line + " }"


def io_block(profile: Profile) -> str:
    """The input/output declaration of an engine model: the inputs spec_decode sends and the
    outputs their responses can carry, each declared as upstream declares it."""
    ins = ",\n  ".join(_declaration(n, upstream.ENGINE_INPUTS[n], False) for n in ENGINE_INPUTS)
    outs = ",\n  ".join(_declaration(n, upstream.ENGINE_OUTPUTS[n].declared, True) for n in engine_outputs(profile))
    return f"input [\n  {ins}\n]\noutput [\n  {outs}\n]"


def _pbtxt_string(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def parameters_block(params: dict[str, str]) -> str:
    return "\n".join(
        f'parameters {{ key: "{k}" value: {{ string_value: "{_pbtxt_string(v)}" }} }}' for k, v in params.items()
    )


def triton_parameters(profile: Profile, role: str) -> dict[str, str]:
    """The tensorrt_llm model's parameters for one engine (upstream.BACKEND_PARAMETERS): every
    one the backend requires, and those the profile sets."""
    trt = _trt(profile)
    placement = trt.target if role == "target" else trt.draft
    assert placement is not None
    params = {
        "gpt_model_type": "inflight_fused_batching",
        "gpt_model_path": str(engine_dir(profile, role)),
        "max_beam_width": "1",
        "kv_cache_free_gpu_mem_fraction": f"{placement.kv_cache_free_gpu_mem_fraction:g}",
        "enable_kv_cache_reuse": "true" if trt.kv_cache_reuse else "false",
        "exclude_input_in_output": "true",
        "gpu_device_ids": ",".join(str(g) for g in placement.gpu_ids),
        "executor_worker_path": EXECUTOR_WORKER,
        # read unguarded at load; empty: no guided decoding (the C++ runtime needs no tokenizer)
        "tokenizer_dir": "",
        "xgrammar_tokenizer_info_path": "",
        "guided_decoding_backend": "",
    }
    decoding_mode = MODES[trt.mode].decoding_mode
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
    """Keyword arguments for the LLM API engine (EAGLE-3), see specdec/triton/llmapi.py."""
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
        "io": io_block(profile),
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
    models in orchestrator mode, so the backend spawns the tp*pp workers of each engine itself.
    A target on several nodes runs in leader mode instead (leader_command), its group from env."""
    trt = _trt(profile)
    if trt.target.nodes > 1:
        return leader_command(profile, server_argv, env)
    env = dict(env)
    argv = ["mpirun", "-n", "1", *server_argv]
    if trt.mode != "eagle3":
        env |= {"TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1"}
        gpus = sorted({g for p in (trt.target, trt.draft) if p for g in p.gpu_ids})
        argv += ["--pinned-memory-pool-byte-size=0", "--enable-peer-access=false"]
        argv += [f"--cuda-memory-pool-byte-size={g}:0" for g in gpus]
    return argv, env


# --- leader mode: a target over the nodes of a LeaderWorkerSet group ------------------------------
RSH_AGENT_ENV = "SPECDEC_MPI_RSH_AGENT"  # how mpirun reaches the other pods; unset: its default (ssh)


@dataclass(frozen=True)
class Group:
    """The pods of one LeaderWorkerSet group, named as LWS names them: the leader <lws>-<group>
    (the first label of LWS_LEADER_ADDRESS), its workers <leader>-1 .. <leader>-<size-1>
    (upstream.LWS_POD_NAMES_WHERE). A pod's hostname is its name, so mpirun, given these, starts
    the leader's ranks locally and reaches the others through its rsh agent."""

    leader: str
    size: int

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Group:
        """The group of the pod whose environment LWS filled (upstream.LWS_ENV_WHERE)."""
        address, size = env.get(upstream.LWS_LEADER_ADDRESS), env.get(upstream.LWS_GROUP_SIZE)
        if not address or not size or not size.isdigit() or int(size) < 1:
            raise ProfileError(
                f"leader mode runs in a LeaderWorkerSet's leader pod: {upstream.LWS_LEADER_ADDRESS}={address!r} and "
                f"{upstream.LWS_GROUP_SIZE}={size!r} are not a group (deploy/kubernetes/overlays/gpu-multinode)"
            )
        return cls(address.split(".", 1)[0], int(size))

    def hosts(self) -> list[str]:
        """The group's pods, leader first: the order of the ranks, node by node."""
        return [self.leader, *(f"{self.leader}-{i}" for i in range(1, self.size))]


def _rank_argv(server_argv: list[str], rank: int, engines: list[str]) -> list[str]:
    """One rank's tritonserver (upstream.LEADER_RANK_WHERE): rank 0 the server as specdec serve
    runs it; the others load only the engine models, in explicit control (LEADER_WORKER_WHERE);
    every rank with its own shared-memory prefix (LEADER_RANK_FLAGS_WHERE)."""
    argv = list(server_argv)
    if rank:
        argv = [a for a in argv if not a.startswith("--model-control-mode=")]
        argv += [*upstream.LEADER_WORKER_FLAGS, *(upstream.LEADER_LOAD_MODEL.format(name) for name in engines)]
    argv += [flag.format(rank) for flag in upstream.LEADER_RANK_FLAGS if flag.format(rank) not in argv]
    return argv


def leader_command(
    profile: Profile, server_argv: list[str], env: Mapping[str, str]
) -> tuple[list[str], dict[str, str]]:
    """The argv and environment the leader pod of a LeaderWorkerSet group runs for a target on
    target.nodes nodes: one mpirun over the group's pods, gpus_per_node slots each, one
    tritonserver per rank of the target engine (tp_size * pp_size), rank 0 serving and the others
    executing (TensorRT-LLM's leader mode, upstream.LEADER_MODE_DOC_WHERE). The orchestrator's
    variables are removed: set, they would switch the backend out of leader mode. A pure function
    of its arguments; raises ProfileError when env is not a group of target.nodes pods."""
    trt = _trt(profile)
    placement = trt.target
    group = Group.from_env(env)
    if group.size != placement.nodes:
        raise ProfileError(
            f"{profile.name}: target.nodes is {placement.nodes} but the LeaderWorkerSet group has {group.size} pods: "
            "set the LeaderWorkerSet's size to target.nodes"
        )
    engines = [name for name, (template, _) in engine_models(profile).items() if template.name == "engine"]
    argv = list(upstream.LEADER_MPIRUN)
    if env.get(RSH_AGENT_ENV):
        argv += [*upstream.MPI_RSH_AGENT_PARAM, env[RSH_AGENT_ENV]]
    argv += ["--host", ",".join(f"{host}:{placement.gpus_per_node}" for host in group.hosts())]
    for rank in range(placement.tp_size * placement.pp_size):
        argv += [":"] if rank else []
        argv += ["-n", "1", *_rank_argv(server_argv, rank, engines)]
    environment = {k: v for k, v in env.items() if k not in upstream.ORCHESTRATOR_ENV}
    return argv, environment
