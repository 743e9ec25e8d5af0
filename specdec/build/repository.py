"""Render model_repository/ templates into a profile's build folder.

Templates use ${name} placeholders (as NVIDIA's fill_template.py does); every placeholder must
be given a value, so a template and its renderer cannot drift apart silently.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from string import Template

from specdec.config import REPO_ROOT, Profile
from specdec.speculation.controller import calibration_cache_dir, calibration_path

TEMPLATES = REPO_ROOT / "model_repository"


def render_file(template: Path, values: dict[str, object]) -> str:
    try:
        return Template(template.read_text()).substitute({k: str(v) for k, v in values.items()})
    except KeyError as err:
        raise KeyError(f"{template}: no value for placeholder {err}") from None


def copy_model(template_dir: Path, dest: Path, values: dict[str, object]) -> None:
    """Copy a model folder, rendering its config.pbtxt."""
    shutil.copytree(template_dir, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (dest / "config.pbtxt").write_text(render_file(template_dir / "config.pbtxt", values))


def resolved_profile_path(profile: Profile) -> Path:
    return profile.build_path() / "profile.json"


def write_resolved_profile(profile: Profile) -> Path:
    """The profile the served models read: absolute paths, build_dir fixed."""
    path = resolved_profile_path(profile)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = profile.model_dump(mode="json")
    data["build_dir"] = str(profile.build_path())
    path.write_text(json.dumps(data, indent=2))
    return path


def engine_options(profile: Profile, role: str) -> dict[str, object]:
    """specdec.engine.Engine's keyword arguments for the target or the draft model (role)."""
    eng = profile.engine
    return {
        "device": eng.device,
        "dtype": eng.dtype,
        "kv_slots": eng.kv_slots,
        "max_seq_len": eng.max_seq_len,
        "threads": eng.threads,
        # CPU engines of one server take turns at forward passes (see engine.ForwardLock)
        "lock_file": str(profile.build_path() / "engine.lock") if eng.device == "cpu" else None,
        "guess_head": profile.speculation.ngram.guess_head if role == "target" else None,
        "guess_margin": profile.speculation.ngram.guess_margin,
        "kv_cache_reuse": eng.kv_cache_reuse,
    }


def engine_values(profile: Profile, role: str) -> dict[str, object]:
    eng = profile.engine
    return {
        "calibration_file": calibration_path(profile.build_path(), role),
        "calibration_cache": calibration_cache_dir(profile.build_path()),
        "model_name": role,
        "model_dir": profile.model_dir(role),
        "max_batch_size": eng.max_batch_size,
        "max_queue_delay_us": eng.max_queue_delay_us,
        "instances": eng.instances,
        # pbtxt string: JSON inside needs its quotes escaped
        "engine_options": json.dumps(engine_options(profile, role)).replace('"', '\\"'),
    }


def model_templates(profile: Profile) -> dict[str, tuple[Path, dict[str, object]]]:
    """Each model of the profile's repository: its template folder and placeholder values. The
    ensemble, pre/post-processing and spec_decode are the same for every backend."""
    common = {
        "profile_json": resolved_profile_path(profile),
        "tokenizer_dir": profile.model_dir("target"),
        "draft_model_name": "draft" if profile.draft is not None else "",
    }
    models = {
        name: (TEMPLATES / name, common) for name in ("ensemble", "preprocessing", "postprocessing", "spec_decode")
    }
    if profile.backend == "tensorrtllm":
        from specdec.build.trtllm import engine_models

        return models | engine_models(profile)
    models["target"] = (TEMPLATES / "pytorch_engine", engine_values(profile, "target"))
    if profile.draft is not None:
        models["draft"] = (TEMPLATES / "pytorch_engine", engine_values(profile, "draft"))
    return models


def render_configs(profile: Profile) -> dict[str, str]:
    """Every config.pbtxt of the profile's repository, without writing anything."""
    return {name: render_file(tpl / "config.pbtxt", values) for name, (tpl, values) in model_templates(profile).items()}


def render_repository(profile: Profile, dest: Path | None = None) -> Path:
    """The profile's model repository, written to dest (default: the build's, with the resolved
    profile its spec_decode model reads). Returns where it went."""
    if dest is None:
        dest = profile.repository_dir()
        write_resolved_profile(profile)
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for name, (template, values) in model_templates(profile).items():
        copy_model(template, dest / name, values)
    return dest
