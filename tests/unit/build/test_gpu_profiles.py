"""The GPU profiles load, state what a deployment needs, and every validation rule refuses a
broken profile with a message that names the key and says what to do."""

from __future__ import annotations

import json

import pytest
import yaml
from support.trtllm import GPU_PROFILES, profile_data, profile_file, tiny_checkpoint, with_tiny_weights

from specdec.build.trtllm import file_problems
from specdec.config import ProfileError, load_profile, parse_profile


@pytest.mark.parametrize("name", GPU_PROFILES)
def test_gpu_profile_states_its_deployment(name):
    profile = load_profile(profile_file(name))
    assert profile.engine.device == "cuda"
    assert profile.engine.dtype in ("bfloat16", "float16")  # Vicuna's examples upstream: float16
    assert profile.engine.max_batch_size >= 1 and profile.engine.max_seq_len >= 2048  # Vicuna-7B: 2048
    assert profile.speculation.proposer in ("draft_model", "ngram", "none")
    raw = profile_data(name)  # stated in the file, not left to defaults
    assert {"dtype", "max_batch_size", "max_seq_len"} <= raw["engine"].keys()
    assert raw["server"]["ready_timeout_s"] >= 1800  # a first load of a 7-8B model takes minutes
    assert {"proposer", "num_draft_tokens"} <= raw["speculation"].keys()
    if profile.backend == "tensorrtllm":
        assert {"mode", "max_num_tokens", "max_draft_len"} <= raw["trtllm"].keys()
        assert "max_input_len" in raw["trtllm"] or profile.trtllm.mode == "eagle3"  # no engine build
        for role in ("target", "draft"):
            if role in raw["trtllm"]:
                assert {"tp_size", "pp_size", "gpu_ids", "kv_cache_free_gpu_mem_fraction"} <= raw["trtllm"][role].keys()


def test_the_issue_profiles_are_all_there():
    modes = {load_profile(profile_file(n)).trtllm.mode for n in GPU_PROFILES if n != "pytorch-cuda"}
    assert modes == {"draft_target", "ngram", "eagle3", "medusa", "lookahead", "redrafter"}
    eagle = load_profile(profile_file("eagle3")).trtllm.eagle3
    assert eagle.draft.hf_repo == "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
    medusa = load_profile(profile_file("medusa"))  # the family upstream supports Medusa for, with published heads
    assert (medusa.target.hf_repo, medusa.trtllm.medusa.heads.hf_repo) == (
        "lmsys/vicuna-7b-v1.3",
        "FasterDecoding/medusa-vicuna-7b-v1.3",
    )
    assert load_profile(profile_file("redrafter")).target.hf_repo == "lmsys/vicuna-7b-v1.3"
    draft_target = load_profile(profile_file("draft-target"))
    assert draft_target.target.hf_repo == "meta-llama/Llama-3.1-8B-Instruct"
    assert draft_target.draft.hf_repo == "meta-llama/Llama-3.2-1B-Instruct"


def _broken(name: str, change) -> str:
    data = json.loads(json.dumps(profile_data(name)))
    change(data)
    with pytest.raises(ProfileError) as err:
        parse_profile(data, name)
    return str(err.value)


def _set(path: str, value):
    def change(data):
        *parents, last = path.split(".")
        node = data
        for key in parents:
            node = node[key]
        node[last] = value

    return change


@pytest.mark.parametrize(
    ("name", "key", "value", "expected"),
    [
        # max_draft_len must cover the largest draft a request may ask
        ("draft-target", "trtllm.max_draft_len", 4, "must cover speculation.max_draft_tokens (8)"),
        ("ngram", "speculation.max_draft_tokens", 16, "trtllm.max_draft_len (8) must cover"),
        # KV cache reuse needs paged context FMHA
        ("draft-target", "trtllm.paged_context_fmha", False, "kv_cache_reuse needs paged_context_fmha: true"),
        # memory fractions of engines sharing a GPU sum to at most 1
        ("draft-target", "trtllm.draft.kv_cache_free_gpu_mem_fraction", 0.5, "add up to 1.1"),
        # tp * pp matches the GPUs named
        ("draft-target", "trtllm.target.tp_size", 2, "tp_size * pp_size = 2 GPUs, but gpu_ids names 1"),
        ("ngram", "trtllm.target.gpu_ids", [0, 0], "names a GPU twice"),
        # in-engine modes take no separate draft
        ("medusa", "draft", {"hf_dir": "/models/Llama-3.2-1B-Instruct"}, "medusa takes no separate `draft` model"),
        ("eagle3", "speculation.proposer", "ngram", "drafts inside the engine: set speculation.proposer: none"),
        # mode-specific shapes
        ("lookahead", "trtllm.max_draft_len", 20, "max_draft_len must be 23 for lookahead"),
        ("medusa", "trtllm.max_draft_len", 8, "must cover the 15 nodes of medusa.choices"),
        ("medusa", "trtllm.medusa.choices", [[0], [1, 0, 0]], "the parents of [[1, 0, 0]] are missing"),
        ("redrafter", "trtllm.target", {"pp_size": 2, "gpu_ids": [0, 1]}, "redrafter: pp_size must be 1"),
        ("draft-target", "engine.device", "cpu", "set engine.device: cuda"),
        (
            "ngram",
            "trtllm.mode",
            "draft_target",
            "give `draft` (its GPUs and memory) exactly when mode is draft_target",
        ),
    ],
)
def test_each_rule_names_the_key(name, key, value, expected):
    assert expected in _broken(name, _set(key, value))


