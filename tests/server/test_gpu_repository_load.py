"""The rendered GPU repository's Python models load in the CPU tritonserver (the engines need the
tensorrtllm backend and a GPU, so only they stay out): preprocessing, postprocessing, and
spec_decode with its pass-through hook, for an in-engine profile pointed at a tiny checkpoint.
Started under a launcher process, as the container starts tritonserver under mpirun, the server
is watched the same way: its stubs and shared memory are found, a dead stub is seen, and stop()
ends them all whatever process group the launcher gave tritonserver."""

from __future__ import annotations

import json
import os
import urllib.request

import psutil
import pytest
from support.servers import wait_for
from support.trtllm import tiny_profile

from specdec.build.repository import render_repository
from specdec.triton.serve import Ports, TritonServer, alive, triton_process

PYTHON_MODELS = ("preprocessing", "postprocessing", "spec_decode")


class PythonModelsOnly(TritonServer):
    def launch(self, install):
        return self.command(install), self.environment(install)  # the CPU server: no mpirun, no container

    def command(self, install):
        argv = [a for a in super().command(install) if not a.startswith("--model-control-mode")]
        return [*argv, "--model-control-mode=explicit", *(f"--load-model={m}" for m in PYTHON_MODELS)]


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


@pytest.mark.server
def test_python_models_of_the_gpu_repository_load(tmp_path):
    profile = tiny_profile("lookahead", tmp_path)
    repo = render_repository(profile)
    assert (repo / "target" / "config.pbtxt").read_text().count('backend: "tensorrtllm"') == 1
    with PythonModelsOnly(profile, ports=Ports.free()) as server:
        for model in PYTHON_MODELS:
            with urllib.request.urlopen(f"http://{server.http_url}/v2/models/{model}/ready", timeout=5) as r:
                assert r.status == 200
        answer = _post(
            f"http://{server.internal.http_url}/v2/models/preprocessing/infer",  # internal: tritonserver's own
            {
                "inputs": [
                    {"name": "text_input", "datatype": "BYTES", "shape": [1, 1], "data": ["w5 w7"]},
                    {"name": "max_tokens", "datatype": "INT32", "shape": [1, 1], "data": [4]},
                    {"name": "apply_chat_template", "datatype": "BOOL", "shape": [1, 1], "data": [False]},
                ]
            },
        )
        outputs = {o["name"]: o["data"] for o in answer["outputs"]}
        assert outputs["input_ids"] == [5, 7] and outputs["end_id_out"] == [1]


class UnderALauncher(PythonModelsOnly):
    """tritonserver as a launcher's child, the way mpirun starts it in the container."""

    launcher = ("timeout", "600")

    def launch(self, install):
        argv, env = super().launch(install)
        return [*self.launcher, *argv], env


@pytest.mark.server
def test_a_server_under_a_launcher_is_watched_as_one_started_directly(tmp_path):
    profile = tiny_profile("lookahead", tmp_path)
    render_repository(profile)
    with UnderALauncher(profile, ports=Ports.free()) as server:
        assert psutil.Process(server.process.pid).name() == "timeout"
        assert sorted(model for model, _ in server.stubs) == sorted(PYTHON_MODELS)
        regions = set(server.shared_memory)
        assert regions and all(r.exists() for r in regions)  # tritonserver's, found under the launcher
        assert server.failure() is None
        stub = dict(server.stubs)["spec_decode"]
        stub.kill()
        assert wait_for(lambda: server.failure() is not None)
        assert server.failure() == "the Python backend stub of spec_decode died"
    assert not any(r.exists() for r in regions)  # stop() cleared what the server held


class InASessionOfItsOwn(UnderALauncher):
    """A launcher that gives tritonserver a session, so a process group, of its own and does not
    pass SIGTERM on to it; Open MPI's launcher moves its ranks to process groups of their own
    where it forwards job control."""

    launcher = ("setsid", "--wait")


@pytest.mark.server
def test_stop_ends_a_server_its_launcher_moved_to_another_process_group(tmp_path):
    profile = tiny_profile("lookahead", tmp_path)
    render_repository(profile)
    with InASessionOfItsOwn(profile, ports=Ports.free()) as server:
        launcher = psutil.Process(server.process.pid)
        tritonserver = psutil.Process(triton_process(launcher.pid))
        assert os.getpgid(tritonserver.pid) != os.getpgid(launcher.pid)
        started = [tritonserver, *(stub for _, stub in server.stubs)]
        assert len(started) == 1 + len(PYTHON_MODELS)
    assert not alive(launcher)
    assert not [p.pid for p in started if alive(p)]  # none left serving, or holding the ports
