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


def write_resolved_profile(profile: Profile) -> Path:
    """The profile the served models read: absolute paths, build_dir fixed."""
    path = profile.build_path() / "profile.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = profile.model_dump(mode="json")
    data["build_dir"] = str(profile.build_path())
    path.write_text(json.dumps(data, indent=2))
    return path


def engine_values(profile: Profile, role: str) -> dict[str, object]:
    eng = profile.engine
    options = {
        "device": eng.device,
        "dtype": eng.dtype,
        "kv_slots": eng.kv_slots,
        "max_seq_len": eng.max_seq_len,
        "threads": eng.threads,
    }
    return {
        "model_name": role,
        "model_dir": profile.model_dir(role),
        "max_batch_size": eng.max_batch_size,
        "max_queue_delay_us": eng.max_queue_delay_us,
        "max_queue_size": profile.server.max_queue + profile.server.max_inflight,
        "instances": eng.instances,
        # pbtxt string: JSON inside needs its quotes escaped
        "engine_options": json.dumps(options).replace('"', '\\"'),
    }


def render_repository(profile: Profile) -> Path:
    dest = profile.repository_dir()
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    profile_json = write_resolved_profile(profile)
    common = {
        "profile_json": profile_json,
        "tokenizer_dir": profile.model_dir("target"),
        "draft_model_name": "draft" if profile.draft is not None else "",
    }
    for name in ("ensemble", "preprocessing", "postprocessing", "spec_decode"):
        copy_model(TEMPLATES / name, dest / name, common)
    copy_model(TEMPLATES / "pytorch_engine", dest / "target", engine_values(profile, "target"))
    if profile.draft is not None:
        copy_model(TEMPLATES / "pytorch_engine", dest / "draft", engine_values(profile, "draft"))
    return dest
