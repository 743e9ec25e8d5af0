"""The Dockerfile is right by construction (no Docker daemon here): its base image and TensorRT-LLM
release are the pinned ones, what it copies and runs exists, it runs without root, and its
health check asks Triton's readiness. Its entrypoint runs the CPU profile end to end, without
Docker, on this machine."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from specdec.build import trtllm
from specdec.config import REPO_ROOT, load_profile

DOCKERFILE = REPO_ROOT / "Dockerfile"

APP = "/opt/specdec"  # where the Dockerfile puts the checkout


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def _all(name: str) -> list[str]:
    return [args for instr, args in instructions() if instr == name]


def _in_repo(container_path: str) -> Path:
    assert container_path.startswith(APP + "/"), container_path
    return REPO_ROOT / container_path.removeprefix(APP + "/")


def test_base_image_and_release_are_the_pinned_ones():
    args = dict(a.split("=", 1) for a in _all("ARG"))
    assert args["TRITON_IMAGE"] == trtllm.TRITON_IMAGE and _all("FROM") == ["${TRITON_IMAGE}"]
    assert args["TRTLLM_VERSION"] == trtllm.TRTLLM_VERSION
    run = " ".join(_all("RUN"))
    assert "--branch v${TRTLLM_VERSION}" in run and "sparse-checkout set examples" in run
    env = " ".join(_all("ENV"))
    assert f"{trtllm.EXAMPLES_ENV}={trtllm.DEFAULT_EXAMPLES}" in env
    assert trtllm.DEFAULT_EXAMPLES == "/opt/tensorrt_llm/examples"  # where the clone puts it


def test_copied_paths_exist_and_the_package_is_installed():
    assert _all("WORKDIR") == [APP]
    for args in _all("COPY"):
        *sources, _ = args.split()
        for source in sources:
            assert (REPO_ROOT / source).exists(), source
    assert "pip install --no-cache-dir --no-deps --no-build-isolation -e ." in " ".join(_all("RUN"))


def test_runs_as_a_user_without_root():
    users = _all("USER")
    assert users and users[-1] not in ("root", "0")
    assert "useradd" in " ".join(_all("RUN"))


def test_entrypoint_profile_and_healthcheck_exist():
    (entrypoint,) = (json.loads(a) for a in _all("ENTRYPOINT"))
    script = _in_repo(entrypoint[0])
    assert script.is_file() and os.access(script, os.X_OK)
    env = dict(re.findall(r"(\w+)=(\S+)", " ".join(_all("ENV"))))
    profile = load_profile(_in_repo(env["SPECDEC_PROFILE"]))
    assert profile.backend == "tensorrtllm" and profile.build_path().parent == Path("/engines")
    assert _all("VOLUME") == ['["/engines"]']
    (health,) = _all("HEALTHCHECK")
    command = json.loads(health.split("CMD", 1)[1])
    assert command[0] == "python3" and "/v2/health/ready" in _in_repo(command[1]).read_text()
    assert set(_all("EXPOSE")[0].split()) == {"8000", "8001", "8002", "9000"}


def test_serving_a_tensorrtllm_profile_needs_the_container():
    if Path("/opt/tritonserver/bin/tritonserver").exists():
        pytest.skip("this machine has NVIDIA's container server")
    profile = REPO_ROOT / "configs" / "llama3.1-8b-ngram.yaml"
    serve = [sys.executable, "-m", "specdec.cli", "serve", "--profile", profile, "--no-build"]  # as the entrypoint
    done = subprocess.run(serve, capture_output=True, text=True)
    assert done.returncode == 1 and trtllm.TRITON_IMAGE in done.stdout + done.stderr


def test_readme_docker_run_lines_match_the_image():
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme[readme.index("## GPU: TensorRT-LLM and Docker") :]
    runs = [re.sub(r"\\\n\s*", " ", block) for block in re.findall(r"```bash\n(docker run.*?)```", section, re.S)]
    assert len(runs) >= 2
    for run in runs:
        assert "--gpus all" in run and "--shm-size=" in run
        assert re.search(r"-v \S+:/models:ro", run) and re.search(r"-v \S+:/engines", run)
        assert all(f"-p 127.0.0.1:{port}:{port}" in run for port in (8000, 8001, 8002, 9000))
        for profile in re.findall(r"SPECDEC_PROFILE=(\S+)", run):
            assert load_profile(_in_repo(profile)).backend == "tensorrtllm"
