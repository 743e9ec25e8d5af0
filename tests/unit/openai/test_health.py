"""The OpenAI-compatible frontend's GET /health/ready, the readiness a balancer checks
(deploy/haproxy): 200 only while tritonserver is ready and the supervisor's state file says
`ready`, lately renewed; and a tritonserver that cannot be reached is a 503, which a balancer may
send to another replica. Against a stand-in for tritonserver's gRPC client."""

from __future__ import annotations

import asyncio
import json
import time

import grpc
import pytest
from aiohttp.test_utils import TestClient, TestServer
from tritonclient.utils import InferenceServerException

from specdec.openai.server import STALE_S, Frontend, application
from specdec.triton.serve import DRAINING, READY, RESTARTING


class Triton:
    """tritonclient's aio client, as far as the frontend uses it."""

    def __init__(self, ready=True, stream_error: BaseException | None = None):
        self.ready, self.stream_error, self.headers = ready, stream_error, None
        self.client = self

    async def is_server_ready(self, headers=None):
        if isinstance(self.ready, BaseException):
            raise self.ready
        return self.ready

    def inputs(self, values, dtypes):
        return []

    async def stream(self, model, inputs, outputs):
        raise self.stream_error
        yield  # an async generator

    async def close(self):
        pass


def call(frontend: Frontend, triton: Triton, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    async def main():
        app = application(frontend, 1 << 20)
        app.on_startup.clear()  # no real client: the stand-in
        frontend.client = triton
        async with TestClient(TestServer(app)) as client:
            resp = await client.request(method, path, json=body)
            return resp.status, await resp.json()

    return asyncio.run(main())


def state_file(tmp_path, state: str, age: float = 0.0):
    path = tmp_path / "serve-state.json"
    path.write_text(json.dumps({"state": state, "time": time.time() - age, "pid": 1}))
    return path


def ready(frontend: Frontend, triton: Triton | None = None) -> tuple[int, dict]:
    return call(frontend, triton or Triton(), "GET", "/health/ready")


def test_ready_when_the_supervisor_and_tritonserver_are(tmp_path):
    assert ready(Frontend("t:1", "m", 16, state_file(tmp_path, READY))) == (200, {"ready": True})


@pytest.mark.parametrize("state", [RESTARTING, DRAINING, "starting", "stopped", "failed"])
def test_not_ready_unless_the_supervisor_says_ready(tmp_path, state):
    status, body = ready(Frontend("t:1", "m", 16, state_file(tmp_path, state)))
    assert status == 503 and body["ready"] is False and state in body["why"]


def test_a_stale_state_is_a_supervisor_gone(tmp_path):
    status, body = ready(Frontend("t:1", "m", 16, state_file(tmp_path, READY, age=STALE_S + 5)))
    assert status == 503 and "old" in body["why"]


def test_no_state_file_is_not_ready(tmp_path):
    status, body = ready(Frontend("t:1", "m", 16, tmp_path / "serve-state.json"))
    assert status == 503 and "no supervisor state" in body["why"]


@pytest.mark.parametrize("answer", [False, InferenceServerException("unreachable", "StatusCode.UNAVAILABLE")])
def test_not_ready_while_tritonserver_is_not(tmp_path, answer):
    status, body = ready(Frontend("t:1", "m", 16, state_file(tmp_path, READY)), Triton(ready=answer))
    assert status == 503 and "tritonserver" in body["why"]


def test_without_a_supervisor_tritonserver_alone_decides():
    assert ready(Frontend("t:1", "m", 16))[0] == 200
    assert ready(Frontend("t:1", "m", 16), Triton(ready=False))[0] == 503


@pytest.mark.parametrize(
    "error",
    [
        InferenceServerException("failed to connect to all addresses", "StatusCode.UNAVAILABLE"),
        grpc.aio.AioRpcError(grpc.StatusCode.UNKNOWN, details="Stream removed"),
    ],
)
def test_an_unreachable_tritonserver_is_a_503_a_balancer_may_retry(error):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    status, answer = call(Frontend("t:1", "m", 16), Triton(stream_error=error), "POST", "/v1/chat/completions", body)
    assert status == 503
    assert answer["error"]["code"] == "unavailable" and "model server is unavailable" in answer["error"]["message"]
