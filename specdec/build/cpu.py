"""The PyTorch-engine build: weights for the target and the draft, in Hugging Face layout.

gguf source  -> dequantized once into build/<profile>/models/<role> (cached, see _fingerprint)
hf_dir       -> used in place
num_layers   -> a truncated copy (the first N decoder layers + final norm + lm_head): a draft
                that shares the target's tokenizer by construction
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from safetensors.numpy import load_file, save_file

from specdec.build.gguf_convert import convert_gguf, locate_gguf
from specdec.build.vocabulary import vocabulary_mismatch
from specdec.config import ModelSource, Profile, ProfileError
from specdec.progress import console

MARKER = ".specdec-source.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


def _fingerprint(role: str, source: ModelSource) -> dict:
    """What a conversion was made from; refuses (naming the profile key) when the weights are missing."""
    if source.gguf_package:
        try:
            path = locate_gguf(source.gguf_package, source.gguf_file or "")
        except FileNotFoundError as err:
            raise ProfileError(f"{role}.gguf_file: {err}") from None
        stat = path.stat()
        return {"gguf": str(path), "size": stat.st_size, "mtime": int(stat.st_mtime), "num_layers": source.num_layers}
    if not (Path(source.hf_dir or "") / "config.json").is_file():
        raise ProfileError(f"{role}.hf_dir: no Hugging Face checkpoint at {source.hf_dir} (no config.json)")
    return {"hf_dir": source.hf_dir, "num_layers": source.num_layers}


def _is_built(dest: Path, fingerprint: dict) -> bool:
    marker = dest / MARKER
    return marker.is_file() and json.loads(marker.read_text()) == fingerprint


def truncate_layers(src: Path, dest: Path, num_layers: int) -> None:
    """Copy a Llama checkpoint keeping its first num_layers decoder layers."""
    config = json.loads((src / "config.json").read_text())
    if num_layers > config["num_hidden_layers"]:
        raise ValueError(f"num_layers {num_layers} exceeds the {config['num_hidden_layers']} layers of {src}")
    kept = {}
    for f in sorted(src.glob("*.safetensors")):
        for name, tensor in load_file(str(f)).items():
            if name.startswith("model.layers.") and int(name.split(".")[2]) >= num_layers:
                continue
            kept[name] = tensor
    dest.mkdir(parents=True, exist_ok=True)
    save_file(kept, str(dest / "model.safetensors"), metadata={"format": "pt"})
    config["num_hidden_layers"] = num_layers
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dest / name)


def build_role(profile: Profile, role: str, source: ModelSource, reuse: dict[str, Path]) -> Path:
    """Materialize one model; `reuse` maps full (untruncated) conversions done in this build."""
    dest = profile.model_dir(role)
    fingerprint = _fingerprint(role, source)
    if source.hf_dir and not source.num_layers:
        return dest  # used in place
    full_key = json.dumps({**fingerprint, "num_layers": None}, sort_keys=True)
    if _is_built(dest, fingerprint):
        console.print(f"[green]✓[/] {role}: up to date ({dest})")
    else:
        if dest.exists():
            shutil.rmtree(dest)
        if source.hf_dir:
            full = Path(source.hf_dir)
        elif full_key in reuse:
            full = reuse[full_key]
        else:
            full = dest if not source.num_layers else dest.with_name(dest.name + "-full")
            console.print(f"{role}: converting {fingerprint['gguf']}")
            convert_gguf(Path(fingerprint["gguf"]), full)
        if source.num_layers:
            console.print(f"{role}: keeping the first {source.num_layers} layers")
            truncate_layers(full, dest, source.num_layers)
            if full.name.endswith("-full"):
                shutil.rmtree(full)
        (dest / MARKER).write_text(json.dumps(fingerprint))
    if not source.num_layers:
        reuse[full_key] = dest
    return dest


def build_models(profile: Profile) -> dict[str, Path]:
    reuse: dict[str, Path] = {}
    dirs = {"target": build_role(profile, "target", profile.target, reuse)}
    if profile.draft is not None:
        dirs["draft"] = build_role(profile, "draft", profile.draft, reuse)
        mismatch = vocabulary_mismatch(dirs["target"], dirs["draft"])
        if mismatch:
            raise ProfileError(f"draft: cannot draft for this target, {mismatch}; a draft needs the target's tokenizer")
    return dirs
