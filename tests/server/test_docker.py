"""The Dockerfile is right by construction (no Docker daemon here): its base image and TensorRT-LLM
release are the pinned ones, what it copies and runs exists, it runs without root, and its
health check asks Triton's readiness. Its entrypoint runs the CPU profile end to end, without
Docker, on this machine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest

from specdec.config import REPO_ROOT
from specdec.triton.serve import Ports


def _healthy(port: int) -> bool:
    env = {**os.environ, "SPECDEC_HTTP_PORT": str(port)}
    return subprocess.run([sys.executable, REPO_ROOT / "docker" / "healthcheck.py"], env=env).returncode == 0


@pytest.mark.server
def test_entrypoint_runs_the_cpu_profile_end_to_end(embedded_profile, tmp_path):
    ports = Ports.free()
    env = {
        **os.environ,
        "SPECDEC_PYTHON": sys.executable,
        "SPECDEC_HOST": "127.0.0.1",
        "SPECDEC_HTTP_PORT": str(ports.http),
        "SPECDEC_GRPC_PORT": str(ports.grpc),
        "SPECDEC_METRICS_PORT": str(ports.metrics),
        "SPECDEC_OPENAI_PORT": str(ports.openai),
    }
    env.pop("SPECDEC_PROFILE", None)  # the default: the embedded CPU profile
    log = open(tmp_path / "entrypoint.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [REPO_ROOT / "docker" / "entrypoint.sh"], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    started: list[psutil.Process] = []
    try:
        assert not _healthy(ports.http)
        deadline = time.monotonic() + 300
        while not _healthy(ports.http):
            started = started or psutil.Process(proc.pid).children(recursive=True)
            assert proc.poll() is None, (tmp_path / "entrypoint.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "not ready in 300 s"
            time.sleep(1)
        started = psutil.Process(proc.pid).children(recursive=True)
        body = json.dumps({"text_input": "Name three colors.", "max_tokens": 8}).encode()
        url = f"http://127.0.0.1:{ports.http}/v2/models/ensemble/generate"
        with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=120) as response:
            answer = json.loads(response.read())
        assert answer["text_output"].strip() and answer["num_output_tokens"] == 8
        with urllib.request.urlopen(f"http://127.0.0.1:{ports.openai}/v1/models", timeout=30) as response:
            assert response.status == 200  # the OpenAI-compatible API beside it
        assert "built model repository" in (tmp_path / "entrypoint.log").read_text()  # its build step ran
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        finally:
            for child in started:  # the server this test started, should the stop have failed
                if child.is_running():
                    child.kill()
            log.close()
    assert proc.returncode == 0