def test_fractions_on_separate_gpus_are_independent():
    data = profile_data("draft-target")
    data["trtllm"]["draft"] |= {"gpu_ids": [1], "kv_cache_free_gpu_mem_fraction": 0.9}
    data["trtllm"]["target"]["kv_cache_free_gpu_mem_fraction"] = 0.9
    assert parse_profile(data).trtllm.draft.gpu_ids == [1]


def test_a_lookahead_section_without_lookahead_mode_is_refused():
    message = _broken("ngram", _set("trtllm.lookahead", {"window_size": 2}))
    assert "`lookahead` section exactly when mode is lookahead (mode is ngram)" in message


def test_trtllm_section_needs_the_tensorrtllm_backend():
    message = _broken("pytorch-cuda", _set("trtllm", profile_data("ngram")["trtllm"]))
    assert "`trtllm` section exactly when backend is tensorrtllm" in message


def test_tokenizers_must_match(tmp_path):
    data = with_tiny_weights(profile_data("draft-target"), tmp_path)
    tiny_checkpoint(tmp_path / "draft", first_word="x", seed=1)  # same size, other vocabulary
    problems = file_problems(parse_profile(data))
    assert any(p.startswith("draft: cannot draft for this target, their tokenizers differ") for p in problems)


def test_missing_weights_say_where_to_get_them(tmp_path):
    problems = file_problems(load_profile(profile_file("eagle3")))
    assert any(
        p.startswith("trtllm.eagle3.draft.hf_dir: no checkpoint at /models/EAGLE3-LLaMA3.1-Instruct-8B")
        and "hf download yuhuili/EAGLE3-LLaMA3.1-Instruct-8B" in p
        for p in problems
    )


def test_matching_tiny_checkpoints_pass(tmp_path, monkeypatch):
    examples = tmp_path / "examples" / "models/core/llama"
    examples.mkdir(parents=True)
    (examples / "convert_checkpoint.py").touch()
    monkeypatch.setenv("SPECDEC_TRTLLM_EXAMPLES", str(tmp_path / "examples"))
    assert file_problems(parse_profile(with_tiny_weights(profile_data("draft-target"), tmp_path))) == []


def test_relative_weight_dirs_are_relative_to_the_profile(tmp_path):
    data = profile_data("medusa")
    data["target"]["hf_dir"], data["trtllm"]["medusa"]["heads"]["hf_dir"] = "weights/base", "weights/heads"
    (tmp_path / "medusa.yaml").write_text(yaml.safe_dump(data))
    profile = load_profile(tmp_path / "medusa.yaml")
    assert profile.target.hf_dir == str(tmp_path / "weights/base")
    assert profile.trtllm.medusa.heads.hf_dir == str(tmp_path / "weights/heads")


def _medusa_on(tmp_path, **config) -> list[str]:
    data = with_tiny_weights(profile_data("medusa"), tmp_path)
    path = tmp_path / "target" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    return file_problems(parse_profile(data))


def test_medusa_refuses_a_llama3_target_naming_the_limitation(tmp_path):
    """TensorRT-LLM 1.0's Medusa converter keeps only rope_scaling's type (upstream.CONVERTERS):
    a Llama-3.1 target would be converted with the wrong RoPE."""
    llama31 = {"rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}
    (problem,) = [p for p in _medusa_on(tmp_path / "llama3", **llama31) if p.startswith("target.hf_dir")]
    assert "Medusa supports Vicuna (Llama) targets only" in problem and "drops its factor" in problem
    assert "examples/medusa/convert_checkpoint.py" in problem
    assert not [p for p in _medusa_on(tmp_path / "vicuna") if p.startswith("target.hf_dir")]
