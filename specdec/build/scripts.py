"""The build scripts checked in under build_scripts/: one per GPU profile, the commands its build
runs (specdec/build/trtllm.py's plan, as `specdec build --dry-run` prints them) for an ops
engineer to read, diff and run by hand in NVIDIA's container. tests/unit/build/test_scripts.py
fails when a script differs from what its profile now generates.

    ./run build --profile configs/<name>.yaml --script > build_scripts/<name>.sh
"""

from __future__ import annotations

import shlex
from pathlib import Path

from specdec.build.trtllm import DEFAULT_EXAMPLES, TRITON_IMAGE, TRTLLM_VERSION, plan, weight_sources
from specdec.config import REPO_ROOT, Profile

SCRIPTS_DIR = REPO_ROOT / "build_scripts"


def script_path(profile_file: Path) -> Path:
    return SCRIPTS_DIR / f"{profile_file.stem}.sh"


def build_script(profile: Profile, profile_file: Path) -> str:
    """The profile's build as a bash script: where the weights come from, each conversion and
    engine build, then the model repository rendered (by specdec, which the image carries)."""
    relative = profile_file.resolve().relative_to(REPO_ROOT)
    lines = [
        "#!/usr/bin/env bash",
        f"# The build of {relative}: TensorRT-LLM {TRTLLM_VERSION}, in {TRITON_IMAGE}.",
        f"# Generated: ./run build --profile {relative} --script > build_scripts/{relative.stem}.sh",
        "# (tests/unit/build/test_scripts.py fails when it differs from what the profile generates).",
        "# `specdec build` runs the same commands, resumably, with a log per step.",
        "set -euo pipefail",
        "",
        "# weights (Hugging Face checkpoints):",
    ]
    sources = weight_sources(profile) if profile.trtllm else {"target": profile.target, "draft": profile.draft}
    for key, source in sources.items():
        if source is not None:
            fetch = f"hf download {source.hf_repo} --local-dir {source.hf_dir}" if source.hf_repo else "bring your own"
            lines.append(f"#   {key}: {source.hf_dir}  ({fetch})")
    steps = plan(profile) if profile.trtllm else []
    if profile.trtllm is None:
        lines.append("# the PyTorch engine loads them in place: nothing to convert or build")
    elif not steps:
        lines.append(f"# {profile.trtllm.mode}: no engine build, the LLM API loads them when the server starts")
    else:
        lines.append(f"# the converters are TensorRT-LLM's examples/ (in the image: {DEFAULT_EXAMPLES})")
    for i, step in enumerate(steps, 1):
        lines += ["", f"# [{i}/{len(steps)}] {step.name}", shlex.join(step.argv)]
    lines += [
        "",
        "# the model repository that tritonserver serves",
        f"specdec build --profile {relative} --render-only",
        "",
    ]
    return "\n".join(lines)
