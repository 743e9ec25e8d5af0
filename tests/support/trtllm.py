"""Tiny stand-ins for the GPU profiles' checkpoints: a random Llama with its own word-level
tokenizer (made here, nothing downloaded), and the repository's GPU profiles pointed at them."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from tokenizers import Tokenizer, models, pre_tokenizers

from specdec.config import CONFIGS_DIR, IN_ENGINE_WEIGHTS, Profile, parse_profile
from support.models import TINY, write_tiny_llama

GPU_PROFILES = ("draft-target", "ngram", "eagle3", "medusa", "lookahead", "redrafter", "pytorch-cuda")
TRT_PROFILES = tuple(n for n in GPU_PROFILES if n != "pytorch-cuda")  # backend tensorrtllm


def profile_file(name: str) -> Path:
    """configs/<model>-<name>.yaml"""
    (path,) = CONFIGS_DIR.glob(f"*-{name}.yaml")
    return path


def profile_data(name: str) -> dict:
    return yaml.safe_load(profile_file(name).read_text())


def write_tokenizer(path: Path, vocab_size: int = TINY["vocab_size"], first_word: str = "w") -> Path:
    """A word-level tokenizer: "<unk>", "</s>", then words first_word0, first_word1, ..."""
    vocab = {"<unk>": 0, "</s>": 1} | {f"{first_word}{i}": i for i in range(2, vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    return path


def tiny_checkpoint(path: Path, first_word: str = "w", **overrides) -> Path:
    write_tiny_llama(path, **overrides)
    return write_tokenizer(path, first_word=first_word)


def with_tiny_weights(data: dict, root: Path) -> dict:
    """The profile with every checkpoint (target, draft, in-engine heads) a tiny one under root,
    and its build under root/build."""
    data = json.loads(json.dumps(data))
    data["target"]["hf_dir"] = str(tiny_checkpoint(root / "target"))
    if "draft" in data:
        data["draft"]["hf_dir"] = str(tiny_checkpoint(root / "draft", seed=1, num_hidden_layers=1))
    for mode, key in IN_ENGINE_WEIGHTS:
        section = data.get("trtllm", {}).get(mode)
        if section:
            section[key]["hf_dir"] = str(write_tiny_llama(root / key))
    data["build_dir"] = str(root / "build")
    return data


def tiny_profile(name: str, root: Path) -> Profile:
    return parse_profile(with_tiny_weights(profile_data(name), root), name)
